"""mpiexec (MPICH's Hydra, which `make axonn` installs beside the interpreter), which starts the ranks of strategies
whose ranks talk MPI as well as torch.distributed (`rank_launcher` "mpiexec": AxoNN's pipelining sends activations
with mpi4py, over MPI_COMM_WORLD, so its ranks must be MPI's).

Here it starts the point's ranks on this machine; in a job script, on the job's first node, where Hydra reads the
allocation of the scheduler it finds (Slurm, LSF, PBS) and starts its proxies on the other hosts with that scheduler's
own launcher (srun, blaunch) or ssh. Hydra passes its whole environment on to every rank, which reads its place
from PMI_RANK and MPI_LOCALRANKID (`suite.runtime.rendezvous`) and the torch process group's address from
MASTER_ADDR and MASTER_PORT, as under every launcher. Each line a rank prints is prefixed `[rank<i>]: `, as the
local launcher prefixes them.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

PREFIX = "[rank%r]: "  # Hydra's -prepend-pattern (%r: the rank)


def mpiexec(python: str) -> str:
    """The mpiexec installed beside the interpreter (the suite's venv)."""
    return str(Path(python).with_name("mpiexec"))


def mpiexec_command(point_dir: Path, workers: int) -> list[str]:
    return [mpiexec(sys.executable), "-n", str(workers), "-prepend-pattern", PREFIX,
            sys.executable, "-m", "suite.worker", str(point_dir)]


def batch_launch_command(python: str, ranks: int, ranks_per_node: int) -> str:
    """The start of a job script's command that starts a step's ranks (the worker command follows)."""
    return f"{shlex.quote(mpiexec(python))} -n {ranks} -ppn {ranks_per_node} -prepend-pattern {shlex.quote(PREFIX)}"
