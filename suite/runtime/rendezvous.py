"""Where a rank sits in its job, read from whatever started it: the local launcher, torchrun, horovodrun,
srun, jsrun, mpiexec (Cray's PALS, MPICH's Hydra) or mpirun.

Each launcher describes a rank in its own variables. Rank 0's host and port come from MASTER_ADDR and
MASTER_PORT, which a batch job script exports before each of its steps (every launcher hands them on, Open
MPI's with `-x`); without them, from the scheduler's allocation (Slurm's node list, LSF's host list, PBS's
node file: its first host runs rank 0) and a port derived from the job id, which every rank computes alike. The
allocation's hosts and job id are read here too (horovodrun needs the host list, and a run records its job id).

    python -m suite.runtime.rendezvous <step>   # in a job script: `host port` of the job's step <step>
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# (source, rank, world size, local rank, local world size), in order of precedence: the launcher that
# started this very process first; Slurm's variables last, as an allocation also exports them to
# processes that mpirun or torchrun started inside it. None: the launcher does not export that number.
# A row counts only where both its rank and its local rank are set: srun under MpiDefault=pmi2 sets
# PMI_RANK and PMI_SIZE but no PMI_LOCAL_RANK, and its ranks are then placed by SLURM_LOCALID.
# horovodrun comes first: it passes its whole environment on to every rank, a job script's
# SLURM_PROCID=0 or OMPI_* included, even to ranks on other hosts. jsrun sets JSM_NAMESPACE_* whatever
# MPI it starts (with `--smpiargs=off`, no OMPI_*).
LAUNCHERS = (
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("jsrun", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpiexec/PMI", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),
    ("mpiexec/Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("mpiexec/PALS", "PALS_RANKID", None, "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)
# Below Linux's default ephemeral range (net.ipv4.ip_local_port_range 32768-60999): a port in it can be taken by an
# outgoing connection, or by a rank's own connect to the port before rank 0 listens (TCP's self-connect), which hangs.
PORT_BASE, PORT_RANGE = 20000, 12768


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # which launcher's variables these came from

    def describe(self) -> str:
        return (f"rank {self.rank} of {self.world_size} (local {self.local_rank} of {self.local_world_size}) "
                f"from {self.source}; rendezvous at {self.master_addr}:{self.master_port}")


def _slurm_local_size(env: Mapping[str, str]) -> int:
    """This node's task count from SLURM_TASKS_PER_NODE, e.g. `4(x2),3` for node ids 0-1 (4) and 2 (3)."""
    node = int(env.get("SLURM_NODEID", 0))
    counts = []
    for part in env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "1")).split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * int(repeat.rstrip(")") or 1)
    return counts[min(node, len(counts) - 1)]


def step_port(job_id: str, step: int) -> int:
    """The port of a job's step: consecutive steps of one job take consecutive ports, none reused."""
    return PORT_BASE + (zlib.crc32(job_id.encode()) + step) % PORT_RANGE


def allocation_master(env: Mapping[str, str], step: int = 0) -> tuple[str, int]:
    """Rank 0's host (the allocation's first) and port for the job's step `step`."""
    job = scheduler_job_id(env)
    return next(iter(allocation_hosts(env)), "127.0.0.1"), step_port(job, step) if job else 29500 + step


def master_addr(env: Mapping[str, str]) -> str:
    return env["MASTER_ADDR"] if "MASTER_ADDR" in env else allocation_master(env)[0]


def master_port(env: Mapping[str, str]) -> int:
    return int(env["MASTER_PORT"]) if "MASTER_PORT" in env else allocation_master(env)[1]


def discover(env: Mapping[str, str], expected_world_size: int = 1) -> Rendezvous:
    """This rank's place in the job; a process started by hand is rank 0 of 1.

    `expected_world_size` (the point's rank count) stands in where the launcher exports none (PALS).
    """
    for source, rank, size, local_rank, local_size in LAUNCHERS:
        if rank not in env or local_rank not in env:
            continue
        world_size = int(env[size]) if size and size in env else expected_world_size
        if local_size is None:
            local_world_size = _slurm_local_size(env)
        else:
            local_world_size = int(env.get(local_size, world_size))
        return Rendezvous(int(env[rank]), world_size, int(env[local_rank]), local_world_size,
                          master_addr(env), master_port(env), source)
    return Rendezvous(0, 1, 0, 1, "127.0.0.1", master_port(env), "a single process")


JOB_ID_VARIABLES = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "COBALT_JOBID")


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"cannot read the Slurm node list {text!r}: nested or unbalanced brackets")
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"cannot read the Slurm node list {text!r}: unbalanced brackets")
    return [*parts, text[start:]]


def _range(text: str, nodelist: str) -> list[str]:
    """`07-09` -> 07 08 09 (zero padded to the width of the first), `12` -> 12."""
    low, _, high = text.partition("-")
    if not low.isdigit() or not (high or low).isdigit() or int(high or low) < int(low):
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}: bad range [{text}]")
    return [str(n).zfill(len(low)) for n in range(int(low), int(high or low) + 1)]


def slurm_hosts(nodelist: str) -> list[str]:
    """The hosts of a Slurm host list, in Slurm's order: `gpu[07-09,12],login1`, or `rack[1-2]-node[01-02]`
    (every combination of the bracket groups, the first varying slowest: rack1-node01, rack1-node02, ...)."""
    hosts = []
    for expression in _split_outside_brackets(nodelist.strip()):
        pieces = re.split(r"\[([^\]]*)\]", expression)  # literal, group, literal, group, ..., literal
        choices = [[piece] if i % 2 == 0 else [n for part in piece.split(",") for n in _range(part, nodelist)]
                   for i, piece in enumerate(pieces)]
        hosts += ["".join(combination) for combination in itertools.product(*choices)]
    if not all(hosts):
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    return hosts


def slurm_allocation_hosts(nodelist: str) -> list[str]:
    """Slurm's own reading (`scontrol show hostnames`) where scontrol is here (inside a job), else ours."""
    if shutil.which("scontrol"):
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.split():
            return done.stdout.split()
    return slurm_hosts(nodelist)


def lsf_hosts(mcpu_hosts: str) -> list[str]:
    """The compute hosts of LSF's `host slots host slots ...` list.

    On Lassen-style (CSM) allocations the list starts with the launch node, holding one slot, where
    the job script runs but no rank does; it is skipped when compute hosts follow.
    """
    fields = mcpu_hosts.split()
    hosts = list(zip(fields[::2], map(int, fields[1::2])))
    if len(hosts) > 1 and hosts[0][1] == 1 and any(slots > 1 for _, slots in hosts[1:]):
        hosts = hosts[1:]
    return [host for host, _ in hosts]


def allocation_hosts(env: Mapping[str, str]) -> list[str]:
    """The hosts of the scheduler's allocation this process runs in, rank 0's first; [] outside one."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodelist:
        return slurm_allocation_hosts(nodelist)
    if env.get("LSB_MCPU_HOSTS"):
        return lsf_hosts(env["LSB_MCPU_HOSTS"])
    if env.get("LSB_HOSTS"):  # one entry per slot: `launch host host host ...`
        hosts = env["LSB_HOSTS"].split()
        return lsf_hosts(" ".join(f"{h} {hosts.count(h)}" for h in dict.fromkeys(hosts)))
    if env.get("PBS_NODEFILE"):  # one line per slot
        return list(dict.fromkeys(Path(env["PBS_NODEFILE"]).read_text().split()))
    return []


def scheduler_job_id(env: Mapping[str, str]) -> str | None:
    return next((env[v] for v in JOB_ID_VARIABLES if v in env), None)


if __name__ == "__main__":
    print(*allocation_master(os.environ, int(sys.argv[1])))
