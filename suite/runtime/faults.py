"""Deliberate failures inside a worker, to exercise how the suite records broken points."""

from __future__ import annotations

import os
import signal
import time

import torch

from suite.shared_names import FaultKind


def inject_fault(kind: str, step: int) -> None:
    if kind == FaultKind.error:
        raise RuntimeError(f"injected fault at step {step}")
    if kind == FaultKind.oom:
        torch.empty(1 << 50, dtype=torch.uint8)  # a real allocator failure (1 PiB), not a simulated one
    if kind == FaultKind.hang:
        while True:
            time.sleep(60)
    if kind == FaultKind.exit:
        os._exit(3)  # dies without a Python traceback, like a crash in native code
    if kind == FaultKind.kill:
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does
