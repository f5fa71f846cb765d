"""IBM Spectrum LSF with jsrun, as on Lassen: `bsub -nnodes` allocates whole nodes, `jsrun` starts one
resource set per node holding that node's ranks, their GPUs and cores, `bjobs` tells a job's state.

One resource set per node, not per GPU: jsrun isolates resource sets from each other (cgroups), which
defeats the CUDA IPC that NCCL's peer-to-peer path inside a node relies on (OLCF's Summit guide, the same
jsrun stack: "Run in a single resource set per host ... you'll need to set the GPU affinity manually").
Every rank sees the node's GPUs and takes its local rank's; `--bind packed:<cores>` with the packed
launch distribution puts local ranks 0-1 on socket 0, beside GPUs 0-1. `--smpiargs=-disable_gpu_hooks`:
the ranks use no CUDA-aware MPI, and Spectrum MPI's CUDA hook fails a rank whose Python loads anything
linked to it (mpi4py, horovod) before MPI_Init (Summit guide, "CUDA hook error").
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from launchers.batch import (
    ENDED,
    QUEUED,
    RUNNING,
    Job,
    JobState,
    Scheduler,
    SchedulerError,
    Step,
    run_command,
)
from suite.errors import ConfigError
from suite.shared_names import Status

STATES = {"PEND": (QUEUED, None), "PSUSP": (QUEUED, None), "DONE": (ENDED, Status.finished),
          "EXIT": (ENDED, Status.failed)}
# Why an EXIT job ended (bjobs exit_reason), where it means more than `failed`.
EXIT_REASONS = {"TERM_RUNLIMIT": Status.timeout, "TERM_PREEMPT": Status.timeout, "TERM_MEMLIMIT": Status.oom}


def job_state(job_id: str, stat: str, exit_reason: str = "") -> JobState:
    phase, status = STATES.get(stat, (RUNNING, None))
    reason = exit_reason.strip() if exit_reason.strip() not in ("", "-") else ""
    if stat == "EXIT":
        status = next((s for key, s in EXIT_REASONS.items() if key in reason), status)
    return JobState(job_id, phase, status, stat + (f" ({reason})" if reason else ""))


class Lsf(Scheduler):
    name = "lsf"
    directive = "#BSUB"
    submit_command = "bsub"
    queue_option = "-q {}"
    account_option = "-G {}"
    rank_launcher = ("jsrun --nrs {nodes} --rs_per_host 1 --tasks_per_rs {ranks_per_node} --cpu_per_rs {node_cores} "
                     "--gpu_per_rs {node_gpus} --bind packed:{cores} --launch_distribution packed "
                     "--smpiargs=-disable_gpu_hooks")
    # -wa/-wt: SIGTERM to the job's processes (the script, jsrun) before the run limit. bkill sends SIGINT first,
    # and the run limit itself SIGUSR2 ("the job is sent a SIGUSR2 signal, and is killed if it does not
    # terminate within ten minutes", IBM's bsub -W).
    warning_signal = "TERM"
    ending_signals = ("INT", "USR2")

    def allocation(self, job: Job) -> list[str]:
        c = job.cluster.job
        return [f"-J {job.name}", f"-nnodes {job.nodes}", f"-W {c.time_limit_min}", f"-o {job.log}",
                f"-wa {self.warning_signal}", f"-wt {math.ceil(c.stop_margin_s / 60)}"]  # -wt in minutes

    def launch_command(self, job: Job, step: Step) -> str:
        if step.ranks % step.nodes and not job.cluster.job.launcher and step.rank_launcher is None:
            raise ConfigError(f"{step.label}: jsrun starts as many ranks on each node (one resource set per node), "
                              f"but {step.ranks} ranks do not divide over {step.nodes} nodes")
        return super().launch_command(job, step)

    def submit(self, script: Path) -> str:
        output = run_command(["bsub"], stdin=script.read_text())  # bsub reads #BSUB lines only from stdin
        match = re.search(r"Job <(\d+)>", output)
        if not match:
            raise SchedulerError(f"bsub answered without a job id: {output.strip()}")
        return match.group(1)

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        output = run_command(["bjobs", "-a", "-noheader", "-o", "jobid stat exit_reason delimiter='|'", *job_ids],
                             ok_errors=("is not found",))
        found = {}
        for line in output.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 3 and fields[0] in job_ids:
                found[fields[0]] = job_state(*fields)
        return found
