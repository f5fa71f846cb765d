"""A point's status and error line from real point directories and the output srun and horovodrun print."""

import pytest

from launchers import LaunchResult
from launchers.slurm import job_state as slurm_state
from suite.errors import ConfigError, Stopped
from suite.point_dir import PointDir
from suite.records.record import (
    _failed_ranks,
    _first_exception_line,
    _horovodrun_failed_ranks,
    job_status,
    launch_status,
)

TIMEOUT_S, EPOCHS = 30, 3
EXITED = LaunchResult(returncode=1, timed_out=False, seconds=4.0)  # a batch step's exit code: no rank's own

# What the local launcher leaves in launcher.log: each rank's output prefixed with [rank<i>]:
LOCAL_LOG = """\
[rank0]: 2026-01-05 10:00:00,001 [rank0] rank 0 of 2 (local 0 of 2) from torchrun
[rank1]: Traceback (most recent call last):
[rank1]:   File "/repo/suite/worker.py", line 80, in main
[rank1]:     raise ModuleNotFoundError("No module named 'apex'")
[rank1]: ModuleNotFoundError: No module named 'apex'
[rank0]: torch.distributed.DistBackendError: [../third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer
launcher: rank 0 exited with code 1
launcher: rank 1 exited with code 1
"""
# srun with --kill-on-bad-exit: task 1 fails, srun stops the step, task 0 ends by SIGTERM.
SRUN_LOG = """\
RuntimeError: CUDA error: an illegal memory access was encountered
srun: error: gpu07: task 1: Exited with exit code 3
srun: launch/slurm: _step_signal: Terminating StepId=4711.0
slurmstepd: error: *** STEP 4711.0 ON gpu07 CANCELLED AT 2026-01-05T10:00:03 ***
srun: error: gpu07: task 0: Terminated
srun: error: gpu08: task 2: Exited with exit code 1
srun: Force Terminated StepId=4711.0
"""
SRUN_KILLED_LOG = """\
srun: error: gpu08: task 3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=4712.0
srun: error: gpu07: task 0: Exited with exit code 1
"""
# horovodrun (gloo): each rank's output prefixed with [<rank>]<stdout|stderr>:, then its own exit lines
# (a shell's code: 137 = 128 + SIGKILL). After the first failure it freezes and SIGKILLs the other ranks.
HOROVODRUN_KILLED_LOG = """\
[0]<stdout>:2026-01-05 10:00:00,001 [rank0] rank 0 of 2 (local 0 of 2) from horovodrun
[1]<stdout>:2026-01-05 10:00:00,002 [rank1] rank 1 of 2 (local 1 of 2) from horovodrun
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
[0]<stderr>:RuntimeError: Horovod has been shut down. This was caused by an exception on one of the ranks
Process 0 exit with status code 137.
"""
HOROVODRUN_ERROR_LOG = """\
[1]<stderr>:Traceback (most recent call last):
[1]<stderr>:  File "/repo/suite/worker.py", line 80, in main
[1]<stderr>:ValueError: bad shape
Process 1 exit with status code 1.
Terminating remaining workers after failure of Process 1.
Process 0 exit with status code 143.
"""


@pytest.fixture
def out(tmp_path) -> PointDir:
    return PointDir(tmp_path)


def with_epochs(out: PointDir, done: int) -> PointDir:
    for epoch in range(1, done + 1):
        out.append_epoch({"epoch": epoch, "epoch_time_s": 1.5, "train_loss": 2.0 / epoch})
    return out


def report(out: PointDir, rank: int, exc: BaseException) -> None:
    """A rank's own error report, as the worker writes it when training raises."""
    try:
        raise exc
    except BaseException as raised:
        out.write_error(rank, raised)


# --- launch_status: a point launched here, or a batch step's last line -----------------------------------------------

def test_timed_out_point_says_how_far_it_got(out):
    with_epochs(out, 1)
    assert launch_status(out, LaunchResult(None, True, 31.0), TIMEOUT_S, EPOCHS) == (
        "timeout", "no result after timeout_s=30 s; the point was stopped after 1 of 3 epochs")


def test_sweep_stopped_by_sigterm_is_a_timeout_and_by_ctrl_c_a_failure(out):
    with_epochs(out, 2)
    report(out, 0, Stopped("stopped by SIGTERM (a time limit, a preemption or a cancel)"))
    assert launch_status(out, LaunchResult(None, False, 9.0, "SIGTERM"), TIMEOUT_S, EPOCHS) == (
        "timeout", "the sweep got SIGTERM (a time limit or a preemption) after 2 of 3 epochs")
    assert launch_status(out, LaunchResult(None, False, 9.0, "SIGINT"), TIMEOUT_S, EPOCHS) == (
        "failed", "interrupted (SIGINT) after 2 of 3 epochs: the sweep was stopped")


def test_exit_0_with_a_summary_is_finished(out):
    with_epochs(out, EPOCHS).write_summary({"epoch_time_s_mean": 1.5})
    assert launch_status(out, LaunchResult(0, False, 5.0), TIMEOUT_S, EPOCHS) == ("finished", None)


def test_exit_0_without_a_summary_is_not_finished(out):
    status, error = launch_status(out, LaunchResult(0, False, 5.0), TIMEOUT_S, EPOCHS)
    assert status == "failed" and "without an error report" in error


def test_the_earliest_error_report_is_the_cause(out):
    report(out, 1, RuntimeError("injected fault at step 1\nsecond line"))
    report(out, 0, RuntimeError("Connection closed by peer"))  # rank 0's consequence, written later
    result = LaunchResult(1, False, 5.0, failed_ranks={0: 1, 1: 1})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == ("failed", "rank 1: RuntimeError: injected fault at step 1")


@pytest.mark.parametrize("exc, status", [
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"), "oom"),
    (MemoryError(), "oom"),
    (ConfigError("steps_per_epoch=6 but the shard holds 5 batches of 4"), "invalid"),
])
def test_the_report_gives_the_status(out, exc, status):
    report(out, 0, exc)
    assert launch_status(out, LaunchResult(1, False, 5.0, failed_ranks={0: 1}), TIMEOUT_S, EPOCHS)[0] == status


def test_a_rank_stopped_by_sigterm_reports_timeout_with_the_epochs_done(out):
    with_epochs(out, 1)
    report(out, 0, Stopped("stopped by SIGTERM (a time limit, a preemption or a cancel)"))
    assert launch_status(out, EXITED, TIMEOUT_S, EPOCHS) == (
        "timeout", "rank 0: Stopped: stopped by SIGTERM (a time limit, a preemption or a cancel) after 1 of 3 epochs")


def test_a_rank_killed_by_sigkill_is_the_cause_over_the_others_reports(out):
    report(out, 0, RuntimeError("Connection closed by peer"))  # the consequence of rank 1's death
    result = LaunchResult(1, False, 5.0, failed_ranks={0: 1, 1: -9})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == (
        "oom", "rank 1 was killed by SIGKILL (most likely the kernel's out-of-memory killer)")


def test_sigkill_comes_before_other_signals_and_sigterm_is_never_the_cause(out):
    result = LaunchResult(-15, False, 5.0, failed_ranks={0: -15, 1: -11, 2: -9})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS)[0] == "oom"
    result = LaunchResult(-15, False, 5.0, failed_ranks={0: -15, 1: -11})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == (
        "failed", "rank 1 killed by signal 11 without an error report (see its log)")


def test_a_rank_stopped_by_sigterm_after_another_reported_leaves_the_report_as_cause(out):
    report(out, 1, ValueError("bad shape"))
    result = LaunchResult(1, False, 5.0, failed_ranks={0: -15, 1: 1})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == ("failed", "rank 1: ValueError: bad shape")


def test_a_rank_the_launcher_killed_after_another_reported_is_not_taken_for_an_oom(out):
    """Seen on a GPU: rank 1 failed, rank 0 waited in a collective through SIGTERM and the launcher SIGKILLed it."""
    report(out, 1, RuntimeError("CUDA error: invalid device ordinal"))
    result = LaunchResult(-9, False, 5.0, failed_ranks={0: -9, 1: 1}, stopped_ranks=frozenset({0}))
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == (
        "failed", "rank 1: RuntimeError: CUDA error: invalid device ordinal")


def test_a_killed_rank_that_reported_first_is_judged_by_its_report(out):
    report(out, 0, RuntimeError("injected fault at step 1"))
    result = LaunchResult(-9, False, 5.0, failed_ranks={0: -9})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == ("failed", "rank 0: RuntimeError: injected fault at step 1")


# horovodrun's log of a point held to less memory than Horovod's init needed: its background thread got no stack.
HOROVOD_ABORTED_LOG = """\
[1]<stderr>:terminate called after throwing an instance of 'std::system_error'
[1]<stderr>:  what():  Resource temporarily unavailable
[0]<stderr>:terminate called after throwing an instance of 'std::system_error'
[0]<stderr>:  what():  Resource temporarily unavailable
[1]<stderr>:Aborted
Process 1 exit with status code 134.
Terminating remaining workers after failure of Process 1.
Process 0 exit with status code 134.
"""


def test_a_rank_aborted_on_a_failed_allocation_in_native_code_ran_out_of_memory(out):
    out.launcher_log.write_text(HOROVOD_ABORTED_LOG)
    assert launch_status(out, EXITED, TIMEOUT_S, EPOCHS) == (
        "oom", "rank 1 aborted on std::system_error: Resource temporarily unavailable (out of memory)")
    out.launcher_log.write_text("[rank0]: terminate called after throwing an instance of 'std::bad_alloc'\n"
                                "[rank0]:   what():  std::bad_alloc\n")
    assert launch_status(out, LaunchResult(-6, False, 5.0, failed_ranks={0: -6}), TIMEOUT_S, EPOCHS) == (
        "oom", "rank 0 aborted on std::bad_alloc: std::bad_alloc (out of memory)")
    out.launcher_log.write_text("[rank0]: terminate called after throwing an instance of 'c10::Error'\n"
                                "[rank0]:   what():  bad things\n")
    assert launch_status(out, LaunchResult(-6, False, 5.0, failed_ranks={0: -6}), TIMEOUT_S, EPOCHS)[0] == "failed"


def test_exit_code_without_a_report(out):
    result = LaunchResult(3, False, 5.0, failed_ranks={0: 3})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == (
        "failed", "rank 0 exited with code 3 without an error report (see its log)")
    assert launch_status(out, EXITED, TIMEOUT_S, EPOCHS) == (  # a batch step without launcher output
        "failed", "a worker exited with code 1 without an error report (see its log)")


def test_the_first_exception_in_the_launcher_log_explains_a_silent_exit(out):
    out.launcher_log.write_text(LOCAL_LOG)
    result = LaunchResult(1, False, 5.0, failed_ranks={1: 1})
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == (
        "failed", "rank 1 exited with code 1: ModuleNotFoundError: No module named 'apex'")


def test_a_rank_the_launcher_stopped_is_not_blamed_for_a_silent_exit(out):
    out.launcher_log.write_text(LOCAL_LOG)
    result = LaunchResult(-15, False, 5.0, failed_ranks={0: -15, 1: 1})  # as the local launcher orders them
    assert launch_status(out, result, TIMEOUT_S, EPOCHS) == (
        "failed", "rank 1 exited with code 1: ModuleNotFoundError: No module named 'apex'")


def test_a_batch_step_reads_the_failed_ranks_from_srun(out):
    out.launcher_log.write_text(SRUN_LOG)
    assert launch_status(out, EXITED, TIMEOUT_S, EPOCHS) == (
        "failed", "rank 1 exited with code 3: RuntimeError: CUDA error: an illegal memory access was encountered")
    out.launcher_log.write_text(SRUN_KILLED_LOG)
    assert launch_status(out, EXITED, TIMEOUT_S, EPOCHS) == (
        "oom", "rank 3 was killed by SIGKILL (most likely the kernel's out-of-memory killer)")


def test_a_horovodrun_point_blames_the_rank_that_died_first(out):
    out.launcher_log.write_text(HOROVODRUN_KILLED_LOG)
    assert launch_status(out, EXITED, TIMEOUT_S, EPOCHS) == (
        "oom", "rank 1 was killed by SIGKILL (most likely the kernel's out-of-memory killer)")
    out.launcher_log.write_text(HOROVODRUN_ERROR_LOG)
    assert launch_status(out, EXITED, TIMEOUT_S, EPOCHS) == ("failed",
                                                             "rank 1 exited with code 1: ValueError: bad shape")


# --- the launchers' output ---------------------------------------------------------------------------------------

def test_srun_exit_lines():
    assert _failed_ranks(SRUN_LOG) == {1: 3, 2: 1}  # "Terminated": srun stopped that task
    assert _failed_ranks(SRUN_KILLED_LOG) == {3: -9, 0: 1}
    assert _failed_ranks(LOCAL_LOG) == {}


def test_horovodrun_exit_lines():
    assert _horovodrun_failed_ranks(HOROVODRUN_KILLED_LOG) == {1: -9, 0: -15}  # killed after the announcement
    assert _horovodrun_failed_ranks(HOROVODRUN_ERROR_LOG) == {1: 1, 0: -15}
    assert _horovodrun_failed_ranks("Process 2 exit with status code 139.\n") == {2: -11}
    assert _failed_ranks(HOROVODRUN_KILLED_LOG) == {1: -9, 0: -15}  # read from a batch step's log as well


@pytest.mark.parametrize("log, line", [
    (LOCAL_LOG, "ModuleNotFoundError: No module named 'apex'"),
    (SRUN_LOG, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    (HOROVODRUN_KILLED_LOG, "RuntimeError: Horovod has been shut down. This was caused by an exception on one of "
                            "the ranks"),
    (HOROVODRUN_ERROR_LOG, "ValueError: bad shape"),
    ("[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n", "torch.OutOfMemoryError: CUDA out of memory."),
    ("[rank1]: Exception: raised bare\n", "Exception: raised bare"),
    ("[rank0]: Fatal Python error: Segmentation fault\n[rank0]:   File \"x.py\", line 1\n", None),
])
def test_first_exception_line(log, line):
    assert _first_exception_line(log) == line


# --- job_status: `make collect` on a batch job that ended unrecorded ----------------------------------------

@pytest.fixture
def job_out(out) -> PointDir:
    out.write_job({"scheduler": "slurm", "job_id": "4711", "script": "/jobs/adhoc/x.sh"})
    return with_epochs(out, 1)


def test_ended_job_with_a_summary_is_finished(job_out):
    job_out.write_summary({"epoch_time_s_mean": 1.5})
    assert job_status(job_out, slurm_state("4711", "CANCELLED by 1000"), EPOCHS) == ("finished", None)


def test_ended_job_a_rank_reported_a_failure_of_its_own(job_out):
    report(job_out, 1, MemoryError())
    assert job_status(job_out, slurm_state("4711", "FAILED"), EPOCHS) == ("oom", "rank 1: MemoryError")


def test_ended_job_the_schedulers_verdict_when_the_ranks_were_only_stopped(job_out):
    report(job_out, 0, Stopped("stopped by SIGTERM (a time limit, a preemption or a cancel)"))
    assert job_status(job_out, slurm_state("4711", "TIMEOUT"), EPOCHS) == (
        "timeout", "slurm job 4711 ended TIMEOUT after 1 of 3 epochs")
    assert job_status(job_out, slurm_state("4711", "CANCELLED by 1000", "None", "0:15"), EPOCHS) == (
        "failed", "slurm job 4711 ended CANCELLED by 1000 (exit code 0:15) after 1 of 3 epochs")


def test_ended_job_that_completed_without_recording_is_failed(job_out):
    assert job_status(job_out, slurm_state("4711", "COMPLETED"), EPOCHS) == (
        "failed", "slurm job 4711 ended COMPLETED after 1 of 3 epochs")


def test_ended_job_the_scheduler_forgot(job_out, tmp_path):
    assert job_status(job_out, None, EPOCHS) == (
        "failed", "slurm job 4711 ended without recording the point and its scheduler no longer knows it "
                  "(after 1 of 3 epochs)")
    assert job_status(PointDir(tmp_path / "no-job"), None, EPOCHS)[1].startswith("batch job ? ended")
