"""A one-node Slurm on this machine, for the tests and for trying `CLUSTER=slurm-local`.

`python -m suite.tools.slurm_local` (or `make slurm-local`) installs Debian's slurm-wlm and munge when
they are missing (needs root or passwordless sudo), writes /etc/slurm/slurm.conf for one node on
loopback, starts munged, slurmctld and slurmd, and waits until the node takes jobs. It is idempotent:
whatever already runs is left alone. The Slurm tests call `ensure_running` the same way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")
MARK = "# one-node Slurm written by the suite (suite/tools/slurm_local.py)"
STATE = Path("/var/spool/slurm-local")
PACKAGES = ("slurm-wlm", "munge")
APT_LOCK_WAIT_S = 600
MUNGE_START_WAIT_S = 30
COMMANDS = ("sbatch", "squeue", "scancel", "slurmctld", "slurmd", "munged")
SEARCH_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"  # the daemons live in sbin, off a user's PATH


class SlurmUnavailable(RuntimeError):
    """Slurm could not be installed or started here; the message says what to do."""


def _which(command: str) -> str | None:
    return shutil.which(command, path=SEARCH_PATH)


def _as_root(cmd: list[str]) -> list[str]:
    return cmd if os.geteuid() == 0 else ["sudo", "-n", *cmd]


def _run(cmd: list[str], what: str, stdin: str | None = None, timeout_s: int = 600) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, input=stdin)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmUnavailable(f"{what}: {e}") from e
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SlurmUnavailable(f"{what} failed ({' '.join(cmd)}): {' / '.join(tail)}")
    return done.stdout


def _install() -> None:
    if os.geteuid() != 0 and not shutil.which("sudo"):
        raise SlurmUnavailable("installing slurm-wlm and munge needs root or passwordless sudo: "
                               "run `make slurm-local` as root")
    # A machine that has just booted may be running its own apt (daily upgrades): wait for its lock.
    apt = ["env", "DEBIAN_FRONTEND=noninteractive",  # through sudo too, which resets the environment
           "apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}"]
    install = _as_root([*apt, "install", "-y", *PACKAGES])
    timeout_s = APT_LOCK_WAIT_S + 600
    try:
        _run(install, "installing slurm-wlm and munge", timeout_s=timeout_s)
    except SlurmUnavailable:  # a fresh machine may have no package lists yet
        _run(_as_root([*apt, "update"]), "apt-get update", timeout_s=timeout_s)
        _run(install, "installing slurm-wlm and munge", timeout_s=timeout_s)


def slurm_conf(host: str, cpus: int, memory_mb: int) -> str:
    return f"""{MARK}
ClusterName=suite-local
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={STATE}/ctld
SlurmdSpoolDir={STATE}/d
SlurmctldPidFile={STATE}/slurmctld.pid
SlurmdPidFile={STATE}/slurmd.pid
SlurmctldLogFile={STATE}/slurmctld.log
SlurmdLogFile={STATE}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# No accounting database: finished jobs stay visible to squeue for a day instead of sacct.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=86400
KillWait=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _write_conf() -> bool:
    """Write slurm.conf for this machine; whether it changed."""
    cpus = os.cpu_count() or 1
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 * 9 // 10
    text = slurm_conf(socket.gethostname().split(".")[0], cpus, memory_mb)
    if CONF.exists():
        current = CONF.read_text()
        if current == text:
            return False
        if not current.startswith(MARK):
            raise SlurmUnavailable(f"{CONF} exists and was not written by the suite: this machine already has a "
                                   "Slurm configuration; use CLUSTER=slurm on it instead")
    _run(_as_root(["mkdir", "-p", str(CONF.parent), f"{STATE}/ctld", f"{STATE}/d"]), "creating Slurm's directories")
    _run(_as_root(["tee", str(CONF)]), f"writing {CONF}", stdin=text)
    return True


def _munge_ok() -> bool:
    munge = subprocess.run(["munge", "-n"], capture_output=True)
    return munge.returncode == 0 and subprocess.run(["unmunge"], input=munge.stdout,
                                                      capture_output=True).returncode == 0


def _wait_for_munge(timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _munge_ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _start_munge() -> None:
    if _munge_ok():
        return
    _run(_as_root(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"]), "creating /run/munge")
    try:
        _run(_as_root(["runuser", "-u", "munge", "--", _which("munged")]), "starting munged")
    except SlurmUnavailable:
        # Installing munge starts its own munged, which holds the socket's lock a while before it answers.
        if _wait_for_munge(MUNGE_START_WAIT_S):
            return
        raise
    if not _wait_for_munge(MUNGE_START_WAIT_S):
        raise SlurmUnavailable("munged started but `munge -n | unmunge` fails")


def _responds(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True).returncode == 0


def _controller_up() -> bool:
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    return ping.returncode == 0 and "is UP" in ping.stdout


def _node_state() -> str:
    done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True)
    return done.stdout.strip().rstrip("*~#!%$@^-")


def _wait_for_node(timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        state = _node_state()
        if state in ("idle", "mixed", "allocated", "completing"):
            return
        if state in ("down", "drained", "draining"):
            host = socket.gethostname().split(".")[0]
            subprocess.run(_as_root(["scontrol", "update", f"nodename={host}", "state=resume"]), capture_output=True)
        time.sleep(1)
    raise SlurmUnavailable(f"the Slurm node did not become idle within {timeout_s:g} s (state {state or 'unknown'}; "
                           f"see {STATE}/slurmctld.log and {STATE}/slurmd.log)")


def ensure_running() -> None:
    """Raise SlurmUnavailable, with what to do, unless a one-node Slurm takes jobs when this returns."""
    if not all(_which(c) for c in COMMANDS):
        _install()
    changed = _write_conf()
    _start_munge()
    if not _controller_up():
        _run(_as_root([_which("slurmctld")]), "starting slurmctld")
    elif changed:
        _run(_as_root(["scontrol", "reconfigure"]), "scontrol reconfigure")
    if not _responds(["scontrol", "show", "slurmd"]):
        _run(_as_root([_which("slurmd")]), "starting slurmd")
    _wait_for_node()


def main() -> int:
    try:
        ensure_running()
    except SlurmUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(subprocess.run(["sinfo"], capture_output=True, text=True).stdout, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
