"""Start one point on this machine: one process per rank, in torchrun's environment, and wait for it.

The ranks get what torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) without torchrun's agent, which costs seconds per point, and meet at a store the
launcher serves as torchrun's agent does (`rendezvous_store`); they are forked
from the sweep's fork server (`launchers.fork_server`), which imported torch and the suite once, instead
of each starting Python and importing them again. As with torchrun, the first rank to fail ends the
point: the others are stopped, and each rank's exit code is kept. A strategy whose ranks horovodrun or
mpiexec must start (`Strategy.rank_launcher`) gets one such process instead, which reports its ranks' exits in
its output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

from launchers.fork_server import ForkedChild, fork_server
from launchers.horovod import horovodrun_command
from launchers.mpiexec import mpiexec_command
from suite.errors import Stopped


@dataclass(frozen=True)
class LaunchResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    stopped_by: str | None = None  # SIGINT (Ctrl-C) or SIGTERM: the driver was stopped and stopped the point
    # Exit code of each rank that did not exit 0 (negative: killed by that signal); local launches only.
    failed_ranks: dict[int, int] = field(default_factory=dict)
    # The ranks the launcher itself stopped (another had failed, or the time was up): a SIGKILL it sent to a rank
    # stuck in a collective is not the cause.
    stopped_ranks: frozenset[int] = frozenset()


def rendezvous_store(workers: int):
    """The store a point's ranks meet at, served from the launcher on a port the OS assigns as it binds: no other
    process can take the port between its choice and its use, as one could a free port chosen, released and bound
    again by rank 0 (EADDRINUSE, now and then, with sweeps or tests side by side). The ranks join it as clients, as
    torchrun's ranks join its agent's store (torch.distributed.rendezvous: TORCHELASTIC_USE_AGENT_STORE)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, workers, is_master=True, wait_for_workers=False)
    return store, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
                   "TORCHELASTIC_RESTART_COUNT": "0"}  # torch before 2.6 prefixes the store's keys with the count


def rank_env(rank: int, workers: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(workers), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(workers)}


@dataclass(frozen=True)
class Process:
    prefix: str  # before each line of its output
    start: Callable[..., subprocess.Popen | ForkedChild]  # given process_group (0: a new one that it leads)


class Ranks:
    """The processes of one point, in one process group of their own (Ctrl-C at the terminal reaches the
    driver only, which then stops them), their output copied to the console and to the launcher log."""

    def __init__(self, log: IO[str]):
        self._lock, self._log = threading.Lock(), log
        self.procs: list[subprocess.Popen | ForkedChild] = []
        self._pumps: list[threading.Thread] = []
        self.stopped: set[int] = set()

    def start(self, processes: list[Process]) -> None:
        for process in processes:
            proc = process.start(process_group=self.procs[0].pid if self.procs else 0)
            self.procs.append(proc)
            self._pumps.append(threading.Thread(target=self._pump, args=(process.prefix, proc.stdout), daemon=True))
            self._pumps[-1].start()

    def _pump(self, prefix: str, stream: IO[str]) -> None:
        for line in stream:
            line = prefix + line
            with self._lock:
                sys.stdout.write(line)
                sys.stdout.flush()
                self._log.write(line)

    def exit_codes(self) -> dict[int, int]:
        return {rank: p.returncode for rank, p in enumerate(self.procs) if p.poll() is not None}

    def wait(self, timeout_s: float) -> bool:
        """Until every rank exited 0, one failed (the others are then stopped) or the time is up (False)."""
        deadline = time.monotonic() + timeout_s
        while True:
            codes = self.exit_codes()
            if len(codes) == len(self.procs):
                return True
            if any(codes.values()):
                self.stop()
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every rank, SIGKILL those still running after the grace."""
        if not self.procs:
            return
        self.stopped |= {rank for rank, p in enumerate(self.procs) if p.poll() is None}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.procs[0].pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + grace_s
            while len(self.exit_codes()) < len(self.procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            if len(self.exit_codes()) == len(self.procs):
                return

    def close(self) -> None:
        for pump in self._pumps:
            pump.join(5)


def launch_local(point_dir: Path, workers: int, timeout_s: float, env: dict[str, str],
                 rank_launcher: str | None = None) -> LaunchResult:
    """Run `suite.worker <point_dir>` as `workers` ranks until they end or `timeout_s` passes."""
    start = time.monotonic()
    store, address = rendezvous_store(workers)  # served until the ranks are done
    if rank_launcher:
        command = {"horovodrun": horovodrun_command, "mpiexec": mpiexec_command}[rank_launcher]
        processes = [Process("", partial(subprocess.Popen, command(point_dir, workers), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, env={**env, **address}))]
    else:
        server = fork_server(env)
        processes = [Process(f"[rank{rank}]: ", partial(server.start, ["suite.worker", str(point_dir)],
                                                        {**env, **address, **rank_env(rank, workers)}))
                     for rank in range(workers)]
    with (point_dir / "launcher.log").open("w") as log:
        ranks = Ranks(log)
        timed_out, stopped_by = False, None
        try:
            ranks.start(processes)  # the first point's wait for the fork server to import can be stopped too
            if not ranks.wait(timeout_s):
                timed_out = True
                ranks.stop()
        except (KeyboardInterrupt, Stopped) as e:
            stopped_by = "SIGTERM" if isinstance(e, Stopped) else "SIGINT"
            ranks.stop()
        finally:
            ranks.close()
        failed = {rank: code for rank, code in ranks.exit_codes().items() if code != 0}
        for rank, code in sorted(failed.items()):
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            log.write(f"launcher: {rank_launcher or f'rank {rank}'} {how}\n")
    returncode = next(iter(failed.values()), 0) if not timed_out else None
    # horovodrun's or mpiexec's own exit code is not a rank's: the verdict reads its ranks' exits from its output.
    return LaunchResult(returncode, timed_out, time.monotonic() - start, stopped_by,
                        {} if rank_launcher else failed, frozenset(ranks.stopped))
