"""IBM Spectrum LSF with jsrun, as on Lassen: `bsub -nnodes` allocates whole nodes, `jsrun` starts one
resource set per rank (one GPU and its share of the cores), `bjobs` tells a job's state."""

from __future__ import annotations

import re
from pathlib import Path

from launchers.batch import (
    ENDED,
    QUEUED,
    RUNNING,
    STOP_WARNING_S,
    Job,
    JobState,
    Scheduler,
    SchedulerError,
    run_command,
)

STATES = {"PEND": (QUEUED, None), "PSUSP": (QUEUED, None), "DONE": (ENDED, "finished"), "EXIT": (ENDED, "failed")}
# Why an EXIT job ended (bjobs exit_reason), where it means more than `failed`.
EXIT_REASONS = {"TERM_RUNLIMIT": "timeout", "TERM_PREEMPT": "timeout", "TERM_MEMLIMIT": "oom"}


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
    rank_launcher = ("jsrun --nrs {ranks} --rs_per_host {ranks_per_node} --tasks_per_rs 1 --cpu_per_rs {cores} "
                     "--gpu_per_rs {gpus} --bind packed:{cores}")

    def allocation(self, job: Job) -> list[str]:
        return [f"-J {job.name}", f"-nnodes {job.nodes}", f"-W {job.cluster.job.time_limit_min}", f"-o {job.log}",
                # SIGTERM to the job this many minutes before the run limit
                "-wa TERM", f"-wt {max(1, STOP_WARNING_S // 60)}"]

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
