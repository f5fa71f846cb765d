"""Ranks (and profiling children) forked from one interpreter that imported torch and the suite's rank code once
per sweep.

A rank started as `python -m suite.worker` spends seconds starting Python and importing torch,
torchvision and the suite before it does anything: most of what a small point costs. The local
launcher instead starts this server once, on the first point that needs it (in a process group of its
own, so Ctrl-C at the terminal does not reach it), and asks it for each rank over a socket: the server
forks a child that takes the rank's environment, process group and output pipe and runs `suite.worker`
in them, and reports the child's exit code (negative: the signal that killed it) when it ends.

The server only imports: it starts no thread (numpy's OpenBLAS pool stops itself at a fork) and touches
no device, so a forked rank starts as clean as a fresh interpreter. What a fresh one reads from its
environment at start-up, the server read from the first point's; of that only the number of OpenMP
threads differs between points, and the child sets it from its own environment. The server ends,
stopping the ranks it still runs, when the driver closes its end of the socket or exits. The profiles of the
performance model (suite.profiling.measure) are taken in children forked the same way, as a rank would train.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import pkgutil
import runpy
import select
import signal
import socket
import subprocess
import sys
import traceback
from typing import IO, NoReturn

from suite.launch_timing import mark

MESSAGE_BYTES = 1 << 20  # a request carries a rank's whole environment
# What every rank imports before it trains, besides the strategy modules (all imported too).
PRELOAD = ("torch", "torch.distributed", "torch.utils.flop_counter", "torchvision", "omegaconf", "suite.worker.rank",
           "suite.worker.trainer", "suite.runtime.dist", "suite.runtime.manifest", "suite.strategies",
           "suite.worker.calibration_rank", "suite.profiling.measure")


class ForkServer:
    """The driver's side: start ranks, learn their exit codes."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Not `-m launchers.fork_server`: the launchers package imports this module, which would then run twice.
        self.process = subprocess.Popen([sys.executable, "-c", f"from launchers.fork_server import main; "
                                         f"main({theirs.fileno()})"], pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL, env=env, process_group=0)
        theirs.close()
        self._socket = ours
        self._requests = 0
        self._exit_codes: dict[int, int] = {}

    def alive(self) -> bool:
        return self.process.poll() is None

    def start(self, argv: list[str], env: dict[str, str], process_group: int = 0) -> ForkedChild:
        """Fork a child running `python -m argv[0] argv[1:]` (a rank: `suite.worker POINT_DIR`) in `env` and
        `process_group` (0: a new one that it leads), its output (stdout and stderr) readable from the returned
        child's `stdout`."""
        read, write = os.pipe()
        try:
            self._requests += 1
            request = {"request": self._requests, "argv": argv, "env": env, "group": process_group}
            socket.send_fds(self._socket, [json.dumps(request).encode()], [write])
            pid = self._started(self._requests)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        return ForkedChild(self, pid, open(read, errors="replace"))

    def _started(self, request: int) -> int:
        """The pid of the rank asked for by `request` (the first waits for the server to finish importing)."""
        while True:
            message = self._receive(block=True)
            if message.get("request") != request:  # an exit, or the answer to a request given up (Ctrl-C)
                continue
            if "error" in message:
                raise RuntimeError(message["error"])
            return message["started"]

    def exit_code(self, pid: int, block: bool = False) -> int | None:
        """`pid`'s exit code, or None while it runs (`block`: once it has ended)."""
        while pid not in self._exit_codes and self._receive(block=block):
            pass
        return self._exit_codes.get(pid)

    def _receive(self, block: bool) -> dict | None:
        """The next message (exit reports are kept as they come), or None when none is waiting."""
        self._socket.setblocking(block)
        try:
            data = self._socket.recv(MESSAGE_BYTES)
        except BlockingIOError:
            return None
        if not data:
            raise RuntimeError(f"the fork server exited (code {self.process.wait()})")
        message = json.loads(data)
        if "exited" in message:
            self._exit_codes[message["exited"]] = message["code"]
        return message

    def close(self) -> None:
        self._socket.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


class ForkedChild:
    """A forked rank or profiling child as its parent sees it, like a `subprocess.Popen`: pid, stdout, poll(),
    wait(), returncode."""

    def __init__(self, server: ForkServer, pid: int, stdout: IO[str]) -> None:
        self._server, self.pid, self.stdout = server, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, block=True)
        return self.returncode


_running: ForkServer | None = None


def fork_server(env: dict[str, str]) -> ForkServer:
    """This process's fork server, started in `env` on first use (or when the last one died)."""
    global _running
    if _running is None or not _running.alive():
        _running = ForkServer(env)
        atexit.register(_running.close)
    return _running


# The server's side.

def _preload() -> None:
    """Import what the ranks will; a module that fails to import here fails again in the rank, which reports it
    as its point's error."""
    for name in PRELOAD:
        _try_import(name)
    if "suite.strategies" in sys.modules:
        for module in pkgutil.iter_modules(sys.modules["suite.strategies"].__path__, "suite.strategies."):
            _try_import(module.name)


def _try_import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception:
        pass


def _run_child(request: dict, output: int, inherited: dict, close: list[int]) -> NoReturn:
    """In the forked child: become the rank (or the module's run) that `request` describes, with the signal
    handlers a fresh interpreter has (`inherited`), run it and exit with its code."""
    try:
        signal.set_wakeup_fd(-1)
        for sig, handler in inherited.items():
            signal.signal(sig, handler)
        for fd in close:
            os.close(fd)
        try:
            os.setpgid(0, request["group"])  # the server does it too: whichever comes first
        except OSError:
            pass
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.environ.clear()
        os.environ.update(request["env"])
        module, *args = request["argv"]
        sys.argv = [module, *args]  # as `python -m module args` has it (runpy sets argv[0] to the module's file)
        if "OMP_NUM_THREADS" in os.environ:  # a fresh interpreter's OpenMP reads it when torch loads
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if module == "suite.worker":
            from suite.worker.rank import run_rank

            run_rank(*args)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError):  # closed by the module (json.tool closes its output)
            stream.flush()
    os._exit(code)


def serve(control: socket.socket) -> None:
    """Fork a rank for each request until the driver's end of `control` closes."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    # SIGCHLD wakes select() through wake_read. SIGINT and SIGTERM are the driver's, which then stops the ranks
    # and waits for their exit codes: sent to every process (a scheduler's time limit), they must not end
    # the server first.
    own = {signal.SIGCHLD: lambda signum, frame: None, signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
    inherited = {sig: signal.signal(sig, handler) for sig, handler in own.items()}
    groups: dict[int, int] = {}  # process group of each running child
    while True:
        ready, _, _ = select.select([control, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
            while groups:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                groups.pop(pid, None)
                control.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if control in ready:
            data, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 1)
            if not data:
                break
            request = json.loads(data)
            try:
                pid = os.fork()
            except OSError as e:  # e.g. out of memory: this point fails, the next may not
                os.close(fds[0])
                control.send(json.dumps({"request": request["request"], "error": f"cannot fork a rank: {e}"}).encode())
                continue
            if pid == 0:
                _run_child(request, fds[0], inherited, [control.fileno(), wake_read, wake_write])
            os.close(fds[0])
            groups[pid] = request["group"] or pid
            try:
                os.setpgid(pid, groups[pid])
            except OSError:  # the child got there first, or already ended
                pass
            control.send(json.dumps({"request": request["request"], "started": pid}).encode())
    for group in set(groups.values()):
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass


def main(control_fd: int) -> NoReturn:
    _preload()
    mark("fork_server_ready")
    serve(socket.socket(fileno=control_fd))
    os._exit(0)  # without the interpreter's teardown (a second of torch's finalizers), which the driver waits for
