"""Slurm: `sbatch` submits, `srun` starts one task per rank, `squeue` (then `sacct`) tells a job's state.

Placement: each rank sees all of its node's GPUs of the job (so NCCL keeps its peer-to-peer path) and takes
its local rank's (SLURM_LOCALID; `--mpi=none`, as under a site's MpiDefault=pmi2 srun would set PMI_RANK
without a local rank); `--cpus-per-task` cores each, memory as configured or the whole node's, the nodes
to the job alone unless `job.exclusive` is false. Not `--gpu-bind=closest`: it would hide the other GPUs
from each rank (CUDA_VISIBLE_DEVICES), costing NCCL its CUDA IPC; a node whose GPU numbering does not
follow its cores takes `cluster.gpu_order`.
"""

from __future__ import annotations

import math
from pathlib import Path

from launchers.batch import ENDED, QUEUED, RUNNING, Job, JobState, Scheduler, run_command
from suite.shared_names import Status

# Slurm's job states (squeue %T, sacct State) as the suite reads them; unlisted ones count as running.
STATES = {
    "PENDING": (QUEUED, None), "CONFIGURING": (QUEUED, None), "REQUEUED": (QUEUED, None),
    "REQUEUE_HOLD": (QUEUED, None), "REQUEUE_FED": (QUEUED, None), "RESV_DEL_HOLD": (QUEUED, None),
    "SUSPENDED": (QUEUED, None),
    "COMPLETED": (ENDED, Status.finished), "TIMEOUT": (ENDED, Status.timeout), "PREEMPTED": (ENDED, Status.timeout),
    "DEADLINE": (ENDED, Status.timeout), "OUT_OF_MEMORY": (ENDED, Status.oom), "CANCELLED": (ENDED, Status.failed),
    "FAILED": (ENDED, Status.failed), "NODE_FAIL": (ENDED, Status.failed), "BOOT_FAIL": (ENDED, Status.failed),
    "SPECIAL_EXIT": (ENDED, Status.failed), "REVOKED": (ENDED, Status.failed),
}
UNKNOWN_JOB = ("Invalid job id", "accounting storage is disabled")


def job_state(job_id: str, state: str, reason: str = "", exit_code: str = "") -> JobState:
    name = state.split()[0] if state.strip() else "UNKNOWN"  # sacct writes e.g. "CANCELLED by 1000"
    phase, status = STATES.get(name, (RUNNING, None))
    notes = [n for n in (reason if reason not in ("", "None") else "",
                         f"exit code {exit_code}" if exit_code not in ("", "0:0") else "") if n]
    return JobState(job_id, phase, status, state.strip() + (f" ({', '.join(notes)})" if notes else ""))


class Slurm(Scheduler):
    name = "slurm"
    directive = "#SBATCH"
    submit_command = "sbatch"
    queue_option = "--partition={}"
    account_option = "--account={}"
    rank_launcher = ("srun --mpi=none --nodes={nodes} --ntasks={ranks} --ntasks-per-node={ranks_per_node} "
                     "--cpus-per-task={cores} --kill-on-bad-exit=1")
    # `B:`: to the batch shell, which stops the running step itself (by default only the steps get it, and a
    # warning that lands between two steps is lost); SIGUSR1, as SIGTERM to the shell means a cancel.
    warning_signal = "USR1"
    # srun turns a SIGTERM it gets into SIGKILL for its tasks (src/srun/signals.c, "forcing job termination"), which
    # would cut the ranks off unsaved; SIGUSR1 and SIGUSR2 it hands on as they are.
    launcher_stop_signal = "USR2"

    def allocation(self, job: Job) -> list[str]:
        c = job.cluster.job
        memory = f"{math.ceil(job.ranks_per_node * c.mem_per_worker_gb * 1024)}M" if c.mem_per_worker_gb else "0"
        options = [f"--job-name={job.name}", f"--nodes={job.nodes}", f"--ntasks-per-node={job.ranks_per_node}",
                   f"--cpus-per-task={job.cores_per_rank}", f"--mem={memory}", f"--time={c.time_limit_min}",
                   f"--output={job.log}", f"--signal=B:{self.warning_signal}@{c.stop_margin_s}"]
        if c.exclusive:
            options.append("--exclusive")
        if job.gpus_per_node:
            options.append(f"--gpus-per-node={job.gpus_per_node}")
        return options

    def submit(self, script: Path) -> str:
        return run_command(["sbatch", "--parsable", str(script)]).strip().split(";")[0]

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        ids = ",".join(job_ids)
        found = {}
        for line in run_command(["squeue", "--noheader", "--states=all", f"--jobs={ids}", "--format=%i|%T|%r"],
                                ok_errors=UNKNOWN_JOB).splitlines():
            job_id, state, reason = line.strip().split("|")
            found[job_id] = job_state(job_id, state, reason)
        missing = [j for j in job_ids if j not in found]
        if missing:  # finished long enough ago to have left slurmctld's memory: ask the accounting database
            for line in run_command(["sacct", "-X", "--noheader", "--parsable2", f"--jobs={','.join(missing)}",
                                     "--format=JobID,State,Reason,ExitCode"], ok_errors=UNKNOWN_JOB).splitlines():
                job_id, state, reason, exit_code = line.strip().split("|")
                found[job_id] = job_state(job_id, state, reason, exit_code)
        return found
