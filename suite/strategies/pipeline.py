"""What every pipeline strategy shares: knobs, the batch rule, checks, stage timing and its metrics,
and, for pipelines across processes, the rank layout, evaluation, weights and reductions.

Stage compute is timed under the phases `stage<i>.forward` / `stage<i>.backward` and the whole
schedule under `pipeline`; from these come `bubble_fraction_measured` (idle time of the busiest
device over the step time), the analytic bound T_seq(mb) x (p + m - 1) / p, and per-stage memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from suite.dist import DistEnv
from suite.errors import ConfigError
from suite.models import build_model
from suite.models.layers import Layer, flatten_layers, tied_parameters
from suite.pipeline import p2p
from suite.pipeline.microbatch import MicroBatching, micro_batching
from suite.pipeline.partition import StageModule, check_balance, cut, stage_sizes
from suite.pipeline.topology import Topology, build_topology
from suite.strategies.base import Strategy
from suite.timing import PhaseTimer


def layer_count(cfg) -> int:
    with torch.device("meta"):
        return len(flatten_layers(build_model(cfg.network, cfg.dataset)))


def profile_sample(cfg, batch: int) -> torch.Tensor:
    """A micro-batch of the dataset's shape, for timing layers (values do not matter)."""
    data = cfg.dataset
    if data.kind == "tokens":
        return torch.randint(0, data.vocab_size, (batch, data.seq_len))
    return torch.randn(batch, data.channels, data.image_size, data.image_size)


@dataclass
class Pipeline(Strategy):
    name: str = "pipeline"
    precisions: ClassVar[tuple[str, ...]] = ("fp32", "bf16")  # the schedules have no loss scaling for fp16
    checkpoints_activations: ClassVar[bool] = False  # gpipe recomputes through torchgpipe's own `checkpoint`
    micro_batches: int | None = None
    micro_batch_size: int | None = None
    preset: str | None = None  # study_n | study_j
    balance: Any = "by_params"  # by_params | by_time | [layers per stage]

    def stages(self, cfg) -> int:
        """Pipeline stages (devices a mini-batch flows through)."""
        raise NotImplementedError

    def chunks_per_device(self) -> int:
        """Model chunks per device (interleaved schedules)."""
        return 1

    def replicas(self, cfg) -> int:
        return cfg.workers // self.stages(cfg)

    def batching(self, cfg) -> MicroBatching:
        return micro_batching(self.preset, self.micro_batches, self.micro_batch_size, cfg.batch_size,
                              self.stages(cfg), cfg.dataset.name)

    def check(self, cfg) -> None:
        stages = self.stages(cfg)
        if stages < 1 or cfg.workers % stages:
            raise ConfigError(f"strategy {self.name}: workers={cfg.workers} do not form pipelines of {stages} stages")
        self.batching(cfg)
        check_balance(self.balance, layer_count(cfg), stages * self.chunks_per_device())

    def global_batch_size(self, cfg) -> int:
        return self.replicas(cfg) * self.batching(cfg).mini_batch

    def data_shards(self, cfg) -> int:
        return self.replicas(cfg)

    def derived_params(self, cfg) -> dict[str, Any]:
        batching = self.batching(cfg)
        return {"pipeline_stages": self.stages(cfg), "micro_batches": batching.micro_batches,
                "micro_batch_size": batching.micro_batch_size, "pipeline_replicas": self.replicas(cfg)}

    def _stage_sizes(self, layers: list[Layer], cfg, env: DistEnv) -> list[int]:
        """Layers per stage, decided on rank 0 (so `by_time` gives every rank the same cut)."""
        answer = [None]
        if env.rank == 0:
            sample = profile_sample(cfg, self.batching(cfg).micro_batch_size).to(env.device)
            answer = [stage_sizes(self.balance, layers, self.stages(cfg) * self.chunks_per_device(), sample,
                                  env.device)]
        dist.broadcast_object_list(answer, src=0)
        return answer[0]

    # Metrics --------------------------------------------------------------------------------------

    def stage_device(self, stage: int) -> int:
        """Which device (pipeline position) runs stage `stage`."""
        return stage

    def stage_peak_memory(self, memory_by_rank: list[dict[str, float]]) -> dict[int, float]:
        """Peak memory of each pipeline position, where it can be told apart."""
        return {}

    def summary_metrics(self, timer: PhaseTimer, memory_by_rank: list[dict[str, float]],
                        env: DistEnv) -> dict[str, float]:
        steps = max(timer.steps, 1)
        mine = {k: v / steps for k, v in timer.totals.items() if k.startswith("stage") or k == "pipeline"}
        gathered: list[dict[str, float]] = [{} for _ in range(env.world_size)]
        dist.all_gather_object(gathered, mine)
        stages = sorted({int(key[5:].split(".")[0]) for times in gathered for key in times if key != "pipeline"})
        stage_time = {s: max(t.get(f"stage{s}.forward", 0.0) + t.get(f"stage{s}.backward", 0.0) for t in gathered)
                      for s in stages}
        device_time: dict[int, float] = {}
        for stage, seconds in stage_time.items():
            device = self.stage_device(stage)
            device_time[device] = device_time.get(device, 0.0) + seconds
        step = max(t.get("pipeline", 0.0) for t in gathered)
        devices = len(device_time)
        metrics = {f"peak_memory_mb_stage{i}": mb for i, mb in self.stage_peak_memory(memory_by_rank).items()}
        metrics["bubble_fraction_ideal"] = self.ideal_bubble(devices)
        if step > 0 and device_time:
            busiest = max(device_time.values())
            bound = self.step_bound(sum(stage_time.values()), busiest, devices)
            metrics.update(bubble_fraction_measured=max(step - busiest, 0.0) / step, pipeline_step_s=step,
                           pipeline_bound_s=bound, pipeline_bound_ratio=step / bound)
            metrics.update({f"stage_compute_s_stage{s}": t for s, t in sorted(stage_time.items())})
        return metrics

    def ideal_bubble(self, devices: int) -> float:
        """GPipe's and 1F1B's idle fraction with balanced stages: (p - 1) / (m + p - 1)."""
        return (devices - 1) / (self._micro_batches + devices - 1)

    def step_bound(self, all_stages_s: float, busiest_s: float, devices: int) -> float:
        """Analytic step time from measured stage times: T_seq(mb) x (p + m - 1) / p (Study J's model)."""
        m = self._micro_batches
        return all_stages_s / m * (devices + m - 1) / devices


@dataclass
class DistributedPipeline(Pipeline):
    """One stage (or `virtual_stages` chunks) per rank; `pp` ranks per pipeline, `workers / pp` replicas."""

    name: str = "distributed_pipeline"
    counts_communication: ClassVar[bool] = True  # stage-to-stage sends and gradient reductions
    pp: int | None = None  # stages per pipeline; None = every worker (one pipeline, no replicas)

    def stages(self, cfg) -> int:
        return self.pp or cfg.workers

    def data_shard(self, env: DistEnv) -> tuple[int, int]:
        """Every stage of a replica reads the replica's batch (the first uses inputs, the last targets)."""
        pp = self.pp or env.world_size
        return env.rank // pp, env.world_size // pp

    def stage_device(self, stage: int) -> int:
        return stage % self.topology.pp

    def sums_tied_gradients(self) -> bool:
        """Whether copies of a tied weight on different stages add up their gradients every step."""
        return True

    def stage_peak_memory(self, memory_by_rank: list[dict[str, float]]) -> dict[int, float]:
        pp = self.topology.pp
        return {i: max(m["peak_memory_mb"] for r, m in enumerate(memory_by_rank) if r % pp == i) for i in range(pp)}

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        pp = self.stages(cfg)
        total = pp * self.chunks_per_device()
        layers = flatten_layers(model)
        groups = cut(layers, self._stage_sizes(layers, cfg, env))
        layer_stage = [stage for stage, group in enumerate(groups) for _ in group]
        ties = tied_parameters(layers) if self.sums_tied_gradients() else []
        tie_ranks = {layer_stage[index] % pp for places in ties for index, _ in places}
        self.topology: Topology = build_topology(env.rank, env.world_size, pp, tie_ranks)
        self.device = env.device
        self.stage_ids = list(range(self.topology.stage_rank, total, pp))
        self.total_stages = total
        self._micro_batches = self.batching(cfg).micro_batches
        self.local = nn.ModuleList(StageModule(groups[s]) for s in self.stage_ids).to(env.device)
        tied_ids = {id(layers[i].module.get_parameter(name)) for places in ties for i, name in places}
        self.tied = [p for p in self.local.parameters() if id(p) in tied_ids]
        return self.local

    def sync_grads(self) -> None:
        """Sum the gradients of tied copies across stages, then average over the data-parallel replicas."""
        self.topology.sum_tied_grads(self.tied)
        self.topology.average_grads([p for p in self.local.parameters() if p.requires_grad])

    def forward(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor | None:
        """Plain (unpipelined) forward through the stages in order, for evaluation."""
        topo, x = self.topology, inputs
        for local, stage in zip(model, self.stage_ids):
            if stage > 0:
                x = p2p.recv(topo.peer((stage - 1) % topo.pp), self.device)
            x = local(x)
            if stage < self.total_stages - 1:
                p2p.wait_all(p2p.isend(x, topo.peer((stage + 1) % topo.pp)))
        return x if topo.is_last else None

    def reduce_mean(self, values: torch.Tensor, env: DistEnv) -> torch.Tensor:
        """Mean over replicas of what the last stage holds (losses, counts); other stages add zeros."""
        values = values.clone() if self.topology.is_last else torch.zeros_like(values)
        dist.all_reduce(values)
        return values / self.topology.dp

    def before_evaluate(self, model: nn.Module, env: DistEnv) -> None:
        """Replicas evaluate with replica 0's buffers (BatchNorm statistics drift apart per replica)."""
        if self.topology.dp > 1:
            for buffer in model.buffers():
                dist.broadcast(buffer, self.topology.stage_rank, group=self.topology.dp_group)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        if self.topology.replica == 0:
            for local in model:
                state.update(local.named_state())
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(state, gathered, dst=0)
        return {k: v for part in gathered or [] for k, v in part.items()}
