"""What every pipeline strategy shares: the knobs and batch rule of its spec, how the network is cut into
stages, the stage-timing metrics, and, for pipelines across ranks, the stages a rank holds.

Stage compute is timed under the phases `stage<i>.forward` / `stage<i>.backward` and the whole
schedule under `pipeline`; from these come `bubble_fraction_measured` (idle time of the busiest
device over the step time), the analytic bound T_seq(mb) x (p + m - 1) / p, and per-stage memory.
A pipeline's step is its schedule (all micro-batches forward and backward on every stage), so it
cannot go through `DataParallel`'s forward / backward / step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import torch
import torch.distributed as dist
from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout, divisors, will_use_cuda
from suite.models import build_model
from suite.models.layers import Layer, flatten_layers, tied_parameters
from suite.pipeline import p2p
from suite.pipeline.groups import PipelineGroups
from suite.pipeline.microbatch import MicroBatching, micro_batching
from suite.pipeline.partition import StageModule, check_balance, cut, stage_sizes, untie
from suite.runtime.metrics import PhaseTimer, local_tensor
from suite.runtime.numerics import build_optimizer
from suite.runtime.torch_api import is_dtensor
from suite.strategies.base import RankContext, Runtime, Strategy, Supports
from suite.strategies.megatron import param_groups, split_stage, whole_logits


def layer_count(cfg) -> int:
    with torch.device("meta"):
        return len(flatten_layers(build_model(cfg.network, cfg.dataset)))


def profile_sample(cfg, batch: int) -> torch.Tensor:
    """A micro-batch of the dataset's shape, for timing layers (values do not matter)."""
    data = cfg.dataset
    if data.kind == "tokens":
        return torch.randint(0, data.vocab_size, (batch, data.seq_len))
    return torch.randn(batch, data.channels, data.image_size, data.image_size)


@dataclass(frozen=True)
class Pipeline(Strategy):
    """The knobs and batch rule of every pipeline."""

    name: str = "pipeline"
    # The schedules have no loss scaling for fp16; gpipe recomputes through torchgpipe's own `checkpoint`.
    supports: ClassVar[Supports] = Supports(precisions=("fp32", "bf16"), activation_checkpointing=False)
    accumulation_hint: ClassVar[str] = "a pipeline's micro-batches are its accumulation (strategy.micro_batches)"
    micro_batches: int | None = None
    micro_batch_size: int | None = None
    preset: str | None = None  # study_n | study_j
    balance: Literal["by_params", "by_time"] | list[int] = "by_params"  # or layers per stage
    # GPipe's schedule: every micro-batch's forward before any backward, so a stage keeps all of their activations
    forwards_all_first: ClassVar[bool] = False

    @property
    def fill_share(self) -> float:
        """What each of the p - 1 slots that fill and drain the pipeline costs, as a share of one micro-batch's work
        on a stage: all of it (forward and backward) in GPipe's and 1F1B's schedules."""
        return 1.0

    @staticmethod
    def micro_batch_counts(stages: int, batch: int) -> list[int]:
        """The micro-batch counts the recommender tries on `stages` stages: 1, 2 and 4 per stage, where they divide
        the batch."""
        return [m for m in (stages, 2 * stages, 4 * stages) if batch % m == 0]

    def stages(self, cfg) -> int:
        """Pipeline stages (devices a mini-batch flows through)."""
        raise NotImplementedError

    def chunks_per_device(self) -> int:
        """Model chunks per device (interleaved schedules)."""
        return 1

    @property
    def v_shaped(self) -> bool:
        """Whether a device's two chunks sit in a V (`Layout.v_shape`) rather than a loop."""
        return False

    def batching(self, cfg) -> MicroBatching:
        return micro_batching(self.preset, self.micro_batches, self.micro_batch_size, cfg.batch_size,
                              self.stages(cfg), cfg.dataset.name)

    def check(self, cfg) -> None:
        stages = self.stages(cfg)
        self.check_workers(cfg, stages)
        self.batching(cfg)
        check_balance(self.balance, layer_count(cfg), stages * self.chunks_per_device())

    def check_workers(self, cfg, stages: int) -> None:
        if stages < 1 or cfg.workers % stages:
            raise ConfigError(f"strategy {self.name}: workers={cfg.workers} do not form pipelines of {stages} stages")

    def layout(self, cfg) -> Layout:
        stages, batching = self.stages(cfg), self.batching(cfg)
        return Layout(dp=cfg.workers // stages, pp=stages, mini_batch=batching.mini_batch,
                      micro_batches=batching.micro_batches, virtual_stages=self.chunks_per_device(),
                      v_shape=self.v_shaped)

    def stage_sizes(self, layers: list[Layer], rank: RankContext) -> list[int]:
        """Layers per stage, decided on rank 0 (so `by_time` gives every rank the same cut)."""
        layout, env = rank.layout, rank.env
        answer = [None]
        if env.rank == 0:
            sample = profile_sample(rank.cfg, layout.micro_batch_size).to(env.device)
            answer = [stage_sizes(self.balance, layers, layout.pp * layout.virtual_stages, sample, env.device)]
        dist.broadcast_object_list(answer, src=0)
        return answer[0]


def partition_settings(stage_layers: list[int]) -> dict[str, str]:
    """The cut a `balance` made, recorded with the run (`effective.pipeline.stage_layers`: layers per stage)."""
    return {"pipeline.stage_layers": ",".join(map(str, stage_layers))}


def pipeline_metrics(timer: PhaseTimer, devices: int, micro_batches: int, flushes: bool,
                     stage_device: Callable[[int], int], stage_peaks: dict[int, float],
                     fill_share: float = 1.0) -> dict[str, float]:
    """Bubble and stage metrics of a pipeline over `devices` from the stage timings of every rank (a collective every
    rank joins; a schedule the suite does not time, AxoNN's, gives the ideal bubble only).
    `flushes`: the schedule drains the pipeline every step (GPipe, 1F1B); PipeDream's does not. `fill_share`: what a
    fill slot costs as a share of a device's work on one micro-batch (the schedule's `Pipeline.fill_share` over the
    chunks a device holds: a slot is one chunk's)."""
    steps = max(timer.steps, 1)
    mine = {k: v / steps for k, v in timer.totals.items() if k.startswith("stage") or k == "pipeline"}
    gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, mine)
    stages = sorted({int(key[5:].split(".")[0]) for times in gathered for key in times if key != "pipeline"})
    stage_time = {s: max(t.get(f"stage{s}.forward", 0.0) + t.get(f"stage{s}.backward", 0.0) for t in gathered)
                  for s in stages}
    device_time: dict[int, float] = {}
    for stage, seconds in stage_time.items():
        device = stage_device(stage)
        device_time[device] = device_time.get(device, 0.0) + seconds
    step = max(t.get("pipeline", 0.0) for t in gathered)
    p, m = devices, micro_batches
    metrics = {f"peak_memory_mb_stage{i}": mb for i, mb in stage_peaks.items()}
    # GPipe's and 1F1B's idle fraction with balanced stages, (p - 1) / (m + p - 1) (a zero-bubble schedule's fill
    # slots cost less); none in PipeDream's steady state.
    fill = (p - 1) * fill_share
    metrics["bubble_fraction_ideal"] = fill / (m + fill) if flushes else 0.0
    if step > 0 and device_time:
        busiest = max(device_time.values())
        # Study J's model from measured stage times, T_seq(mb) x (p + m - 1) / p; in PipeDream's steady state,
        # one mini-batch per step of the slowest stage.
        bound = sum(stage_time.values()) / m * (m + fill) / p if flushes else busiest
        metrics.update(bubble_fraction_measured=max(step - busiest, 0.0) / step, pipeline_step_s=step,
                       pipeline_bound_s=bound, pipeline_bound_ratio=step / bound)
        metrics.update({f"stage_compute_s_stage{s}": t for s, t in sorted(stage_time.items())})
    return metrics


@dataclass(frozen=True)
class DistributedPipeline(Pipeline):
    """One stage (or `virtual_stages` chunks) per rank; `pp` ranks per pipeline, `workers / pp` replicas."""

    name: str = "distributed_pipeline"
    # All of it goes through process groups: stage-to-stage sends and gradient reductions.
    supports: ClassVar[Supports] = replace(Pipeline.supports, counts_communication=True)
    pp: int | None = None  # stages per pipeline; None = every worker (one pipeline, no replicas)

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[f"strategy.pp={pp}", f"strategy.micro_batches={m}"]
                for pp in divisors(workers) if pp > 1 for m in cls.micro_batch_counts(pp, batch)]

    def stages(self, cfg) -> int:
        return self.pp or cfg.workers

    def check(self, cfg) -> None:
        if cfg.cluster.share_gpus and will_use_cuda(cfg.cluster) and self.stages(cfg) > 1:
            raise ConfigError(f"strategy {self.name}: its stages send each other CUDA tensors, which gloo cannot "
                              "(cluster.share_gpus: ranks sharing a GPU); give each rank a GPU of its own")
        super().check(cfg)


class DistributedStages(Runtime):
    """The stages of a pipeline across ranks that this rank holds, trained by a schedule of the subclass.

    Chunk s of replica d runs on the rank at (d, `layout.chunk_stage(s)`) of the layout. Tied weights on different
    stages (GPT-2's embedding and LM head) sum their gradients when `sum_tied` holds; every stage averages its
    gradients over the replicas."""

    flushes = True  # the schedule drains the pipeline every step (see `pipeline_metrics`)
    # Whether the schedule sends with suite.pipeline.p2p both ways at once, on a channel per direction (PipelineGroups).
    p2p_channels = False

    def __init__(self, spec: Pipeline, model: nn.Module, rank: RankContext, sum_tied: bool) -> None:
        layout, env = rank.layout, rank.env
        total = layout.pp * layout.virtual_stages
        layers = flatten_layers(model)
        self.stage_layers = spec.stage_sizes(layers, rank)
        self.fill_share = spec.fill_share
        groups = cut(layers, self.stage_layers)
        layer_stage = [stage for stage, group in enumerate(groups) for _ in group]
        ties = tied_parameters(layers) if sum_tied else []
        untie(layers, ties)  # a copy in each place: two chunks of one rank (in a V) must not step one tensor twice
        tie_ranks = {layout.chunk_stage(layer_stage[index]) for places in ties for index, _ in places}
        self.topology = PipelineGroups.build(layout, env.rank, tie_ranks, env.device.type, self.p2p_channels)
        self.stage_ids = layout.stage_chunks(self.topology.stage_rank)
        self.total_stages = total
        local = nn.ModuleList(StageModule(groups[s]) for s in self.stage_ids).to(env.device)
        if layout.tp > 1:  # before the tied weights are found: splitting replaces the parameters
            split_stage([layer.module for s in self.stage_ids for layer in groups[s]], self.topology.mesh["tp"],
                        getattr(spec, "sequence_parallel", False))
        held = {id(p) for p in local.parameters()}
        self.tied = [[p for i, name in places if id(p := layers[i].module.get_parameter(name)) in held]
                     for places in ties]  # per tie, the copies this rank holds
        self.split_logits = layout.tp > 1  # the last stage's head is split by vocabulary
        params = param_groups(local) if layout.tp > 1 else local.parameters()
        self.evaluated = 0  # batches of this evaluation so far
        super().__init__(rank, local, build_optimizer(params, rank.cfg.optimizer))

    @property
    def holds_output(self) -> bool:
        return self.topology.is_last

    @property
    def takes_inputs(self) -> bool:
        return self.topology.is_first

    def effective_settings(self) -> dict[str, Any]:
        return {**super().effective_settings(), **partition_settings(self.stage_layers)}

    def sync_grads(self) -> None:
        """Sum the gradients of tied copies across stages, then average over the data-parallel replicas."""
        self.sum_tied_grads()
        self.topology.average_grads([p for p in self.model.parameters() if p.requires_grad])

    def sum_tied_grads(self) -> None:
        """Give every copy of a tied weight the sum of their gradients, on this rank and across stages. A split
        parameter's gradient is first given its placement (the split embedding's comes back whole from backward)."""
        for param in self.model.parameters():
            if is_dtensor(param.grad) and param.grad.placements != param.placements:
                param.grad = param.grad.redistribute(param.device_mesh, param.placements)
        for copies in self.tied:  # the copies of one rank (a V's first and last chunks) sum theirs here
            if len(copies) > 1:
                for p in copies:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                total = torch.stack([local_tensor(p.grad) for p in copies]).sum(0)
                for p in copies:
                    local_tensor(p.grad).copy_(total)
        self.topology.sum_tied_grads([p for copies in self.tied for p in copies[:1]])

    def optimizer_step(self) -> None:
        self.rank.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """Plain (unpipelined) forward through the stages in order, for evaluation; replicated stages take the
        evaluation's batches round-robin, as training's."""
        topo, x = self.topology, inputs
        layout, me = topo.layout, topo.stage_rank
        index, self.evaluated = self.evaluated, self.evaluated + 1
        if not topo.carries(index):
            return None
        for local, stage in zip(self.model, self.stage_ids):
            if stage > 0 and layout.chunk_stage(stage - 1) != me:
                x = p2p.recv(topo.peer(layout.chunk_stage(stage - 1), index), self.rank.env.device)
            x = local(x)
            if stage < self.total_stages - 1 and layout.chunk_stage(stage + 1) != me:
                p2p.wait_all(p2p.isend(x, topo.peer(layout.chunk_stage(stage + 1), index)))
        return whole_logits(x, topo.tp_group, topo.layout.tp) if topo.is_last else None

    def before_evaluate(self) -> None:
        """Replicas evaluate with replica 0's buffers (BatchNorm statistics drift apart per replica)."""
        self.evaluated = 0
        if self.topology.dp > 1:
            for buffer in self.model.buffers():
                dist.broadcast(buffer, self.topology.replica0(), group=self.topology.dp_group)

    def summary_metrics(self, memory_by_rank: list[dict[str, float]]) -> dict[str, float]:
        layout = self.rank.layout
        peaks = {i: max(m["peak_memory_mb"] for r, m in enumerate(memory_by_rank) if layout.position(r).stage == i)
                 for i in range(layout.pp)}
        return pipeline_metrics(self.rank.timer, layout.pp, layout.micro_batches, self.flushes, layout.chunk_stage,
                                peaks, self.fill_share / layout.virtual_stages)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Replica 0's stages; the blocks split over a stage's ranks gathered whole (a collective they join)."""
        state: dict[str, torch.Tensor] = {}
        if self.topology.replica == 0:
            for local in self.model:
                state.update(local.named_state())
        if self.topology.position.tp_rank:
            state = {}
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(state, gathered, dst=0)
        return {k: v for part in gathered or [] for k, v in part.items()}
