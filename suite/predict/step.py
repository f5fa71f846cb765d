"""One training step's time per strategy family, composed from `costs` and read from the point's `Layout`.

Five families: replicated data parallelism (`single`, `ddp`, `horovod`), sharded data parallelism (`zero`
stages 1-3, `fsdp`), tensor parallelism (`megatron`), flushed pipelines (`gpipe`, `gpipe_dist`, `1f1b`,
interleaved or not) and the asynchronous pipeline (`pipedream`). Data-parallel replicas of a pipeline or of a
tensor-parallel group come from the layout (dp x pp, dp x tp). Two families also have Study J's equations as
the variant `study_j`: Eq. 5.1 for data parallelism and Eqs. 6.1 + 6.2 for pipelines.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from omegaconf import DictConfig

from suite.errors import ConfigError
from suite.layout import Layout, RankPosition
from suite.predict.costs import (
    DeviceWork,
    StepTime,
    backward_s,
    balance,
    buckets,
    checkpointed,
    flushed_schedule,
    forward_s,
    prefetched_compute,
    recompute_s,
    trailing_comm,
)
from suite.predict.links import LinkModel, sent_bytes
from suite.profiling.counted import ATTENTION_BACKWARD, CAUSAL_WORK
from suite.profiling.profiles import LayerProfile, Profile
from suite.runtime.model_transforms import checkpoint_interval
from suite.shared_names import HALF_PRECISIONS, Family
from suite.strategies.base import Sharding, Strategy

MIB = 2**20
# Of the compute a GPU runs while collectives run beside it (NCCL's kernels on SMs of their own, the memory bandwidth
# shared), the share it loses: 18.9% on average, 40.0% at most, over GPT and Llama models on 4 A100s, H100s, MI250s
# and MI210s (Lee et al. 2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
# Learning: Performance and Power Implications", arXiv:2507.03114, abstract).
OVERLAP_SLOWDOWN = 0.189
PARAM_BYTES = 4  # every network's parameters are fp32 (autocast computes in lower precision, it keeps them)
VARIANTS = ("suite", "study_j")


@dataclass(frozen=True)
class Workload:
    """What a step's cost is computed from."""

    cfg: DictConfig
    strategy: Strategy
    layout: Layout
    profile: Profile  # one rank's compute at its batch: a micro-batch in pipelines, the group's batch under tp
    data_s: float  # one rank loading its mini-batch
    links: LinkModel
    steps: int  # per epoch
    stages_overlap: bool  # torchgpipe's stages in one process run at once (GPUs), not in turn (CPU: one thread)
    worker_forward_slowdown: float = 1.0  # of a forward on torchgpipe's CPU worker thread (`WorkerThreadProfile`)
    data_overlaps: bool = False  # loader processes make the next batches while a GPU computes this one
    # A CPU node's ranks over those its cores run at once (cores / a rank's threads) where more, for a pipeline
    # across processes, whose profile is then taken at the speed of as many ranks as run at once (`shared_cores`).
    oversubscription: float = 1.0
    # Collectives overlapping compute are hidden by it: they run on a GPU's own engines. A CPU rank's collectives
    # take the cores it computes on, so all of their time adds to the step (measured here: DDP's all-reduce of
    # ResNet-18's gradients added 1.2-2.8x its time alone to backward, on two ranks of one core each).
    comm_hides: bool = True

    @property
    def layers(self) -> tuple[LayerProfile, ...]:
        return self.profile.layers

    @cached_property
    def sharding(self) -> Sharding | None:
        """What a sharded strategy (ZeRO, FSDP) declares it shards, gathers and reduces (`Strategy.sharding`)."""
        return self.strategy.sharding(self.cfg)


def data_parallel(w: Workload, variant: str) -> StepTime:
    """single, ddp, horovod, axonn: every rank runs the whole network on its batch, gradients are all-reduced, in the
    last micro-batch's backward where gradients accumulate over several (the profile is of one micro-batch)."""
    layers, dp, micro = w.layers, w.layout.dp, w.layout.micro_batches
    interval = checkpoint_interval(w.cfg.activation_checkpointing)
    fwd, bwd = forward_s(layers), backward_s(layers) + recompute_s(layers, interval)
    grads = w.profile.param_bytes * reduced_gradient_share(w)
    comm = sent = 0.0
    sync = w.strategy.gradient_sync(dp)
    if dp > 1:
        sent = sent_bytes("all_reduce", grads, dp)
        if sync.buffers_each_forward:  # in every micro-batch's forward
            sent += micro * sent_bytes("broadcast", w.profile.buffer_bytes, dp)
    if dp > 1 and variant == "study_j":
        fused = min(grads, sync.bucket_bytes) if sync.bucket_bytes else grads  # AxoNN: no fusion
        comm = 2 * (dp - 1) * w.links.send(fused / dp)  # Eq. 5.1's ring, every step on the calibrated link
    elif dp > 1:
        comm = _overlapped_all_reduce(w, bwd, grads / max(w.profile.param_bytes, 1)) + micro * _buffer_broadcast(w)
    return StepTime(compute=micro * (fwd + bwd), comm=comm, optimizer=w.profile.optimizer_s, data=w.data_s,
                    sent=sent)


def reduced_gradient_share(w: Workload) -> float:
    """The share of the fp32 gradients' bytes a data-parallel all-reduce sends: half where they are compressed to 16
    bits (`grad_compression`) or where the point's framework reduces them in its half-precision parameters' dtype
    (conf/framework/, `gradient_reduction`: Megatron-LM under --fp16), else all of them (the suite's fp32 gradients
    under autocast)."""
    halves = w.cfg.framework.get("gradient_reduction", {}).get("half_in", [])
    return 0.5 if w.cfg.grad_compression.name in ("fp16", "bf16") or w.cfg.precision in halves else 1.0


def _grads_in_backward_order(w: Workload, ways: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
    """Each layer's gradient bytes and when backward has produced them, last layer first; a layer split `ways[i]`
    ways (tensor parallelism) holds and computes 1/ways[i] of it."""
    interval = checkpoint_interval(w.cfg.activation_checkpointing)
    layers = list(w.layers)
    wrapped = checkpointed(layers, interval)
    ways = ways or [1] * len(layers)
    ready, sizes, clock = [], [], 0.0
    for layer, again, split in zip(reversed(layers), reversed(wrapped), reversed(ways)):
        clock += (layer.backward_s + (layer.forward_s if again else 0.0)) / split
        ready.append(clock)
        sizes.append(layer.param_bytes / split)
    return sizes, ready


def _filled_buckets(sizes: list[float], ready: list[float], cap: float,
                    first_cap: float | None = None) -> tuple[list[float], list[float]]:
    """Gradients in backward order (`_grads_in_backward_order`) in buckets closed once they hold `cap` bytes (see
    `buckets`): each bucket's bytes and when its last gradient is ready."""
    groups = buckets(sizes, cap, first_cap)
    return [sum(sizes[i] for i in g) for g in groups], [ready[g[-1]] for g in groups]


def _exposed_reduction(w: Workload, kind: str, ranks: int, sizes: list[float], starts: list[float],
                       backward: float, stride: int = 1) -> float:
    """Buckets of gradients reduced by `kind` collectives among `ranks` (`stride` apart) on a stream of their own,
    each one issued once it is ready (`starts`) and the previous one has ended, while backward runs on: what ends
    after backward is exposed (all of it where compute does not hide it)."""
    comm = [w.links.collective(kind, n, ranks, stride) for n in sizes]
    if not w.comm_hides:
        return sum(comm)
    exposed = max(trailing_comm(starts, comm) - backward, 0.0)
    return exposed + hidden_cost(sum(comm), exposed)


def hidden_cost(issued: float, exposed: float) -> float:
    """What the compute that `issued` seconds of collectives ran beside loses to them (`OVERLAP_SLOWDOWN`), all but
    the `exposed` seconds having run beside it."""
    return OVERLAP_SLOWDOWN * max(issued - exposed, 0.0)


def _overlapped_all_reduce(w: Workload, backward: float, shrink: float) -> float:
    """DDP's buckets (`bucket_cap_mb`, the first one at 1 MiB; compressed by `shrink`) or Horovod's fusion
    buffers (up to `fusion_threshold_mb` of what is ready at each `cycle_time_ms` tick) all-reduced while
    backward runs on; what ends after backward is exposed (all of it where compute does not hide it). AxoNN's
    all-reduces, one per layer's gradients here (one per tensor in fact), all follow backward."""
    sizes, ready = _grads_in_backward_order(w)
    sync = w.strategy.gradient_sync(w.layout.dp)
    if sync.after_backward:
        return sum(w.links.collective("all_reduce", n * shrink, w.layout.dp) for n in sizes if n)
    if sync.cycle_s:
        cycle = sync.cycle_s
        ticks = [math.ceil(at / cycle) * cycle for at in ready]
        cap = sync.bucket_bytes or 1.0
        groups = []
        for tick in sorted(set(ticks)):
            same = [i for i, t in enumerate(ticks) if t == tick]
            groups += [[same[i] for i in group] for group in buckets([sizes[i] for i in same], cap)]
        fused, starts = [sum(sizes[i] for i in g) for g in groups], [ticks[g[0]] for g in groups]
    else:
        fused, starts = _filled_buckets([s * shrink for s in sizes], ready, sync.bucket_bytes, sync.first_bucket_bytes)
    return _exposed_reduction(w, "all_reduce", w.layout.dp, fused, starts, backward)


def _buffer_broadcast(w: Workload) -> float:
    """DDP broadcasts rank 0's buffers (BatchNorm statistics) before every forward."""
    if not w.strategy.gradient_sync(w.layout.dp).buffers_each_forward:
        return 0.0
    return w.links.collective("broadcast", w.profile.buffer_bytes, w.layout.dp)


def tp_kept(layer: LayerProfile, tp: int, precision: str, sequence_parallel: bool) -> float:
    """The bytes one of `tp` ranks that split `layer` keeps for backward. A transformer block's LayerNorm inputs (the
    residual stream, fp32 under autocast: two tensors the size of its output) and its column-parallel linears'
    inputs (the LayerNorms' outputs, in the compute dtype) stay whole on every rank (Korthikanti et al. 2022, Sec.
    4.2.2: the 10 s b h of sbh(10 + 24/t + 5as/(ht))); sequence parallelism splits the LayerNorms' along the
    sequence, and the linears' inputs, all-gathered, are kept whole as torch's tensor parallelism keeps them
    (Megatron-LM keeps its slice and gathers it again in backward). The rest of a block, and any other split layer's
    activations, split `tp` ways."""
    if not layer.block or tp == 1:
        return layer.saved_bytes / tp
    linear_inputs = 2 * layer.output_bytes * (0.5 if precision in HALF_PRECISIONS else 1.0)
    whole = min(linear_inputs + (0 if sequence_parallel else 2 * layer.output_bytes), layer.saved_bytes)
    return whole + (layer.saved_bytes - whole) / tp


def split_seconds(layer: LayerProfile, tp: int, sequence_parallel: bool) -> tuple[float, float]:
    """The forward and backward seconds of one of `tp` ranks that split `layer` as Megatron-LM splits a block: its
    kernels on the residual stream alone (its norms, the dropouts and bias adds after the row-parallel linears, the
    residual adds: `stream_*_s`) run whole on every rank (Shoeybi et al. 2019, Fig. 3: "the layer normalization
    ... and dropout ... are duplicated across the GPUs"; Korthikanti et al. 2022, Sec. 4.2.2), unless sequence
    parallelism splits them along the sequence; the rest, 1/tp each."""
    if tp == 1 or sequence_parallel:
        return layer.forward_s / tp, layer.backward_s / tp
    whole_f, whole_b = layer.stream_forward_s, layer.stream_backward_s
    return whole_f + (layer.forward_s - whole_f) / tp, whole_b + (layer.backward_s - whole_b) / tp


def tensor_split(w: Workload) -> Workload:
    """The workload of one of the `tp` ranks that split every layer of the network (FSDP x TP: the blocks as megatron
    splits them, the embedding and head by vocabulary): 1/tp of each layer's time (a block's residual stream whole:
    `split_seconds`), FLOPs, parameters and kept activations, and of the optimizer's step and states; each layer's
    output, which the group holds whole, as it is (and what a block keeps whole, `tp_kept`). The split layers'
    collectives are not in it (`split_block_collectives`, `vocab_collectives`)."""
    tp, sequence_parallel = w.layout.tp, getattr(w.strategy, "sequence_parallel", False)
    layers = []
    for layer in w.layers:
        forward_s, backward_s = split_seconds(layer, tp, sequence_parallel)
        layers.append(replace(layer, forward_s=forward_s, backward_s=backward_s,
                              forward_flops=layer.forward_flops // tp, backward_flops=layer.backward_flops // tp,
                              saved_bytes=int(tp_kept(layer, tp, w.cfg.precision, sequence_parallel)),
                              param_bytes=layer.param_bytes // tp, tied_bytes=layer.tied_bytes // tp))
    p = w.profile
    profile = replace(p, layers=tuple(layers), optimizer_s=p.optimizer_s / tp,
                      optimizer_state_bytes=p.optimizer_state_bytes // tp, train_bytes=p.train_bytes // tp)
    return replace(w, profile=profile)


def gathered_keys_values(w: Workload) -> float:
    """Bytes of one block's keys and values over the whole sequence for a rank's batch, in the compute dtype: what
    a context-parallel rank gathers in each block (suite.strategies.context_parallel)."""
    net = w.cfg.network
    width = net.n_embd // net.n_head * net.n_kv_head
    return 2 * w.profile.batch * w.cfg.dataset.seq_len * width * (2 if w.cfg.precision in HALF_PRECISIONS else 4)


def context_split(w: Workload) -> Workload:
    """The workload of one of the `cp` ranks that split every sequence (fsdp, megatron): 1/cp of each layer's tokens,
    hence of its time, FLOPs and activations, except attention, whose 1/cp of the queries read every key: its
    cores (`core_forward_s`; backward `ATTENTION_BACKWARD` times it) compute their whole (queries x keys) block under
    a mask, not the causal share a causal kernel computes (`CAUSAL_WORK`), and keep the whole sequence's keys and
    values (each query head's, repeated: two tensors the size of the block's output in the compute dtype) beside
    the rest's 1/cp. A framework whose context parallelism is torch's ring attention (`context_parallel.attention:
    causal`, torchtitan's) computes the causal share. The exchanges are not in it (`context_collectives`)."""
    cp = w.layout.cp
    half = w.cfg.precision in HALF_PRECISIONS
    masked = w.cfg.framework.context_parallel.attention == "masked"  # else causal: torch's ring attention's
    layers = []
    for layer in w.layers:
        core = layer.core_forward_s * (1 / CAUSAL_WORK - 1) if masked else 0.0  # what a masked core adds
        keys_values = 2 * layer.output_bytes * (0.5 if half else 1.0) * (cp - 1) if layer.core_forward_s else 0
        layers.append(replace(layer, forward_s=(layer.forward_s + core) / cp,
                              backward_s=(layer.backward_s + ATTENTION_BACKWARD * core) / cp,
                              forward_flops=layer.forward_flops // cp, backward_flops=layer.backward_flops // cp,
                              saved_bytes=int((layer.saved_bytes + keys_values) / cp),
                              output_bytes=layer.output_bytes // cp, op_kept_bytes=layer.op_kept_bytes // cp,
                              op_recomputed_s=layer.op_recomputed_s / cp, stream_forward_s=layer.stream_forward_s / cp,
                              stream_backward_s=layer.stream_backward_s / cp))
    p = w.profile
    train_bytes = (2 * p.param_bytes + p.optimizer_state_bytes + sum(layer.saved_bytes for layer in layers)
                   + p.workspace_bytes // cp)
    profile = replace(p, layers=tuple(layers), input_bytes=p.input_bytes // cp, train_bytes=train_bytes)
    return replace(w, profile=profile)


def context_collectives(w: Workload) -> list[tuple[str, float, int, int]]:
    """The collectives of a step's blocks over the layout's `cp` ranks (`tp` apart): each block's keys and values
    all-gathered in forward (again in a recomputed forward) and their gradients reduce-scattered in backward."""
    blocks = sum(layer.block for layer in w.layers)
    recomputed = sum(checkpointed(list(w.layers), checkpoint_interval(w.cfg.activation_checkpointing)))
    kv, cp, tp = gathered_keys_values(w), w.layout.cp, w.layout.tp
    return [("all_gather", kv, cp, tp)] * (blocks + recomputed) + [("reduce_scatter", kv, cp, tp)] * blocks


def sharded(w: Workload, variant: str) -> StepTime:
    """FSDP over tensor-parallel groups (`tp > 1`) is one tp rank's share of the network (`tensor_split`) sharded
    over the replicas, with the split layers' collectives in every micro-batch on the critical path; the rest is
    `_sharded`."""
    if w.layout.tp == 1:
        return _sharded(w, variant)
    split = _sharded(tensor_split(w), variant)
    blocks = [layer for layer in w.layers if layer.block]
    recomputed = sum(checkpointed(list(w.layers), checkpoint_interval(w.cfg.activation_checkpointing)))
    collectives = (split_block_collectives(w, len(blocks), recomputed, blocks[0].output_bytes)
                   + vocab_collectives(w, blocks[0].output_bytes, embedding=True, head=True))
    return with_collectives(w, split, collectives)


def with_collectives(w: Workload, step: StepTime, collectives: list[tuple]) -> StepTime:
    """`step` with `collectives` (kind, bytes, ranks[, stride]) on the critical path of every micro-batch."""
    micro = w.layout.micro_batches
    return replace(step, compute=step.compute + micro * sum(w.links.collective(*c) for c in collectives),
                   sent=step.sent + micro * sum(sent_bytes(*c[:3]) for c in collectives))


def _sharded(w: Workload, variant: str) -> StepTime:
    """zero 1/2: gradients reduced in buckets of `reduce_bucket_size` elements as backward fills them (reduce-
    scattered with `reduce_scatter`, else all-reduced), behind backward with `overlap_comm`, else after it; updated
    parameters all-gathered after the step, the optimizer steps 1/shard of them. zero 3 and fsdp: each unit's
    parameters gathered just before it runs (one unit prefetched ahead; FSDP's root unit, the layers that are not
    blocks, first), gradients reduce-scattered per unit as backward produces them, on a stream of their own; with
    gradient accumulation (FSDP, ZeRO-3) all of it for every micro-batch; ZeRO-2 reduces into its partitions every
    micro-batch, ZeRO-1 only in the last one's backward (DeepSpeed's `reduce_ready_partitions_and_remove_grads`).
    Parameters are gathered again for backward by FSDP with `reshard_after_forward` (its blocks; the root stays
    gathered), and by ZeRO-3 only for a network larger than its reuse distance (`stage3_max_reuse_distance`): below
    it DeepSpeed keeps what it gathered in forward for backward. ZeRO-3 never gathers a layer smaller than
    `stage3_param_persistence_threshold` (it holds it whole, all-gathered after the step). FSDP in bf16 or fp16
    gathers half-precision parameters (its `param_dtype`: half the bytes) and reduce-scatters fp32 gradients."""
    layers, shard = w.layers, w.layout.shard
    interval = checkpoint_interval(w.cfg.activation_checkpointing)
    fwd, bwd = forward_s(layers), backward_s(layers) + recompute_s(layers, interval)
    params = w.profile.param_bytes
    optimizer = w.profile.optimizer_s / shard
    micro = w.layout.micro_batches
    sharding = w.sharding
    if sharding.stage < 3:
        comm, sent = _zero_reduction(w, bwd)
        reductions = micro if sharding.stage == 2 else 1
        comm = reductions * comm + w.links.collective("all_gather", params, shard, w.layout.tp)
        sent = reductions * sent + sent_bytes("all_gather", params, shard)
        return StepTime(compute=micro * (fwd + bwd), comm=comm, optimizer=optimizer, data=w.data_s, sent=sent)
    regather = regathers(w)
    threshold = sharding.persistence_elements * PARAM_BYTES
    persistent = [layer.param_bytes < threshold for layer in layers]
    gathers = [0.0 if kept else layer.param_bytes * sharding.gathered_share for layer, kept in zip(layers, persistent)]
    root = sum(n for layer, n in zip(layers, gathers) if not layer.block)
    units = [n if layer.block else 0.0 for layer, n in zip(layers, gathers)]
    gathered = [w.links.collective("all_gather", n, shard, w.layout.tp) for n in units]
    gathered[0] += w.links.collective("all_gather", root, shard, w.layout.tp)
    fwd_end = prefetched_compute([layer.forward_s for layer in layers], gathered)[-1]
    back = list(reversed(layers))
    wrapped = list(reversed(checkpointed(list(layers), interval)))
    back_compute = [layer.backward_s + (layer.forward_s if again else 0.0) for layer, again in zip(back, wrapped)]
    regathered = list(reversed(units)) if regather else [0.0] * len(units)
    regathered[-1] += root if regather and sharding.regathers_root else 0.0
    regathered_s = [w.links.collective("all_gather", n, shard, w.layout.tp) for n in regathered]
    ends = prefetched_compute(back_compute, regathered_s)
    scattered = [layer.param_bytes if layer.block else 0 for layer in back]
    scattered[-1] += sum(layer.param_bytes for layer in layers if not layer.block)  # the root's, with the first unit
    scattered_s = [w.links.collective("reduce_scatter", n, shard, w.layout.tp) for n in scattered]
    tail = max(trailing_comm(ends, scattered_s) - ends[-1], 0)
    kept_whole = sum(layer.param_bytes for layer, kept in zip(layers, persistent) if kept)
    after_step = w.links.collective("all_gather", kept_whole, shard, w.layout.tp)
    sent = sum(sent_bytes("all_gather", n, shard) for n in (*units, root, *regathered))
    sent += sum(sent_bytes("reduce_scatter", n, shard) for n in scattered)
    if w.comm_hides:
        comm = (fwd_end - fwd) + (ends[-1] - bwd) + tail
        comm += hidden_cost(sum(gathered + regathered_s + scattered_s), comm)
    else:
        comm = sum(gathered + regathered_s + scattered_s)
    return StepTime(compute=micro * (fwd + bwd), comm=micro * comm + after_step, optimizer=optimizer, data=w.data_s,
                    sent=micro * sent + sent_bytes("all_gather", kept_whole, shard))


def _zero_reduction(w: Workload, backward: float) -> tuple[float, float]:
    """(exposed seconds, bytes sent) of ZeRO-1/2's gradient reduction: DeepSpeed fills its buckets parameter by
    parameter (a layer's `param_tensors` taken as equal here), reducing each bucket once it holds
    `reduce_bucket_size` elements; with `overlap_comm` on a stream of its own while backward runs on, without it
    all of it adds to the step."""
    sharding = w.sharding
    kind = "reduce_scatter" if sharding.reduce_scatter else "all_reduce"
    sizes, ready = _grads_in_backward_order(w)
    tensors = [max(layer.param_tensors, 1) for layer in reversed(w.layers)]
    pieces = [size / n for size, n in zip(sizes, tensors) for _ in range(n)]
    pieces_ready = [at for at, n in zip(ready, tensors) for _ in range(n)]
    bucketed, starts = _filled_buckets(pieces, pieces_ready, sharding.bucket_elements * PARAM_BYTES)
    if not sharding.overlap_comm:
        starts = [backward] * len(starts)
    comm = _exposed_reduction(w, kind, w.layout.shard, bucketed, starts, backward)
    return comm, sum(sent_bytes(kind, n, w.layout.shard) for n in bucketed)


def regathers(w: Workload) -> bool:
    """Whether ZeRO-3 or FSDP gathers the parameters again for backward (see `sharded`)."""
    if w.sharding.regathers is not None:
        return w.sharding.regathers
    return w.profile.param_bytes // PARAM_BYTES > w.sharding.max_reuse_elements


def tensor_parallel(w: Workload, variant: str) -> StepTime:
    """megatron: each block's matrices split over `tp` ranks (its compute / tp, its residual stream whole without
    sequence parallelism: `split_seconds`), two all-reduces of the block's
    activations in forward and two in backward (a reduce-scatter and an all-gather each under sequence
    parallelism). With `vocab_parallel` the embedding and head split too: the embedding's output all-reduced in
    forward, the head's input gradient in backward (under sequence parallelism the head's input all-gathered in
    forward and its gradient reduce-scattered), and the loss on the split logits, which are never gathered: three
    all-reduces of one fp32 value per token (the max, the sum of exponentials, the target's logit). Replicas
    all-reduce their shard's gradients after backward, or with `overlap_grad_reduce` in buckets of `bucket_size`
    elements while backward runs on. The batch reaches the group's ranks as a broadcast from its first rank.
    Checkpointed blocks run their split forward again in backward, its two collectives included. With gradient
    accumulation all of it but the replicas' reduction runs once per micro-batch (the profile is of one), the
    reduction in the last one's backward."""
    tp, dp, layers = w.layout.tp, w.layout.dp * w.layout.cp, w.layers  # gradients averaged over context ranks too
    vocab = w.strategy.vocab_parallel
    split = [layer.block or vocab for layer in layers]
    ways = [tp if s else 1 for s in split]
    again = checkpointed(list(layers), checkpoint_interval(w.cfg.activation_checkpointing))
    seconds = [split_seconds(layer, n, w.strategy.sequence_parallel) for layer, n in zip(layers, ways)]
    fwd = sum(f for f, _ in seconds)
    bwd = sum(b + (f if a else 0) for (f, b), a in zip(seconds, again))
    blocks = [layer for layer in layers if layer.block]
    activation = blocks[0].output_bytes
    collectives = split_block_collectives(w, len(blocks), sum(again), activation)
    if vocab:
        collectives += vocab_collectives(w, activation, embedding=True, head=True)
    micro = w.layout.micro_batches
    collectives *= micro
    if tp > 1:  # the group's first rank broadcasts the step's batch: its shape, then int64 inputs and targets
        tokens = micro * w.profile.batch * w.cfg.dataset.seq_len
        collectives += [("broadcast", 16, tp), ("broadcast", 2 * tokens * 8, tp)]
    held = sum(layer.param_bytes / n for layer, n in zip(layers, ways))
    share = reduced_gradient_share(w)
    comm = sum(w.links.collective(*c) for c in collectives)
    sent = sum(sent_bytes(*c) for c in collectives) + sent_bytes("all_reduce", held * share, dp)  # bucketed or not
    cap = w.strategy.gradient_sync(dp).bucket_bytes
    if cap and dp > 1:
        sizes, ready = _grads_in_backward_order(w, ways)
        reduced = [n * share for n in sizes]
        comm += _exposed_reduction(w, "all_reduce", dp, *_filled_buckets(reduced, ready, cap), bwd, stride=tp)
    else:
        comm += w.links.collective("all_reduce", held * share, dp, tp)
    optimizer = w.profile.optimizer_s * held / max(w.profile.param_bytes, 1)
    return StepTime(compute=micro * (fwd + bwd), comm=comm, optimizer=optimizer, data=w.data_s, sent=sent)


def split_block_collectives(w: Workload, blocks: int, recomputed: int,
                            activation: float) -> list[tuple[str, float, int]]:
    """The collectives of `blocks` GPT-2 blocks split over the layout's `tp` ranks, `recomputed` of them checkpointed,
    for a batch whose block output is `activation` bytes: two in each block's forward and two in its backward (all-
    reduces, or under sequence parallelism a reduce-scatter and an all-gather each); a checkpointed block's forward
    runs twice. What is reduced is a row-parallel layer's output (or its input's gradient), in the compute dtype
    under autocast; what is gathered, a LayerNorm's output (or its input's gradient), in fp32."""
    reduced = activation * (0.5 if w.cfg.precision in HALF_PRECISIONS else 1.0)
    kinds = ((("reduce_scatter", reduced), ("all_gather", activation))
             if getattr(w.strategy, "sequence_parallel", False) else (("all_reduce", reduced),))
    return [(kind, n, w.layout.tp) for kind, n in kinds] * (4 * blocks + 2 * recomputed)


def vocab_collectives(w: Workload, activation: float, embedding: bool, head: bool) -> list[tuple[str, float, int]]:
    """The collectives of the embedding and the head split by vocabulary over the layout's `tp` ranks: the
    embedding's output all-reduced in forward, the head's input gradient in backward (under sequence parallelism
    the head's input all-gathered in forward and its gradient reduce-scattered), and the loss on the split logits,
    which are never gathered: three all-reduces of one fp32 value per token (the max, the sum of exponentials, the
    target's logit)."""
    tp = w.layout.tp
    out = [("all_reduce", activation, tp)] if embedding else []
    if head:
        per_token = w.profile.batch * w.cfg.dataset.seq_len * 4
        sequence_parallel = getattr(w.strategy, "sequence_parallel", False)
        out += [(kind, activation, tp) for kind in (("all_gather", "reduce_scatter") if sequence_parallel
                                                    else ("all_reduce",))]
        out += [("all_reduce", per_token, tp)] * 3
    return out


def stage_sizes(w: Workload) -> list[int]:
    """Layers per pipeline chunk, as the strategy's `balance` cuts them: an explicit list, equal parameter
    counts, or equal measured time (torchgpipe's balancer, here on the profile's times); unless the point's framework
    partitions its pipelines by a rule of its own (conf/framework/, `pipeline_partition`: `framework_partition`)."""
    chunks = w.layout.pp * w.layout.virtual_stages
    knob = w.strategy.balance
    if not isinstance(knob, str):
        return list(knob)
    rule = (w.cfg.framework.get("pipeline_partition") or {}).get("rule")
    if rule:
        return framework_partition(rule, [layer.block for layer in w.layers], chunks)
    if knob == "by_params":
        return balance([max((layer.param_bytes + layer.tied_bytes) // PARAM_BYTES, 1) for layer in w.layers], chunks)
    return balance([layer.forward_s + layer.backward_s for layer in w.layers], chunks)


EQUAL_BLOCKS = "equal_blocks"  # Megatron-LM: num_layers / chunks blocks each, the embedding first, the head last
EQUAL_LAYERS = "equal_layers"  # DeepSpeed's partition_method "type:transformer|embedding": ends counted as blocks


def framework_partition(rule: str, blocks: list[bool], chunks: int) -> list[int]:
    """Layers per chunk of a network whose layers are `blocks` (True) or its ends (the embedding before them, the
    head after), as a framework cuts them: `equal_blocks`, the same number of blocks in every chunk (Megatron-LM,
    which refuses a count that does not divide), the layers before the first block with the first chunk and those
    after the last with the last; `equal_layers`, every layer counted alike, the chunks filled in turn with
    ceil(layers / chunks) each, the last with what is left (DeepSpeed's `partition_balanced` on equal weights: the
    smallest bottleneck, filled from the front)."""
    if rule == EQUAL_LAYERS:
        most = -(-len(blocks) // chunks)
        if most * (chunks - 1) >= len(blocks):
            raise ConfigError(f"{len(blocks)} layers in chunks of {most} leave a pipeline chunk of {chunks} empty "
                              f"({EQUAL_LAYERS})")
        return [most] * (chunks - 1) + [len(blocks) - most * (chunks - 1)]
    if rule != EQUAL_BLOCKS:
        raise ConfigError(f"pipeline_partition.rule={rule} is not one of {EQUAL_BLOCKS}, {EQUAL_LAYERS}")
    count = sum(blocks)
    if count % chunks:
        raise ConfigError(f"{count} blocks do not split evenly into {chunks} pipeline chunks, as the framework's "
                          f"pipelines split them ({EQUAL_BLOCKS})")
    sizes = [count // chunks] * chunks
    sizes[0] += blocks.index(True)
    sizes[-1] += blocks[::-1].index(True)
    return sizes


@dataclass(frozen=True)
class Chunk:
    layers: tuple[LayerProfile, ...]
    input_bytes: int  # the previous chunk's output, received per micro-batch (its gradient goes back)
    first: bool
    last: bool
    checkpointed: tuple[bool, ...]  # per layer: activation checkpointing wraps it (counted over the whole network)
    tp: int = 1  # ranks that split its layers (a 3D layout's tensor parallelism: blocks, embedding, head)
    sends: tuple[bool, bool] = (True, True)  # whether its output goes to another device; its input comes from one
    input_layer: LayerProfile | None = None  # whose output it receives (None: the network's input)

    @property
    def params(self) -> float:
        """Parameter bytes one of the chunk's ranks holds: a tied weight on another stage is a copy of its own."""
        held = sum(layer.param_bytes for layer in self.layers)
        return (held + (sum(layer.tied_bytes for layer in self.layers) if not self.first else 0)) / self.tp


def chunks(w: Workload) -> list[Chunk]:
    sizes = stage_sizes(w)
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    last = len(sizes) - 1
    inputs = [w.profile.input_bytes, *(layer.output_bytes for layer in w.layers)]
    wrapped = checkpointed(list(w.layers), checkpoint_interval(w.cfg.activation_checkpointing))
    device = w.layout.chunk_stage
    return [Chunk(tuple(w.layers[a:b]), inputs[a], i == 0, i == last, tuple(wrapped[a:b]), w.layout.tp,
                  (i < last and device(i + 1) != device(i), i > 0 and device(i - 1) != device(i)),
                  w.layers[a - 1] if a else None)
            for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def _chunk_work(w: Workload, chunk: Chunk, recompute: float) -> DeviceWork:
    """A chunk's compute per micro-batch and its sends to other devices (not to a chunk of its own device, as in a
    V): its output forward, its input's gradient backward (by each of its stage's tensor-parallel ranks at once,
    whole, or under sequence parallelism each its slice of the sequence). `recompute`: the share of micro-batches
    whose whole forward torchgpipe runs again; checkpointed blocks run theirs again in every micro-batch's backward.
    Layers split over tp ranks (blocks as megatron splits them, the embedding and head by vocabulary) compute 1/tp
    of their work (a block's residual stream whole: `split_seconds`) and wait for their collectives."""
    output, received = chunk.sends
    boundaries = ([chunk.layers[-1]] if output else []) + ([chunk.input_layer] if received else [])
    sizes, gathers = pipeline_sends(w, boundaries, chunk.tp)
    seconds = [split_seconds(layer, chunk.tp, getattr(w.strategy, "sequence_parallel", False))
               for layer in chunk.layers]
    again = sum(f for (f, _), wrapped in zip(seconds, chunk.checkpointed) if wrapped)
    compute = again + sum(f * (1 + recompute) + b for f, b in seconds)
    split = []
    if chunk.tp > 1:
        blocks = [wrapped for layer, wrapped in zip(chunk.layers, chunk.checkpointed) if layer.block]
        activation = next(layer.output_bytes for layer in w.layers if layer.block)
        split = (split_block_collectives(w, len(blocks), sum(blocks), activation)
                 + vocab_collectives(w, activation, chunk.first, chunk.last) + gathers)
    compute += sum(w.links.collective(*c) for c in split)
    return DeviceWork(compute, sum(w.links.send(n, chunk.tp) for n in sizes),
                      sum(sizes) + sum(sent_bytes(*c) for c in split),
                      sum(map(weight_gradient_s, chunk.layers)) / chunk.tp)


def pipeline_sends(w: Workload, boundaries: list[LayerProfile], tp: int) -> tuple[list[float], list[tuple]]:
    """The bytes one of a stage's tp ranks sends per micro-batch across each of its `boundaries` (the layer whose
    output crosses it: forward its output, backward its gradient), and the collectives its ranks run on what they
    receive, as the point's framework sends (conf/framework/, `pipeline_sends`): the output as computed, whole from
    every tp rank (the suite's; its slice of the sequence under sequence parallelism), or Megatron-LM's 1/tp of it
    from each, in half precision, all-gathered over the tp ranks that receive it."""
    sends = w.cfg.framework.get("pipeline_sends") or {}
    half = sends.get("dtype") == "half" and w.cfg.precision in HALF_PRECISIONS
    scattered = bool(sends.get("split_over_tp")) and tp > 1
    split = tp if scattered or getattr(w.strategy, "sequence_parallel", False) else 1
    whole = [2 * layer.output_elements if half and layer.output_elements else layer.output_bytes
             for layer in boundaries]
    return [n / split for n in whole], [("all_gather", n, tp) for n in whole] if scattered else []


def weight_gradient_s(layer: LayerProfile) -> float:
    """The part of a layer's backward that computes its weights' gradients: a GEMM's weight gradient costs its
    forward, so the share of the backward's FLOPs its forward's are (at most half: the inputs' gradient costs as
    much again; attention and elementwise work, which no weight takes part in, count on the inputs' side only
    where they make the forward smaller than half the backward)."""
    if not layer.param_bytes or not layer.backward_flops:
        return 0.0
    return layer.backward_s * min(layer.forward_flops / layer.backward_flops, 0.5)


@dataclass(frozen=True)
class Device:
    work: DeviceWork  # per micro-batch
    params: int  # bytes it holds


def devices(w: Workload, recompute: float = 0.0) -> list[Device]:
    """Per pipeline device: its chunks' work per micro-batch and the parameter bytes it holds."""
    p, all_chunks = w.layout.pp, chunks(w)
    out = []
    for d in range(p):
        mine = [all_chunks[c] for c in w.layout.stage_chunks(d)]
        work = [_chunk_work(w, c, recompute) for c in mine]
        out.append(Device(DeviceWork(*(sum(getattr(x, f) for x in work)
                                       for f in ("compute", "sends", "sent", "weight_grads"))),
                          sum(c.params for c in mine)))
    return out


def _stage_sync(w: Workload, device: Device, tied_ranks: int, stage: int = 0) -> tuple[float, float]:
    """(seconds, bytes sent) of a stage's gradient sync: an all-reduce over the replicas, one of a tied weight's
    copies among the stages that hold one, and where the framework shards the optimizer over the replicas
    (conf/framework/, `optimizer_sharding`: DeepSpeed's bf16 optimizer, ZeRO-1) the all-gather of the parameters
    each replica updated."""
    tied = sum(layer.tied_bytes for c in chunks(w) for layer in c.layers)
    layout = w.layout
    # ranks between two replicas of a stage (consecutive where stages are replicated unlike); of a stage
    replica, tp = 1 if layout.stage_replicas else layout.pp * layout.tp, layout.tp
    share = reduced_gradient_share(w)
    collectives = [("all_reduce", device.params * share, layout.stage_width(stage), replica),
                   ("all_reduce", tied * share, tied_ranks, max(w.layout.pp - 1, 1) * tp)]
    sharding = w.cfg.framework.get("optimizer_sharding")
    if sharding:  # the replicas' updated partitions gathered after the step (the profile's parameters are fp32)
        gathered = device.params * (0.5 if sharding.gathered == "half" else 1.0)
        collectives.append(("all_gather", gathered, layout.stage_width(stage), replica))
    return (sum(w.links.collective(*c) for c in collectives),
            sum(sent_bytes(kind, n, ranks) for kind, n, ranks, _ in collectives))


def optimizer_shards(w: Workload, stage: int = 0) -> int:
    """Over how many ranks a pipeline stage's optimizer is split: its replicas where the framework shards it
    (conf/framework/, `optimizer_sharding`: each steps its partition, then gathers, `_stage_sync`), else 1."""
    return w.layout.stage_width(stage) if w.cfg.framework.get("optimizer_sharding") else 1


def optimizer_per_byte(w: Workload, stage: int = 0) -> float:
    """Seconds of optimizer step per parameter byte a pipeline stage holds."""
    return w.profile.optimizer_s / max(w.profile.param_bytes, 1) / optimizer_shards(w, stage)


def flushed_pipeline(w: Workload, variant: str) -> StepTime:
    """gpipe, gpipe_dist, 1f1b: m micro-batches through p stages, then a flush, each stage's gradient sync and
    its optimizer step. torchgpipe's stages in one process on CPU share one worker thread: they run in turn, every
    micro-batch on every stage one after the other, with nothing to send; the forwards there run slower than on
    the caller, which runs backward and its recomputation."""
    m = w.layout.micro_batches
    if variant == "study_j":
        return _study_j_pipeline(w)
    stages = devices(w, w.strategy.recomputed_forward_share(w.layout))  # torchgpipe's `checkpoint`
    if w.layout.stages_in_one_process and not w.stages_overlap:
        work = m * (sum(d.work.compute for d in stages) + (w.worker_forward_slowdown - 1) * forward_s(w.layers))
        return StepTime(compute=work, comm=0.0, optimizer=w.profile.optimizer_s, data=w.data_s)
    schedule = flushed_schedule([d.work for d in stages], m, w.layout.virtual_stages, w.strategy.fills_bubble)
    tied_ranks = 2 if w.layout.pp > 1 else 1
    sync, sent = max(_stage_sync(w, d, tied_ranks) for d in stages)
    per_byte = optimizer_per_byte(w)
    step = StepTime(compute=schedule.compute, comm=schedule.comm + sync, bubble=schedule.bubble,
                    optimizer=max(per_byte * d.params for d in stages), data=w.data_s, sent=schedule.sent + sent)
    return shared_cores(w, step, [m * d.work.compute + per_byte * d.params for d in stages])


def shared_cores(w: Workload, step: StepTime, work: list[float]) -> StepTime:
    """A pipeline whose CPU node has more ranks than its cores run at once: its stages compute in turn as much as
    together (a rank blocked in a receive takes no core), so each is priced at the speed of as many ranks as run
    at once, and the step lasts at least the node's compute shared out among its cores, the stages' mean `work`
    per step times the oversubscription; what that adds is the ranks' wait for a core."""
    if w.oversubscription <= 1:
        return step
    return replace(step, core_wait=max(0.0, statistics.mean(work) * w.oversubscription - step.total))


def _study_j_pipeline(w: Workload) -> StepTime:
    """Study J's Eqs. 6.1 and 6.2 per mini-batch: T_comp = T_seq(mb) (W + m - 1) / W for the m micro-batches,
    and T_comm = 2 (fill + steady + drain) over the boundary links in lock-step, c_j = L + mb A_j / BW."""
    W, m = w.layout.pp, w.layout.micro_batches
    t_mb = forward_s(w.layers) + backward_s(w.layers)
    ideal = m * t_mb / W
    comp = t_mb * (W + m - 1) / W
    c = [w.links.send(chunk.layers[-1].output_bytes) for chunk in chunks(w)[:-1]]
    fill = sum(max(c[: i + 1]) for i in range(W - 2))
    steady = (m - (W - 2)) * max(c, default=0.0)
    drain = sum(max(c[i:]) for i in range(1, W - 1))
    return StepTime(compute=ideal, comm=2 * (fill + steady + drain), bubble=comp - ideal,
                    optimizer=w.profile.optimizer_s, data=w.data_s)


def async_pipeline(w: Workload, variant: str) -> StepTime:
    """pipedream: no flush; in steady state every stage does one forward and one backward of a mini-batch per
    step, then syncs its gradients over the replicas (tied weights are trained as two copies, not summed) and
    steps, so the slowest stage sets the pace. The pipeline fills and drains once per epoch, spread here over
    the epoch's steps. A stage on r of PipeDream's replicated stages runs its share of the step's round of
    mini-batches, 1 / r of them, each with its all-reduce among the r."""
    paces = []
    for stage, d in enumerate(devices(w)):
        sync, sent = _stage_sync(w, d, 1, stage)
        runs = len(w.layout.runs(RankPosition(0, stage, 0)))
        pace = StepTime(compute=runs * d.work.compute, comm=runs * (d.work.sends + sync),
                        optimizer=runs * optimizer_per_byte(w, stage) * d.params, data=w.data_s,
                        sent=runs * (d.work.sent + sent))
        paces.append(pace)
    slowest = max(paces, key=lambda pace: pace.total)
    fill = sum(pace.total - pace.data for pace in paces) - (slowest.total - slowest.data)
    return shared_cores(w, replace(slowest, bubble=fill / w.steps), [pace.compute + pace.optimizer for pace in paces])


COSTS: dict[Family, Callable[[Workload, str], StepTime]] = {
    Family.replicated: data_parallel, Family.sharded: sharded, Family.tensor_parallel: tensor_parallel,
    Family.flushed_pipeline: flushed_pipeline, Family.async_pipeline: async_pipeline,
}


def step_time(w: Workload, variant: str = "suite") -> StepTime:
    family = COSTS.get(w.strategy.family)
    if family is None:
        raise ConfigError(f"the performance model has no cost function for strategy {w.strategy.name}")
    if variant not in VARIANTS:
        raise ConfigError(f"variant={variant} is not one of {', '.join(VARIANTS)}")
    if w.layout.cp > 1:  # one context-parallel rank's share of every sequence, and the gathers of its blocks
        step = with_collectives(w, family(context_split(w), variant), context_collectives(w))
    else:
        step = family(w, variant)
    if w.data_overlaps:  # only the loader's time beyond the rest of the step is waited for
        step = replace(step, data=max(0.0, step.data - (step.total - step.data)))
    return step
