"""The pieces every strategy's step time is composed of: compute, collectives overlapping compute,
point-to-point sends, and a flushed pipeline's schedule with its bubble.

Communication that overlaps compute is played out on two streams, one computing and one communicating,
each doing one thing at a time: what is left of the communication when the computation has finished is
the exposed part, the rest was hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from suite.profiling.profiles import LayerProfile


@dataclass(frozen=True)
class StepTime:
    """One training step of the slowest rank, in seconds, split by what the time was spent on."""

    compute: float  # forward and backward (recomputation included) on the critical path
    comm: float  # communication not hidden behind compute, and what the hidden slows compute by (step.OVERLAP_SLOWDOWN)
    bubble: float = 0.0  # pipeline fill and drain: the busiest device waiting
    optimizer: float = 0.0
    data: float = 0.0  # loading the batch
    sent: float = 0.0  # bytes the rank sends in collectives and sends, counted as suite.runtime.metrics counts them
    # the strategy's library beyond all of the above, measured on probes (suite.predict.library_overhead)
    library: float = 0.0
    fitted: float = 0.0  # what a correction fitted on measurements adds (suite.predict.correction); may be negative
    core_wait: float = 0.0  # ranks waiting for a core, where a CPU node's ranks outnumber what its cores run at once

    @property
    def total(self) -> float:
        return (self.compute + self.comm + self.bubble + self.optimizer + self.data + self.library + self.fitted
                + self.core_wait)


def forward_s(layers: Sequence[LayerProfile]) -> float:
    return sum(layer.forward_s for layer in layers)


def backward_s(layers: Sequence[LayerProfile]) -> float:
    return sum(layer.backward_s for layer in layers)


def checkpointed(layers: Sequence[LayerProfile], interval: int) -> list[bool]:
    """Which layers activation checkpointing every `interval`-th block wraps (the first layer, which reads the
    data, never; see suite.runtime.model_transforms)."""
    candidates = [i for i, layer in enumerate(layers) if layer.block and i > 0]
    chosen = {i for n, i in enumerate(candidates, 1) if interval and n % interval == 0}
    return [i in chosen for i in range(len(layers))]


def recompute_s(layers: Sequence[LayerProfile], interval: int) -> float:
    """The forward that checkpointed layers run again during backward."""
    return sum(layer.forward_s for layer, wrapped in zip(layers, checkpointed(layers, interval)) if wrapped)


def trailing_comm(ready: Sequence[float], comm: Sequence[float]) -> float:
    """When the last of a series of collectives ends, collective k starting once its data is ready (at
    `ready[k]`, e.g. a gradient bucket filled during backward) and the previous one has ended."""
    end = 0.0
    for at, seconds in zip(ready, comm):
        end = max(end, at) + seconds
    return end


def prefetched_compute(compute: Sequence[float], comm: Sequence[float]) -> list[float]:
    """When each of a series of computations ends, computation k waiting for collective k (its unit's
    parameters gathered) and collective k+1 issued when computation k starts (one unit prefetched ahead)."""
    comm_end = compute_end = 0.0
    ends = []
    for k, work in enumerate(compute):
        if k == 0:
            comm_end = comm[0]
        start = max(compute_end, comm_end)
        if k + 1 < len(comm):
            comm_end = max(comm_end, start) + comm[k + 1]
        compute_end = start + work
        ends.append(compute_end)
    return ends


def buckets(sizes: Sequence[float], cap: float, first_cap: float | None = None) -> list[list[int]]:
    """Consecutive items grouped into buckets that close once they hold `cap` bytes (the first one at
    `first_cap`), as DDP's reducer and Horovod's fusion buffers fill them; indices of each bucket."""
    groups: list[list[int]] = [[]]
    held = 0.0
    for i, size in enumerate(sizes):
        groups[-1].append(i)
        held += size
        limit = first_cap if first_cap is not None and len(groups) == 1 else cap
        if held >= limit and i + 1 < len(sizes):
            groups.append([])
            held = 0.0
    return [g for g in groups if g]


def bubble_fraction(stages: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Idle share of a balanced flushed pipeline's step: (p - 1) / (v m + p - 1) (GPipe, 1F1B; interleaved
    with v chunks per device)."""
    p, m, v = stages, micro_batches, virtual_stages
    return (p - 1) / (v * m + p - 1)


@dataclass(frozen=True)
class DeviceWork:
    """What one pipeline device does per micro-batch: its chunks' compute, and its sends on the way."""

    compute: float  # forward and backward of its chunks (recomputation included)
    sends: float  # activations out in forward, their gradients out in backward: seconds
    sent: float = 0.0  # and their bytes
    weight_grads: float = 0.0  # the part of its backward that computes its weights' gradients


def flushed_schedule(devices: Sequence[DeviceWork], micro_batches: int, virtual_stages: int = 1,
                     zero_bubble: bool = False) -> StepTime:
    """GPipe's and 1F1B's step (all micro-batches forward and backward, then a flush): the busiest device works
    m times, and the others' work fills and drains the pipeline around it (1 / v of it when each device holds
    v interleaved chunks). Sends are not hidden (torch's pipelining waits for them between chunks). A zero-bubble
    schedule runs the weights' gradients where 1F1B waits: Qi et al.'s ZB-H1 bubble, (p - 1)(T_F + T_B - T_W)
    against 1F1B's (p - 1)(T_F + T_B + T_W), T_B the inputs' gradients and T_W the weights'."""
    m = micro_batches
    per = [d.compute + d.sends for d in devices]
    busiest = max(range(len(devices)), key=per.__getitem__)
    waiting = [max(p - 2 * d.weight_grads, 0.0) if zero_bubble else p for p, d in zip(per, devices)]
    fill = (sum(waiting) - waiting[busiest]) / virtual_stages
    return StepTime(compute=m * devices[busiest].compute, comm=m * devices[busiest].sends, bubble=fill,
                    sent=m * devices[busiest].sent)


def balance(costs: Sequence[float], parts: int) -> list[int]:
    """Contiguous parts of nearly equal cost, as torchgpipe's balancer cuts them (its block-partition solver)."""
    from torchgpipe.balance import balance_cost

    return balance_cost([max(cost, 1e-9) for cost in costs], parts)
