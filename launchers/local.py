"""Start one point on this machine: `torchrun --standalone` with one process per worker (horovodrun for `horovod`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from launchers.horovod import horovodrun_command, horovodrun_env
from suite.signals import Stopped


@dataclass(frozen=True)
class LaunchResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    stopped_by: str | None = None  # SIGINT (Ctrl-C) or SIGTERM: the driver was stopped and stopped the point


def torchrun_command(point_dir: Path, workers: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        f"--nproc-per-node={workers}", "--max-restarts=0", "--monitor-interval=0.5",
        "-m", "suite.worker", str(point_dir),
    ]


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the whole process group (torchrun and its workers), SIGKILL what is left after the grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_streamed(cmd: list[str], log_path: Path, timeout_s: float, env: dict[str, str]) -> LaunchResult:
    """Run `cmd` in its own process group, copying its output to the console and to `log_path`."""
    start = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True, bufsize=1)

        def pump() -> None:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out, stopped_by = False, None
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
        except (KeyboardInterrupt, Stopped) as e:  # the ranks run in their own session: stop them, then report
            stopped_by = "SIGTERM" if isinstance(e, Stopped) else "SIGINT"
            _stop(proc)
        reader.join(5)
    return LaunchResult(proc.returncode, timed_out, time.monotonic() - start, stopped_by)


def launch_local(point_dir: Path, workers: int, timeout_s: float, env: dict[str, str],
                 rank_launcher: str | None = None) -> LaunchResult:
    if rank_launcher == "horovodrun":
        return run_streamed(horovodrun_command(point_dir, workers), point_dir / "launcher.log", timeout_s,
                            horovodrun_env(env))
    return run_streamed(torchrun_command(point_dir, workers), point_dir / "launcher.log", timeout_s, env)
