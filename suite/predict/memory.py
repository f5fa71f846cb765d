"""Peak memory of one rank, and whether the point fits its device.

A rank holds, at its peak (the end of forward, when backward starts while the previous step's buffers are
still there): what its process holds before the model (on CPU the framework itself: the resident set of an
interpreter that imported what a rank imports, measured), its parameters, gradients and optimizer states
(sharded where the strategy shards them; ZeRO also keeps its partition of fp32 master parameters), the
activations autograd keeps for backward (those of the micro-batches in flight in a pipeline; only the inputs of
checkpointed blocks), and transient buffers: DDP's and ZeRO-1/2's gradient buckets, the parameters of a gathered
unit under FSDP and ZeRO-3, one batch of input. The numbers are bytes per rank; the point's peak is its largest rank's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from suite.pipeline.pipedream_engine import lag
from suite.predict.costs import checkpointed
from suite.predict.step import (
    PARAM_BYTES,
    Chunk,
    Workload,
    chunks,
    context_split,
    optimizer_shards,
    regathers,
    tensor_split,
    tp_kept,
)
from suite.profiling.profiles import LayerProfile
from suite.runtime.gpu_query import first_gpu
from suite.runtime.model_transforms import checkpoint_interval
from suite.shared_names import Family

MIB = 2**20


@dataclass(frozen=True)
class Memory:
    base: float
    params: float
    grads: float
    optimizer: float  # optimizer states, and ZeRO's fp32 master partition
    activations: float
    transient: float

    @property
    def peak(self) -> float:
        return self.base + self.params + self.grads + self.optimizer + self.activations + self.transient


def kept_for_backward(w: Workload, layers: Sequence[LayerProfile], wrapped: Sequence[bool], input_bytes: float = 0.0,
                      split: int = 1) -> float:
    """Bytes autograd keeps for one batch through `layers` (whose first reads `input_bytes`): each layer's saved
    tensors (a rank's share where tensor parallelism splits the layers `split` ways, `tp_kept`), or for a
    checkpointed (`wrapped`) block only its input: whole, or its slice of the sequence under sequence parallelism
    (`checkpointed_input`)."""
    inputs = [input_bytes, *(layer.output_bytes for layer in layers[:-1])]
    sequence_parallel = getattr(w.strategy, "sequence_parallel", False)
    return sum(checkpointed_input(read, split, sequence_parallel) if again
               else tp_kept(layer, split, w.cfg.precision, sequence_parallel)
               for layer, again, read in zip(layers, wrapped, inputs))


def checkpointed_input(input_bytes: float, split: int, sequence_parallel: bool) -> float:
    """What a checkpointed block of a tensor-parallel rank keeps: its input, the residual stream, whole on every rank,
    or 1/tp of it where sequence parallelism has split the stream along the sequence (Korthikanti et al. 2022,
    Sec. 5: full recomputation keeps 2sbhL/t bytes with sequence parallelism)."""
    return input_bytes / split if sequence_parallel else input_bytes


def _state_ratio(w: Workload) -> float:
    """Optimizer state bytes per parameter byte (SGD with momentum 1, Adam 2)."""
    return w.profile.optimizer_state_bytes / max(w.profile.param_bytes, 1)


def _workspace(w: Workload, share: float = 1.0) -> float:
    """What training the network on one device held at its peak beyond its parameters, gradients, optimizer
    states and saved activations (temporaries of backward and the optimizer, the allocator's slack: measured,
    see `Profile.train_bytes`), for a rank that computes `share` of it."""
    return w.profile.workspace_bytes * share


def _input_bytes(w: Workload) -> float:
    return w.profile.input_bytes * w.layout.mini_batch / w.profile.batch


def replicated(w: Workload, base: float) -> Memory:
    p = w.profile
    params = p.param_bytes + p.buffer_bytes
    interval = checkpoint_interval(w.cfg.activation_checkpointing)
    buckets = 0.0
    if w.layout.dp > 1 and w.strategy.gradient_sync(w.layout.dp).bucket_copy:
        buckets = p.param_bytes  # the reducer's flat buckets beside the gradients
    kept = kept_for_backward(w, p.layers, checkpointed(p.layers, interval))
    return Memory(base, params, p.param_bytes, _state_ratio(w) * p.param_bytes, kept,
                  buckets + _input_bytes(w) + _workspace(w))


def sharded(w: Workload, base: float) -> Memory:
    """ZeRO and FSDP: what each stage shards; gathered units (FSDP's in half precision in a bf16 or fp16 point, its
    `param_dtype`); ZeRO-1/2's gradient buckets of `reduce_bucket_size` elements (two with `overlap_comm`)."""
    if w.layout.tp > 1:  # FSDP x TP: one tensor-parallel rank's share of the network, sharded over the replicas
        w = tensor_split(w)
    p, shard = w.profile, w.layout.shard
    interval = checkpoint_interval(w.cfg.activation_checkpointing)
    sharding = w.sharding
    zero_stage = sharding.stage
    params = p.param_bytes / (shard if zero_stage == 3 else 1) + p.buffer_bytes
    grads = p.param_bytes / (shard if zero_stage >= 2 else 1)
    optimizer = _state_ratio(w) * p.param_bytes / shard
    if sharding.master_copy:
        optimizer += p.param_bytes / shard  # fp32 master partition
    gathered = 0.0
    if zero_stage == 3 and regathers(w):
        root = sum(layer.param_bytes for layer in p.layers if not layer.block)
        unit = max((layer.param_bytes for layer in p.layers if layer.block), default=0)
        gathered = root + 2 * unit  # the root unit, the unit running and the one prefetched
    elif zero_stage == 3:
        gathered = p.param_bytes  # what forward gathered stays for backward
    gathered *= sharding.gathered_share
    buckets = 0.0
    if zero_stage < 3:
        buckets = sharding.bucket_elements * PARAM_BYTES * (2 if sharding.overlap_comm else 1)
    return Memory(base, params, grads, optimizer, kept_for_backward(w, p.layers, checkpointed(p.layers, interval)),
                  gathered + buckets + _input_bytes(w) + _workspace(w))


def tensor_parallel(w: Workload, base: float) -> Memory:
    p, tp = w.profile, w.layout.tp
    split = [layer.block or w.strategy.vocab_parallel for layer in p.layers]
    held = sum(layer.param_bytes / (tp if s else 1) for layer, s in zip(p.layers, split))
    again = checkpointed(list(p.layers), checkpoint_interval(w.cfg.activation_checkpointing))
    sequence_parallel = w.strategy.sequence_parallel
    kept = sum(checkpointed_input(p.layers[i - 1].output_bytes, tp if s else 1, sequence_parallel) if a
               else tp_kept(layer, tp if s else 1, w.cfg.precision, sequence_parallel)
               for i, (layer, s, a) in enumerate(zip(p.layers, split, again)))
    # The peak is where backward starts: its workspace is the last layer's temporaries (GPT-2's head: the logits'
    # softmax and gradients), split only where that layer is (the vocabulary).
    share = 1 / tp if split[-1] else 1.0
    return Memory(base, held + p.buffer_bytes, held, _state_ratio(w) * held, kept,
                  _input_bytes(w) + _workspace(w, share))


def _in_flight(w: Workload, device: int) -> float:
    """Micro-batches whose activations a pipeline device keeps at its peak."""
    p, m, v = w.layout.pp, w.layout.micro_batches, w.layout.virtual_stages
    if w.strategy.forwards_all_first:
        return m
    if w.strategy.family == Family.async_pipeline:
        return lag(w.layout, device) + 1  # mini-batches between its forward and its backward
    if v > 1:  # interleaved 1F1B's warm-up, in chunk-micro-batches, spread over the device's v chunks
        return min(m * v, 2 * (p - device - 1) + (v - 1) * p + 1) / v
    return min(m, p - device)


def pipeline(w: Workload, base: float) -> Memory:
    """Each pipeline device; torchgpipe's devices in one process on CPU are that one process's memory."""
    p = w.layout.pp
    all_chunks = chunks(w)
    per_device = []
    for d in range(p):
        mine = [all_chunks[c] for c in w.layout.stage_chunks(d)]
        held = sum(c.params for c in mine)
        buffers = sum(w.profile.buffer_bytes * sum(x.param_bytes for x in c.layers) / max(w.profile.param_bytes, 1)
                      for c in mine)
        kept = sum(_chunk_activations(w, c, d) for c in mine)
        async_pipeline = w.strategy.family == Family.async_pipeline
        stash = held * lag(w.layout, d) if async_pipeline else 0.0  # older weight versions
        share = sum(x.saved_bytes for c in mine for x in c.layers) / max(sum(x.saved_bytes for x in w.layers), 1)
        states = _state_ratio(w) * held / optimizer_shards(w, d)
        per_device.append(Memory(0.0, held + buffers + stash, held, states, kept, _workspace(w, share)))
    if w.layout.stages_in_one_process and not w.stages_overlap:
        total = Memory(base, *(sum(getattr(m, f) for m in per_device)
                               for f in ("params", "grads", "optimizer", "activations", "transient")))
        return _with_transient(total, _input_bytes(w))
    largest = max(per_device, key=lambda m: m.peak)
    return _with_transient(replace(largest, base=base), _input_bytes(w))


def _chunk_activations(w: Workload, chunk: Chunk, device: int) -> float:
    """A chunk's activations at its device's peak. A pipeline that recomputes micro-batches' forward itself
    (`Strategy.recomputed_forward_share`: torchgpipe's `checkpoint`, all, all but the last or none) keeps only the
    chunk's input for them."""
    full = kept_for_backward(w, chunk.layers, chunk.checkpointed, chunk.input_bytes, chunk.tp)
    in_flight = _in_flight(w, device)
    share = w.strategy.recomputed_forward_share(w.layout)
    if not share:
        return full * in_flight
    m = w.layout.micro_batches
    recomputed = round(share * m)
    boundary = chunk.input_bytes
    return recomputed * boundary + (m - recomputed) * full + (full if recomputed else 0.0)


def _with_transient(memory: Memory, extra: float) -> Memory:
    return Memory(memory.base, memory.params, memory.grads, memory.optimizer, memory.activations,
                  memory.transient + extra)


KEPT = {Family.replicated: replicated, Family.sharded: sharded, Family.tensor_parallel: tensor_parallel,
        Family.flushed_pipeline: pipeline, Family.async_pipeline: pipeline}


def rank_memory(w: Workload, base_bytes: float) -> Memory:
    """Under context parallelism, what one context-parallel rank's share of every sequence keeps."""
    return KEPT[w.strategy.family](context_split(w) if w.layout.cp > 1 else w, base_bytes)


def capacity_bytes(cfg, device_type: str, processes_per_node: int) -> float | None:
    """Memory one rank may use: the cluster's device memory per GPU (here: the GPU's), or on CPU the configured
    `cluster.hardware.device_memory_gb` per rank, else this machine's memory shared by the node's ranks."""
    configured = cfg.cluster.hardware.device_memory_gb
    if configured:
        return configured * 2**30
    if device_type == "cuda":
        here = first_gpu() if cfg.cluster.scheduler == "local" else None
        return here.memory_bytes if here else None
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / processes_per_node
