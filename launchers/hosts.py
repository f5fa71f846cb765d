"""The hosts and job id of the scheduler allocation a process runs in, from the scheduler's variables
(Slurm's node list, LSF's host list, PBS's node file): rank 0's host serves the rendezvous, horovodrun
needs the host list, and a run records its job id."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

JOB_ID_VARIABLES = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "COBALT_JOBID")


def slurm_hosts(nodelist: str) -> list[str]:
    """The hosts of a Slurm host list such as `gpu[07-09,12],login1`, in order."""
    hosts = []
    for prefix, ranges in re.findall(r"([^,\[\]]+)(?:\[([^\]]+)\])?", nodelist.strip()):
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            hosts += [prefix + str(n).zfill(len(low)) for n in range(int(low), int(high or low) + 1)]
    if not hosts:
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    return hosts


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
        return slurm_hosts(nodelist)
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
