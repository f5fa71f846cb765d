"""Where a rank sits in its job, read from whatever started it: the local launcher, torchrun, horovodrun,
srun, jsrun or mpiexec.

Each launcher describes a rank in its own variables; the scheduler's allocation (Slurm's node list,
LSF's host list, PBS's node file) says which host runs rank 0 and so serves the rendezvous. The
port is derived from the job id, so every rank of a job computes the same one without talking.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from launchers.hosts import allocation_hosts, scheduler_job_id

# (source, rank, world size, local rank, local world size), in order of precedence: the launcher that
# started this very process first; Slurm's variables last, as an allocation also exports them to
# processes that mpirun or torchrun started inside it. None: the launcher does not export that number.
# horovodrun comes first: it passes its whole environment on to every rank, a job script's
# SLURM_PROCID=0 or OMPI_* included, even to ranks on other hosts.
LAUNCHERS = (
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("jsrun/Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpiexec/PMI", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),
    ("mpiexec/PALS", "PALS_RANKID", None, "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)
PORT_BASE, PORT_RANGE = 20000, 20000


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


def master_addr(env: Mapping[str, str]) -> str:
    if "MASTER_ADDR" in env:
        return env["MASTER_ADDR"]
    return next(iter(allocation_hosts(env)), "127.0.0.1")


def master_port(env: Mapping[str, str]) -> int:
    if "MASTER_PORT" in env:
        return int(env["MASTER_PORT"])
    job = scheduler_job_id(env)
    return PORT_BASE + zlib.crc32(job.encode()) % PORT_RANGE if job else 29500


def discover(env: Mapping[str, str], expected_world_size: int = 1) -> Rendezvous:
    """This rank's place in the job; a process started by hand is rank 0 of 1.

    `expected_world_size` (the point's rank count) stands in where the launcher exports none (PALS).
    """
    for source, rank, size, local_rank, local_size in LAUNCHERS:
        if rank not in env:
            continue
        world_size = int(env[size]) if size and size in env else expected_world_size
        if local_size is None:
            local_world_size = _slurm_local_size(env)
        else:
            local_world_size = int(env.get(local_size, world_size))
        return Rendezvous(int(env[rank]), world_size, int(env.get(local_rank, 0)), local_world_size,
                          master_addr(env), master_port(env), source)
    return Rendezvous(0, 1, 0, 1, "127.0.0.1", master_port(env), "a single process")
