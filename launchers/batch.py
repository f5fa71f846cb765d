"""A small API over batch schedulers (Slurm, LSF, PBS): what a job is, how it is submitted, what state it is in.

A job runs one point, or several one after another (`cluster.job.points_per_job`), each as one
step whose ranks the scheduler's own launcher starts (srun, jsrun, mpiexec). Each scheduler module
says how to ask for the allocation, how to start a step's ranks, how to submit and how to read a
job's state; `launchers.jobscript` renders the one job script they all share.
"""

from __future__ import annotations

import math
import os
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchers import horovod, mpiexec
from suite.errors import ConfigError
from suite.layout import cores_per_rank
from suite.records.tracking_server import without_own_password

QUEUED, RUNNING, ENDED = "queued", "running", "ended"


class SchedulerError(RuntimeError):
    """The scheduler's command failed or could not be reached; the message is one line."""


@dataclass(frozen=True)
class Step:
    """One point of a job: its ranks, started by the scheduler's rank launcher in the point's directory."""

    point_dir: Path
    label: str
    ranks: int
    nodes: int
    threads: int  # OMP_NUM_THREADS of each rank
    rank_launcher: str | None = None  # the strategy's own (Strategy.rank_launcher), else the scheduler's
    devices_per_rank: int = 1  # where the cluster has GPUs: several where one process drives all its stages (gpipe)

    @property
    def ranks_per_node(self) -> int:
        return math.ceil(self.ranks / self.nodes)


@dataclass(frozen=True)
class Job:
    name: str
    cluster: Any  # the points' `cluster` config (suite.config.ClusterConfig)
    steps: tuple[Step, ...]
    script: Path  # where the job script is written
    log: Path  # the scheduler's own output of the job
    python: str  # the interpreter the ranks and the recorder run with
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)  # exported before the steps run

    def __post_init__(self) -> None:
        """What the scheduler is asked for is known and possible, before anything is submitted."""
        cores_per_rank(self.cluster)
        c = self.cluster.job
        if not 0 < c.stop_margin_s < 60 * c.time_limit_min:
            raise ConfigError(f"cluster {self.cluster.name}: job.stop_margin_s={c.stop_margin_s} must be more than 0 "
                              f"and less than the time limit ({c.time_limit_min} min)")

    @property
    def nodes(self) -> int:
        return max(step.nodes for step in self.steps)

    @property
    def ranks_per_node(self) -> int:
        return max(step.ranks_per_node for step in self.steps)

    @property
    def cores_per_rank(self) -> int:
        return cores_per_rank(self.cluster)

    def step_gpus(self, step: Step) -> int:
        """GPUs each rank of the step drives: none on a CPU cluster."""
        return 0 if self.cluster.device == "cpu" else step.devices_per_rank

    @property
    def gpus_per_node(self) -> int:
        return max(step.ranks_per_node * self.step_gpus(step) for step in self.steps)


@dataclass(frozen=True)
class JobState:
    job_id: str
    phase: str  # queued | running | ended
    status: str | None  # once ended: the suite status the scheduler's verdict means (finished: ended normally)
    detail: str  # the scheduler's own words, e.g. "TIMEOUT" or "EXIT (TERM_MEMLIMIT: ...)"


def run_command(cmd: list[str], stdin: str | None = None, ok_errors: tuple[str, ...] = ()) -> str:
    """stdout of a scheduler command; SchedulerError unless it succeeds or fails only with one of `ok_errors`
    (e.g. "unknown job id", which only means the scheduler has forgotten a job)."""
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120,
                              env=without_own_password(dict(os.environ)))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SchedulerError(f"{cmd[0]}: {e}") from e
    if done.returncode and not any(text in done.stderr + done.stdout for text in ok_errors):
        message = " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
        raise SchedulerError(f"{' '.join(cmd[:2])} failed: {message}")
    return done.stdout


class Scheduler(ABC):
    name: str
    directive: str  # the prefix of option lines in a job script: #SBATCH, #BSUB, #PBS
    submit_command: str  # must be on PATH to submit
    queue_option: str  # e.g. "--partition={}"
    account_option: str
    # How a step's ranks start; placeholders: {ranks} {nodes} {ranks_per_node} {cores} {gpus} (of each rank)
    # {node_cores} {node_gpus} (of one node's ranks). A cluster config may replace it (`cluster.job.launcher`).
    rank_launcher: str
    # The signal the scheduler sends the job script `job.stop_margin_s` before the time limit, if it sends one (the
    # script's own timer sends SIGUSR1 otherwise): the running point's ranks are stopped and it is recorded.
    warning_signal: str | None
    # Signals by which the scheduler ends the job (cancel, preemption, the limit itself): the ranks are stopped and
    # `make collect` records the point with the scheduler's verdict.
    ending_signals: tuple[str, ...] = ("TERM",)
    # What the job script sends the scheduler's rank launcher to stop the ranks: a signal it hands on to them as one
    # they stop on (suite.errors.Stopped).
    launcher_stop_signal = "TERM"

    @abstractmethod
    def allocation(self, job: Job) -> list[str]:
        """The options that ask for the job's nodes, cores, GPUs and time, name it and place its output."""

    def directives(self, job: Job) -> list[str]:
        """The job's scheduler options, one per line, without the directive prefix."""
        c = job.cluster.job
        options = self.allocation(job)
        if c.queue:
            options.append(self.queue_option.format(c.queue))
        if c.account:
            options.append(self.account_option.format(c.account))
        return options

    @abstractmethod
    def submit(self, script: Path) -> str:
        """Submit the job script; return the job id."""

    @abstractmethod
    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        """The state of each job the scheduler still knows (jobs it has forgotten are left out)."""

    def stop_signal(self, step: Step) -> str:
        """The signal the job script sends the step's launcher to stop its ranks (horovodrun and mpiexec stop them on
        SIGTERM)."""
        return "TERM" if step.rank_launcher else self.launcher_stop_signal

    def launch_command(self, job: Job, step: Step) -> str:
        if step.rank_launcher == "horovodrun":
            return horovod.batch_launch_command(job.python, step.ranks, step.nodes, step.ranks_per_node)
        if step.rank_launcher == "mpiexec":
            return mpiexec.batch_launch_command(job.python, step.ranks, step.ranks_per_node)
        template = job.cluster.job.launcher or self.rank_launcher
        return template.format(ranks=step.ranks, nodes=step.nodes, ranks_per_node=step.ranks_per_node,
                               cores=job.cores_per_rank, gpus=job.step_gpus(step),
                               node_cores=step.ranks_per_node * job.cores_per_rank,
                               node_gpus=step.ranks_per_node * job.step_gpus(step))
