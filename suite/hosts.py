"""The hosts and job id of the scheduler allocation a process runs in, from the scheduler's variables
(Slurm's node list, LSF's host list, PBS's node file): rank 0's host serves the rendezvous, horovodrun
needs the host list, and a run records its job id.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

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
