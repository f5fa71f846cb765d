"""Communication measured in a rank's profiler trace, not inferred: for each traced step, how long collectives ran,
how much of that no computation overlapped, how long computation ran, and how long neither did.

A step is torch.profiler's `ProfilerStep#<k>` range, from its start to the next step's start. With C the union of
the communication intervals in the step and P the union of the computation intervals:

    time_comm_s         |C|
    time_comm_exposed_s |C \\ P|            communication nothing computed beside
    time_compute_s      |P|
    time_idle_s         step - |C u P|     framework and Python time between operators
    comm_fraction       |C| / step

On CPU the timeline is the host's. Every operator (`cpu_op`) on any thread is computation, except the calls of
collectives (`c10d::*`, the functional collectives and their waits, `record_param_comms`) and what runs inside
them, which are communication. So are gloo's own ranges (`gloo:all_reduce`, `gloo:send`, ...) where their thread
computes nothing: gloo runs a collective on a thread of its own, so that DDP's all-reduce of one bucket overlaps
the backward of the next, while a send or receive is a range on the thread that posted it, until it is waited
for (a blocking receive, in a pipeline, includes the wait for the stage that sends).
On a GPU the timeline is the device's: NCCL's kernels are communication, every other kernel, memory copy and
memory set computation, and a step starts with its first device activity (the profiler's `gpu_user_annotation`
copy of `ProfilerStep#<k>`). So communication that no NCCL kernel carries is not seen as such: gloo's on GPU
tensors (ranks sharing GPUs, `cluster.share_gpus`), which copies them to the host and reduces them there, shows as
copies (computation) and gaps (idle), and a rank whose backend is gloo on a GPU gets no breakdown
(`unmeasured_communication`); a collective NCCL ran with the copy engines instead of kernels would count as
computation too.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from suite.shared_names import TRACE_BREAKDOWN

Intervals = list[tuple[float, float]]

STEP = re.compile(r"ProfilerStep#\d+")
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "_c10d_functional", "record_param_comms")
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def union(intervals: Intervals) -> Intervals:
    """Sorted, disjoint intervals covering the same time."""
    merged: Intervals = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start:
            merged.append((start, end))
    return merged


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """The time of `a` outside `b`, both sorted and disjoint (as `union` returns them)."""
    out: Intervals = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def clip(intervals: Intervals, start: float, end: float) -> Intervals:
    """The parts of sorted, disjoint intervals that lie in [start, end]."""
    return [(max(s, start), min(e, end)) for s, e in intervals if e > start and s < end]


def length(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)


def step_breakdown(comm: Intervals, compute: Intervals, start: float, end: float) -> dict[str, float]:
    """The breakdown of the step [start, end] from the unions of communication and computation intervals."""
    comm, compute = clip(comm, start, end), clip(compute, start, end)
    step = end - start
    return {"time_step_s": step, "time_comm_s": length(comm), "time_comm_exposed_s": length(subtract(comm, compute)),
            "time_compute_s": length(compute), "time_idle_s": step - length(union(comm + compute)),
            "comm_fraction": length(comm) / step if step > 0 else 0.0}


def seconds(event: dict[str, Any]) -> tuple[float, float]:
    """An event's interval in seconds (traces count microseconds)."""
    return event["ts"] / 1e6, (event["ts"] + event.get("dur", 0)) / 1e6


def step_windows(events: list[dict[str, Any]], category: str) -> Intervals:
    """Each step from its start to the next step's start (the last one to its own end); a step's range may be
    split over several tracks (GPU streams)."""
    steps: dict[str, tuple[float, float]] = {}
    for e in events:
        if e.get("cat") == category and STEP.fullmatch(e["name"]):
            start, end = seconds(e)
            seen = steps.get(e["name"], (start, end))
            steps[e["name"]] = (min(start, seen[0]), max(end, seen[1]))
    ordered = sorted(steps.values())
    return [(start, ordered[i + 1][0] if i + 1 < len(ordered) else end) for i, (start, end) in enumerate(ordered)]


def host_intervals(events: list[dict[str, Any]]) -> tuple[Intervals, Intervals]:
    """Communication and computation on the host's threads (the CPU timeline)."""
    calls: dict[tuple, Intervals] = defaultdict(list)  # a collective's call, and what runs inside it
    pending: dict[tuple, Intervals] = defaultdict(list)  # gloo's ranges: from a collective's start to its end
    ops: dict[tuple, Intervals] = defaultdict(list)
    for e in events:
        thread = (e.get("pid"), e.get("tid"))
        if not e["name"].startswith(COMM_PREFIXES):
            if e.get("cat") == "cpu_op":
                ops[thread].append(seconds(e))
        elif e.get("cat") == "cpu_op":
            calls[thread].append(seconds(e))
        elif e.get("cat") == "user_annotation":
            pending[thread].append(seconds(e))
    comm: Intervals = []
    compute: Intervals = []
    for thread in ops.keys() | calls.keys() | pending.keys():
        called = union(calls[thread])
        busy = subtract(union(ops[thread]), called)
        compute += busy
        # A send or receive is a range on the thread that posted it, until it is waited for: the thread may
        # compute meanwhile, and only the rest is communication.
        comm += called + subtract(union(pending[thread]), busy)
    return union(comm), union(compute)


def device_intervals(events: list[dict[str, Any]]) -> tuple[Intervals, Intervals]:
    """Communication (NCCL's kernels) and computation (every other kernel, copy and set) on the GPU timeline."""
    comm: Intervals = []
    compute: Intervals = []
    for e in events:
        if e.get("cat") in DEVICE_WORK:
            (comm if "nccl" in e["name"].lower() else compute).append(seconds(e))
    return union(comm), union(compute)


def unmeasured_communication(backend: str, device_type: str) -> str | None:
    """Why the traces of ranks on `backend` and `device_type` cannot show their communication, or None."""
    if backend == "gloo" and device_type == "cuda":
        return ("gloo on GPU tensors copies them to the host and reduces them there: the device timeline shows its "
                "copies as computation and its waits as idle time")
    return None


def trace_events(path: Path) -> list[dict[str, Any]]:
    """The complete events ("ph": "X") of a Chrome trace file, gzip-compressed or not."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def breakdown(path: Path) -> dict[str, Any]:
    """A trace's breakdown: the metrics of TRACE_BREAKDOWN per traced step (times as means, `comm_fraction` over
    all traced time), and `steps`, each step's own, with its length `time_step_s`."""
    events = trace_events(path)
    on_device = any(e.get("cat") == "kernel" for e in events)
    comm, compute = device_intervals(events) if on_device else host_intervals(events)
    # A step's range reaches the GPU timeline only through the kernels it launched; where the profiler did not
    # correlate them (seen with DeepSpeed's engine on an H100), the step is its range on the host.
    windows = (on_device and step_windows(events, "gpu_user_annotation")) or step_windows(events, "user_annotation")
    if not windows:
        raise ValueError(f"{path.name} has no ProfilerStep ranges")
    steps = [step_breakdown(comm, compute, start, end) for start, end in windows]
    total = {key: sum(step[key] for step in steps) for key in ("time_step_s", *TRACE_BREAKDOWN)}
    means = {key: total[key] / len(steps) for key in TRACE_BREAKDOWN}
    means["comm_fraction"] = total["time_comm_s"] / total["time_step_s"] if total["time_step_s"] > 0 else 0.0
    return {**means, "steps": steps}
