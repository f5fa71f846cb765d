"""profile.steps: each rank's torch.profiler trace, and the communication breakdown measured in it."""

import csv
import gzip
import json
from collections import Counter

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from analysis.report import write_report
from suite.errors import ConfigError
from suite.point_dir import PointDir
from suite.runtime.metrics import PhaseTimer
from suite.runtime.profile import StepTrace
from suite.runtime.trace_breakdown import (
    breakdown,
    clip,
    device_intervals,
    host_intervals,
    step_breakdown,
    step_windows,
    subtract,
    union,
    unmeasured_communication,
)
from suite.shared_names import TRACE_BREAKDOWN
from suite.sweep.driver import run_sweep
from suite.sweep.plan import plan

TINY = ["dataset=tokens", "dataset.seq_len=32", "dataset.vocab_size=512", "network=gpt2_tiny", "dataset.samples=64",
        "dataset.val_samples=16", "batch_size=4", "epochs=1", "steps_per_epoch=3", "warmup_steps=1", "eval_batches=1"]
PHASES = {"data", "forward", "backward", "optimizer"}


def event(name: str, start: float, end: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    """A complete trace event; times in microseconds, as traces have them."""
    return {"ph": "X", "cat": cat, "name": name, "ts": start, "dur": end - start, "pid": 1, "tid": tid}


def micro(intervals) -> list[tuple[float, float]]:
    """Intervals in seconds back in microseconds."""
    return [(round(start * 1e6, 6), round(end * 1e6, 6)) for start, end in intervals]


def names(path) -> Counter:
    with gzip.open(path, "rt") as f:
        return Counter(e["name"] for e in json.load(f)["traceEvents"] if e.get("ph") == "X")


def test_interval_arithmetic():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)]) == [(0, 3), (5, 8)]
    assert subtract([(0, 10), (12, 20)], [(2, 3), (5, 13), (19, 25)]) == [(0, 2), (3, 5), (13, 19)]
    assert subtract([(0, 4)], []) == [(0, 4)] and subtract([(1, 2)], [(0, 5)]) == []
    assert clip([(0, 3), (5, 8), (9, 12)], 2, 10) == [(2, 3), (5, 8), (9, 10)]


def test_exposed_communication_is_communication_outside_the_union_of_computation():
    comm = union([(4, 8), (10, 14)])
    compute = union([(0, 5), (6, 7), (11, 13)])
    step = step_breakdown(comm, compute, 0, 16)
    # exposed: [5,6], [7,8], [10,11], [13,14]; idle: [8,10], [14,16]
    assert step == {"time_step_s": 16, "time_comm_s": 8, "time_comm_exposed_s": 4, "time_compute_s": 8,
                    "time_idle_s": 4, "comm_fraction": 0.5}
    assert step_breakdown(comm, compute, 6, 12)["time_comm_s"] == 4  # only what lies in the step


def test_host_timeline_overlaps_gloo_thread_with_compute_and_counts_pending_sends_where_idle():
    events = [
        event("aten::mm", 0, 10), event("aten::mm", 12, 20),  # the main thread computes
        event("c10d::allreduce_", 4, 5), event("aten::copy_", 4.2, 4.8),  # a call (inside an op) and its insides
        event("gloo:all_reduce", 5, 15, "user_annotation", tid=2),  # on gloo's thread, overlapping compute
        event("gloo:send", 15, 30, "user_annotation"),  # posted on the main thread, waited for at 30
        event("ProfilerStep#1", 0, 32, "user_annotation"),
    ]
    comm, compute = host_intervals(events)
    assert micro(compute) == [(0, 4), (5, 10), (12, 20)]
    assert micro(comm) == [(4, 15), (20, 30)]  # the send counts only where its thread computes nothing
    step = step_breakdown(comm, compute, 0, 32e-6)
    assert step["time_comm_exposed_s"] == pytest.approx((2 + 1 + 10) * 1e-6)  # [10,12], the call [4,5], [20,30]
    assert step["time_idle_s"] == pytest.approx(2e-6)


def test_device_timeline_nccl_kernels_are_communication_and_steps_are_the_devices():
    events = [
        event("ProfilerStep#1", 0, 100, "user_annotation"), event("ProfilerStep#2", 100, 200, "user_annotation"),
        event("ProfilerStep#1", 10, 60, "gpu_user_annotation", tid=7),
        event("ProfilerStep#1", 20, 70, "gpu_user_annotation", tid=8),  # the same step on a second stream
        event("ProfilerStep#2", 80, 120, "gpu_user_annotation", tid=7),
        event("ampere_sgemm", 10, 40, "kernel", tid=7), event("Memcpy HtoD", 80, 90, "gpu_memcpy", tid=7),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 70, "kernel", tid=8),
        event("aten::mm", 0, 50),  # host work does not count on a GPU's timeline
    ]
    comm, compute = device_intervals(events)
    assert (micro(comm), micro(compute)) == ([(30, 70)], [(10, 40), (80, 90)])
    assert micro(step_windows(events, "gpu_user_annotation")) == [(10, 80), (80, 120)]


def test_breakdown_of_a_trace_file(tmp_path):
    path = tmp_path / "rank0.pt.trace.json.gz"
    events = [event("ProfilerStep#1", 0, 10, "user_annotation"), event("ProfilerStep#2", 10, 30, "user_annotation"),
              event("aten::mm", 0, 8), event("aten::mm", 10, 20), event("gloo:all_reduce", 5, 25, "user_annotation", 2)]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [*events, {"ph": "M", "name": "thread_name"}]}, f)
    result = breakdown(path)
    assert [s["time_comm_s"] for s in result["steps"]] == pytest.approx([5e-6, 15e-6])
    assert result["time_comm_exposed_s"] == pytest.approx((2e-6 + 5e-6) / 2)
    assert result["comm_fraction"] == pytest.approx(20 / 30)
    assert result.keys() == {*TRACE_BREAKDOWN, "steps"}


def test_a_gpu_trace_without_device_step_ranges_takes_the_hosts(tmp_path):
    """Seen with DeepSpeed on an H100: kernels in the trace, but no `gpu_user_annotation` copy of the steps."""
    path = tmp_path / "rank0.pt.trace.json.gz"
    events = [event("ProfilerStep#1", 0, 100, "user_annotation"), event("ProfilerStep#2", 100, 200, "user_annotation"),
              event("ampere_sgemm", 10, 60, "kernel", tid=7), event("ampere_sgemm", 110, 130, "kernel", tid=7)]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    result = breakdown(path)
    assert [s["time_compute_s"] for s in result["steps"]] == pytest.approx([50e-6, 20e-6])
    assert result["time_idle_s"] == pytest.approx((50e-6 + 80e-6) / 2)


def test_gloo_on_gpus_is_communication_a_device_trace_cannot_show(tmp_path):
    """Ranks sharing a GPU run gloo on CUDA tensors: copies to the host, a reduction there on gloo's thread, copies
    back. The device timeline has only the copies, so the breakdown would say the step did not communicate."""
    path = tmp_path / "rank0.pt.trace.json.gz"
    events = [event("ProfilerStep#1", 0, 100, "gpu_user_annotation", tid=7),
              event("ampere_sgemm", 0, 40, "kernel", tid=7), event("gloo:all_reduce", 40, 90, "user_annotation", 2),
              event("Memcpy DtoH (Device -> Pinned)", 40, 45, "gpu_memcpy", tid=8),
              event("Memcpy HtoD (Pinned -> Device)", 85, 90, "gpu_memcpy", tid=8)]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert breakdown(path)["time_comm_s"] == 0
    assert "gloo on GPU tensors" in unmeasured_communication("gloo", "cuda")
    assert unmeasured_communication("nccl", "cuda") is None and unmeasured_communication("gloo", "cpu") is None


def run_steps(timer: PhaseTimer, count: int, trace: StepTrace | None = None) -> None:
    timer.enabled = True
    for _ in range(count):
        if trace:
            trace.step()
        for phase in ("data", "forward", "backward", "optimizer"):
            with timer.phase(phase):
                torch.ones(64, 64).mm(torch.ones(64, 64))


def test_step_trace_records_the_first_steps_with_their_phases_as_ranges(tmp_path):
    timer = PhaseTimer(torch.device("cpu"))
    trace = StepTrace(2, timer, tmp_path / "traces" / "rank0.pt.trace.json.gz")
    trace.start()
    run_steps(timer, 4, trace)
    trace.finish()
    found = names(trace.path)
    assert (found["ProfilerStep#1"], found["ProfilerStep#2"], found["ProfilerStep#3"]) == (1, 1, 0)
    assert all(found[phase] == 2 for phase in PHASES)  # steps 3 and 4 are not recorded
    assert found["aten::mm"] == 2 * 4 and timer.ranges is None


def test_phases_are_no_ranges_without_a_step_trace(tmp_path):
    timer = PhaseTimer(torch.device("cpu"))
    with profile(activities=[ProfilerActivity.CPU]) as outside:
        run_steps(timer, 2)
    recorded = {e.name for e in outside.events()}
    assert "aten::mm" in recorded and not recorded & PHASES


def test_profile_steps_are_checked_and_enter_a_points_identity():
    (plain,) = plan([TINY, [*TINY, "profile.steps=0"]])  # 0 is the point as it was before profiling existed
    (profiled,) = plan([[*TINY, "profile.steps=2"]])
    assert profiled.config_hash != plain.config_hash
    with pytest.raises(ConfigError, match="profile.steps must be >= 0"):
        plan([[*TINY, "profile.steps=-1"]])
    with pytest.raises(ConfigError, match="profile.steps=4 but an epoch has 3 steps"):
        plan([[*TINY, "profile.steps=4"]])


@pytest.mark.slow  # launches the points' ranks
def test_profiled_points_leave_a_trace_per_rank_and_measure_communication(store, tmp_path):
    points = plan([[*TINY, "strategy=ddp", "workers=2", "profile.steps=2"],
                   [*TINY, "strategy=single", "workers=1", "profile.steps=2"],
                   # sends still pending when the traced steps end: the profiler must not stop then
                   [*TINY, "strategy=pipedream", "workers=2", "profile.steps=2"]], experiment="profile")
    ddp, single, pipedream = run_sweep(points, store)
    assert [o.status for o in (ddp, single, pipedream)] == ["finished"] * 3, [ddp.error, single.error, pipedream.error]

    run = store.client.get_run(ddp.run_id)
    out = PointDir(run.data.tags["suite.point_dir"])
    for rank in (0, 1):
        found = names(out.rank_trace(rank))
        assert all(found[phase] == 2 for phase in PHASES) and found["ProfilerStep#2"] == 1
        assert found["gloo:all_reduce"] > 0 and found["c10d::allreduce_"] > 0
    artifacts = {a.path for a in store.client.list_artifacts(ddp.run_id, "traces")}
    assert artifacts == {"traces/rank0.pt.trace.json.gz", "traces/rank1.pt.trace.json.gz"}
    metrics = run.data.metrics
    assert 0 < metrics["time_comm_exposed_s"] <= metrics["time_comm_s"] < metrics["epoch_time_s_mean"]
    assert metrics["time_compute_s"] > 0 and 0 < metrics["comm_fraction"] < 1
    assert {f"{key}_rank{rank}" for key in TRACE_BREAKDOWN for rank in (0, 1)} <= metrics.keys()
    assert len(out.summary()["breakdown_by_rank"][1]["steps"]) == 2

    alone = store.client.get_run(single.run_id).data.metrics
    assert alone["time_comm_s"] == alone["time_comm_exposed_s"] == alone["comm_fraction"] == 0
    assert alone["time_compute_s"] > 0
    assert store.client.get_run(pipedream.run_id).data.metrics["time_comm_s_rank1"] > 0

    write_report(store, "profile", out_dir=tmp_path)  # the breakdown view: measured communication and MFU's column
    with (tmp_path / "breakdown.csv").open() as f:
        table = {row["strategy"]: row for row in csv.DictReader(f)}
    assert float(table["ddp"]["all comm"]) > 0 and float(table["ddp"]["exposed pct of comm"]) <= 100
    assert float(table["single"]["all comm"]) == 0 and table["single"]["MFU pct"] == ""  # no peak known locally
    assert (tmp_path / "breakdown.png").stat().st_size > 0
