"""This machine's GPUs and NVIDIA driver, asked about without opening a CUDA context.

The sweep's driver lives as long as the sweep. A context it opened (torch opens one on the first question about a
device: its name, compute capability or memory) would hold memory on GPU 0 to the end, leaving rank 0 less than the
other ranks. So the driver asks a short-lived child process, which sees the GPUs as the ranks do (CUDA_VISIBLE_DEVICES,
the CUDA device order, MIG), and keeps the answer. Counting GPUs (`torch.cuda.is_available`, `device_count`) opens no
context. A rank that finds no GPU asks NVML about the driver, for its error line.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass

import torch

from suite.errors import ConfigError

# What the child prints: the properties of cuda:0, as JSON on its last line.
ASK = ("import json, torch\n"
       "p = torch.cuda.get_device_properties(0)\n"
       "print(json.dumps({'name': p.name, 'capability': [p.major, p.minor], 'memory_bytes': p.total_memory}))")
ASK_TIMEOUT_S = 300  # a child importing torch from a slow shared file system


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]
    memory_bytes: int


@functools.cache
def first_gpu() -> Gpu | None:
    """`cuda:0` as a rank started here sees it; None where this machine has no GPU."""
    if not torch.cuda.is_available():
        return None
    try:
        asked = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True, timeout=ASK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise ConfigError(f"a process asking this machine's first GPU for its properties did not answer in "
                          f"{ASK_TIMEOUT_S} s") from e
    if asked.returncode:
        said = asked.stderr.strip().splitlines()
        raise ConfigError("a process asking this machine's first GPU for its properties failed: "
                          + (said[-1] if said else f"exit code {asked.returncode}"))
    answer = json.loads(asked.stdout.strip().splitlines()[-1])
    return Gpu(answer["name"], tuple(answer["capability"]), answer["memory_bytes"])


def nvidia_driver() -> str:
    """The NVIDIA driver in words: its version, as NVML gives it, or why NVML does not answer."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # pynvml not installed, or NVML's own error: no driver loaded, no library, no GPU
        return f"no NVIDIA driver answers ({type(e).__name__}: {e})"
    try:
        return f"NVIDIA driver {pynvml.nvmlSystemGetDriverVersion()}"
    finally:
        pynvml.nvmlShutdown()
