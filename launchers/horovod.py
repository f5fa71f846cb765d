"""horovodrun, which starts the ranks of strategies whose `rank_launcher` is "horovodrun" (`horovod`).

Horovod's gloo controller (the only one of the suite's build, `suite.tools.build_horovod`) meets at
horovodrun's rendezvous server, so horovodrun starts the ranks here and on batch clusters alike: here
with `-H localhost:N`; in a job script on the job's first node, with `-H` listing the allocation's hosts,
where it starts the ranks of the other hosts over ssh. horovodrun passes its whole environment on to
every rank, so the ranks find the torch process group's address as any rank does (`suite.runtime.rendezvous`):
set before horovodrun here, and on a cluster by the job script (MASTER_ADDR and MASTER_PORT of each step).

    python -m launchers.horovod <ranks per node> <nodes>   # in a job script: the allocation as `-H` wants it
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from suite.runtime.rendezvous import allocation_hosts


def horovodrun(python: str) -> str:
    """The horovodrun installed beside the interpreter (the suite's venv)."""
    return str(Path(python).with_name("horovodrun"))


def horovodrun_command(point_dir: Path, workers: int) -> list[str]:
    return [horovodrun(sys.executable), "-np", str(workers), "-H", f"localhost:{workers}", "--gloo",
            sys.executable, "-m", "suite.worker", str(point_dir)]


def batch_launch_command(python: str, ranks: int, nodes: int, ranks_per_node: int) -> str:
    """The start of a job script's command that starts a step's ranks (the worker command follows)."""
    hosts = f'"$({shlex.quote(python)} -m launchers.horovod {ranks_per_node} {nodes})"'
    return f"{shlex.quote(horovodrun(python))} -np {ranks} -H {hosts} --gloo"


def host_slots(env: Mapping[str, str], ranks_per_node: int, nodes: int) -> str:
    """`host:slots,...` of the allocation's first `nodes` hosts, rank 0's host first."""
    hosts = allocation_hosts(env)[:nodes]
    if len(hosts) < nodes:
        raise SystemExit(f"launchers.horovod: the allocation has {len(hosts)} host(s), the step needs {nodes}")
    return ",".join(f"{host}:{ranks_per_node}" for host in hosts)


if __name__ == "__main__":
    print(host_slots(os.environ, int(sys.argv[1]), int(sys.argv[2])))
