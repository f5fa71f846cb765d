"""PBS Pro, as at ALCF: `qsub` submits, `mpiexec` starts the ranks, `qstat -x` tells a job's state."""

from __future__ import annotations

import json
from pathlib import Path

from launchers.batch import ENDED, QUEUED, RUNNING, Job, JobState, Scheduler, run_command
from launchers.site_rules import job_queue
from suite.shared_names import Status

QUEUED_STATES = ("Q", "H", "W", "T", "S")
ENDED_STATES = ("F", "X")
# PBS Pro's exit statuses for jobs it killed itself (negative: JOB_EXEC_KILL_*).
EXIT_STATUSES = {-29: (Status.timeout, "walltime exceeded"), -27: (Status.oom, "memory limit exceeded"),
                 -25: (Status.timeout, "cpu time limit exceeded")}


def job_state(job_id: str, job_state_letter: str, exit_status: int | None = None, comment: str = "") -> JobState:
    if job_state_letter in QUEUED_STATES:
        return JobState(job_id, QUEUED, None, job_state_letter + (f" ({comment})" if comment else ""))
    if job_state_letter not in ENDED_STATES:
        return JobState(job_id, RUNNING, None, job_state_letter)
    if exit_status == 0:
        return JobState(job_id, ENDED, Status.finished, "F (exit status 0)")
    status, words = EXIT_STATUSES.get(exit_status, (Status.failed, None))
    if words is None:
        words = f"killed by signal {exit_status - 256}" if exit_status and exit_status > 256 else \
            f"exit status {exit_status}"
    return JobState(job_id, ENDED, status, f"F ({words}{'; ' + comment if comment else ''})")


class Pbs(Scheduler):
    name = "pbs"
    directive = "#PBS"
    submit_command = "qsub"
    queue_option = "-q {}"
    account_option = "-A {}"
    rank_launcher = "mpiexec -n {ranks} --ppn {ranks_per_node} --depth {cores} --cpu-bind depth"
    warning_signal = None  # PBS sends none before the walltime: the job script's own timer does

    def allocation(self, job: Job) -> list[str]:
        hours, minutes = divmod(job.cluster.job.time_limit_min, 60)
        return [f"-N {job.name}", *self.chunks(job), f"-l walltime={hours:02d}:{minutes:02d}:00",
                f"-o {job.log}", "-j oe"]

    @staticmethod
    def chunks(job: Job) -> list[str]:
        """`-l select=` and `-l place=`: one chunk per node, one node each; or, where the queue hands out GPUs
        (Sophia's by-gpu), one chunk per GPU, which the queue keeps on one node."""
        gpus = job.gpus_per_node
        queue = job_queue(job.cluster, job.nodes, job.ranks_per_node, gpus)
        if queue is not None and queue.gpus:
            return [f"-l select={gpus}"]
        numbers = {"ranks_per_node": job.ranks_per_node, "ncpus": job.ranks_per_node * job.cores_per_rank,
                   "ngpus": gpus}
        chunk = job.cluster.job.select or "ncpus={ncpus}:mpiprocs={ranks_per_node}" + (":ngpus={ngpus}" if gpus else "")
        return [f"-l select={job.nodes}:{chunk.format(**numbers)}", "-l place=scatter"]

    def submit(self, script: Path) -> str:
        return run_command(["qsub", str(script)]).strip()

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        output = run_command(["qstat", "-x", "-f", "-F", "json", *job_ids], ok_errors=("Unknown Job Id",))
        jobs = json.loads(output).get("Jobs", {}) if output.strip() else {}
        return {job_id: job_state(job_id, info.get("job_state", "?"), info.get("Exit_status"), info.get("comment", ""))
                for job_id, info in jobs.items()}
