"""AxoNN (Singh and Bhatele; Study N's authors' framework), run as Study N ran it and in its two other modes.

`axonn.init` builds AxoNN's process groups over the suite's process group (already initialised: gloo on CPU ranks,
NCCL on GPUs): G_inter = `strategy.pp` stages per replica (its inter-layer parallelism), G_intra = `strategy.tp`
(its intra-layer parallelism), G_data = workers / (pp x tp). With tp 1 each step is AxoNN's
`AxoNN_Inter_Layer_Engine.forward_backward_optimizer` on the rank's stage (`AxoNNStages`): with one stage (Study N's
data parallelism), the replica's micro-batches forward and backward in turn; with several, AxoNN's message-driven
pipeline, the first stage injecting pp micro-batches and then one per message it receives, activations and their
gradients sent with mpi4py (so the ranks are MPI's: mpiexec starts them, `launchers.mpiexec`); then the
cross-entropy's gradients (computed in full precision), `sync_gradients` averaging over the data-parallel group, and
the optimizer's step. With tp > 1 its split linear layers train outside the engine (`AxoNNIntraLayer`). The installed
package is `make axonn`'s (suite/tools/install_axonn.py): as published on GPU machines, patched for CPU ranks
elsewhere; the run records which.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout
from suite.models import build_model
from suite.models.layers import flatten_layers
from suite.pipeline.microbatch import MicroBatching
from suite.pipeline.partition import cut
from suite.runtime.numerics import build_optimizer
from suite.shared_names import Family
from suite.strategies.base import DataParallel, GradientSync, Library, RankContext, Runtime, Supports
from suite.strategies.pipeline import DistributedPipeline, DistributedStages, profile_sample

# AxoNN's computation dtype per precision: its own loss scaling in float16 (the final softmax in full precision).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def activation_shapes(cfg, stage_layers: list[int]) -> list[list[int]]:
    """The shape of the activation entering each stage, then of the last stage's output (-1: the micro-batch), from
    one sample through the network on the meta device (nothing computed; in evaluation mode, where BatchNorm takes a
    batch of one)."""
    with torch.device("meta"):
        layers = flatten_layers(build_model(cfg.network, cfg.dataset).eval())
        x = profile_sample(cfg, 1)
        shapes = []
        for group in cut(layers, stage_layers):
            shapes.append([-1, *x.shape[1:]])
            for layer in group:
                x = layer.module(x)
    return [*shapes, [-1, *x.shape[1:]]]


class EngineStage(nn.Module):
    """A rank's stage as AxoNN's engine takes it: the shapes of what it receives and sends, for its receive buffers."""

    def __init__(self, stage: nn.Module, input_shape: list[int], output_shape: list[int]) -> None:
        super().__init__()
        self.stage, self.input_shape, self.output_shape = stage, input_shape, output_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage(x)

    def get_input_shape(self) -> list[int]:
        return self.input_shape

    def get_output_shape(self) -> list[int]:
        return self.output_shape


class AxoNNStages(DistributedStages):
    """The rank's stage (the whole network where pp = 1), trained by AxoNN's engine. Evaluation, the tied GPT-2
    embedding and head on different stages (summed in the engine's hook after backward, before its gradient sync) and
    the stage metrics are the suite's, as for its other pipelines across ranks."""

    def __init__(self, spec: AxoNN, model: nn.Module, rank: RankContext) -> None:
        from axonn import axonn as ax
        from axonn.inter_layer import AxoNN_Inter_Layer_Engine

        check_build(rank.env.device)
        super().__init__(spec, model, rank, sum_tied=True)
        layout, cfg = rank.layout, rank.cfg
        # MPI is initialised where AxoNN talks it (`AxoNN.rank_launcher`): mpiexec's ranks join it before the process
        # group (suite.worker.rank).
        ax.init(G_inter=layout.pp, G_data=layout.dp, gpus_per_node=cfg.cluster.workers_per_node)
        ax.config.micro_batch_size = layout.micro_batch_size
        (stage,) = self.model
        (index,) = self.stage_ids
        shapes = activation_shapes(cfg, self.stage_layers)
        self.engine = AxoNN_Inter_Layer_Engine(EngineStage(stage, shapes[index], shapes[index + 1]), rank.loss_fn,
                                               computation_dtype=DTYPES[cfg.precision])

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One step of AxoNN's engine (forward, backward, gradient sync and update inside it: the phase breakdown has
        only the whole step, `pipeline`). A stage that loads no inputs hands the engine a batch of the right length,
        from which it counts the micro-batches."""
        if not self.takes_inputs:
            inputs = inputs.new_empty(self.rank.layout.mini_batch, 0)
        self.optimizer.zero_grad(set_to_none=True)  # the engine accumulates into the gradients it finds
        with self.rank.timer.phase("pipeline"):
            loss = self.engine.forward_backward_optimizer(inputs, targets, self.optimizer,
                                                          post_bw_hook=lambda _: self.sum_tied_grads())
        return torch.tensor(loss, device=self.rank.env.device)

    def summary_metrics(self, memory_by_rank: list[dict[str, float]]) -> dict[str, float]:
        """A pipeline's (its stages' peaks, the ideal bubble: the engine's stages are not timed apart); none for data
        parallelism alone."""
        return super().summary_metrics(memory_by_rank) if self.rank.layout.pp > 1 else {}

    def effective_settings(self) -> dict[str, Any]:
        scaler = " + its loss scaler" if self.rank.cfg.precision == "fp16" else ""
        return {**super().effective_settings(), **axonn_settings(),
                "precision.implementation": "AxoNN's engine" + scaler}


# What `make axonn` (suite/tools/install_axonn.py) leaves beside the package it installed: read here, in the rank.
BUILD_FILE = "suite_build.json"


def package_dir() -> Path | None:
    spec = importlib.util.find_spec("axonn")
    return Path(spec.origin).parent if spec and spec.origin else None


def installed_build() -> dict | None:
    """What `make axonn` installed ({"version", "build", "patches"}); None where it has not (or another installer
    did)."""
    directory = package_dir()
    record = directory / BUILD_FILE if directory else None
    return json.loads(record.read_text()) if record and record.exists() else None


def check_build(device: torch.device) -> None:
    """Refuse AxoNN patched for CPU ranks on a GPU rank: `make axonn` ran where torch saw no GPU (a login node) and
    the venv is shared with the GPU nodes. Checked in the rank, where the device is known (a job script is written
    on a login node, whose own AxoNN build says nothing of the nodes')."""
    if device.type == "cuda" and (installed_build() or {}).get("build") == "cpu-patched":
        raise ConfigError("AxoNN in this environment is patched for CPU ranks (`make axonn` ran where torch saw no "
                          "GPU): run `make axonn` on a GPU node")


def axonn_settings() -> dict[str, Any]:
    """The installed AxoNN: its version, and whether `make axonn` patched it for CPU ranks."""
    build = installed_build() or {"version": "unknown", "build": "not installed by make axonn"}
    return {"axonn.version": build["version"], "axonn.build": build["build"]}


class SplitLinear(nn.Module):
    """An nn.Linear as AxoNN's intra-layer parallelism runs it: its weight's rows split over the G_intra ranks
    (`axonn.intra_layer.Linear`, which gathers the ranks' batches around its product), loaded whole and cut there. The
    bias stays whole on every rank and is averaged with the data-parallel weights: AxoNN 0.2.0's split bias takes, on
    each rank, the gradient of that rank's own samples only."""

    def __init__(self, linear: nn.Linear) -> None:
        from axonn.intra_layer import Linear

        super().__init__()
        self.linear = Linear(linear.in_features, linear.out_features, bias=False, init_method=lambda weight: None)
        self.linear.load_state_dict({"weight": linear.weight.detach()})
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y if self.bias is None else y + self.bias

    def full_weight(self) -> torch.Tensor:
        """The whole weight, from every rank's rows (a collective of its G_intra ranks)."""
        from axonn import axonn as ax

        group = ax.comm_handle.outer_intra_layer_parallel_group
        rows = [torch.empty_like(self.linear.weight) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, self.linear.weight.detach().contiguous(), group=group)
        return torch.cat(rows).reshape(self.linear.out_features, self.linear.in_features)


def split_linears(model: nn.Module, ranks: int) -> list[str]:
    """Replace every nn.Linear whose output rows divide over `ranks` with a SplitLinear, except one whose weight is
    tied to another module's (GPT-2's head, its embedding's); returns the names of those replaced."""
    counts: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        counts[id(param)] = counts.get(id(param), 0) + 1
    replaced = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and module.out_features % ranks == 0 and counts[id(module.weight)] == 1:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, SplitLinear(module))
            replaced.append(name)
    return replaced


class AxoNNIntraLayer(DataParallel):
    """AxoNN's intra-layer parallelism as its own training loops run it (outside its engine, whose gradient sync is
    its expert mode's): the network's linear layers split over G_intra = `tp` ranks, everything else data parallel
    over every rank, each rank its own samples; forward and backward under the suite's precision, then AxoNN's
    `sync_gradients` (the split weights over the data-parallel group, the rest over every rank, averaged)."""

    def __init__(self, model: nn.Module, rank: RankContext, tp: int) -> None:
        from axonn import axonn as ax

        check_build(rank.env.device)
        layout, cfg = rank.layout, rank.cfg
        ax.init(G_inter=1, G_data=layout.dp // tp, G_intra_r=tp, gpus_per_node=cfg.cluster.workers_per_node)
        self.split = split_linears(model, tp)
        model = model.to(rank.env.device)
        super().__init__(rank, model, build_optimizer(model.parameters(), cfg.optimizer), sync_buffers=True)

    def backward(self, loss: torch.Tensor) -> None:
        from axonn.intra_layer import sync_gradients

        super().backward(loss)
        sync_gradients(self.model, mean=True)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        for name in self.split:
            del state[f"{name}.linear.weight"]
            state[f"{name}.weight"] = self.model.get_submodule(name).full_weight().cpu()
        return state

    def effective_settings(self) -> dict[str, Any]:
        return {**super().effective_settings(), **axonn_settings(), "axonn.split_linears": len(self.split)}


@dataclass(frozen=True)
class AxoNN(DistributedPipeline):
    name: str = "axonn"
    label: ClassVar[str] = "AxoNN"
    # The engine runs forward, backward and the step itself: no gradient accumulation of the suite's (its micro-
    # batches are), no recomputation wrapped around its model; fp16 with its own loss scaler.
    supports: ClassVar[Supports] = replace(DistributedPipeline.supports, precisions=tuple(DTYPES))
    requires: ClassVar[tuple[Library, ...]] = (Library("AxoNN", "axonn", "axonn", ("mpiexec",)),)
    accumulation_hint: ClassVar[str] = "AxoNN's micro-batches are its accumulation (strategy.micro_batches)"
    pp: int = 1  # G_inter: stages per replica
    tp: int = 1  # G_intra: ranks that split each linear layer (with pp = 1)

    @property
    def family(self) -> Family | None:
        """Data parallel, or a flushed pipeline; its intra-layer mode (each rank its own samples, linear layers
        split over gathered batches) is not one the performance model prices."""
        if self.tp > 1:
            return None
        return Family.replicated if self.pp == 1 else Family.flushed_pipeline

    def gradient_sync(self, dp: int) -> GradientSync:
        """`sync_gradients`: each gradient all-reduced on its own once backward has ended."""
        return GradientSync(after_backward=True)

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[], *super().candidates(workers, batch)]

    def batching(self, cfg) -> MicroBatching:
        """Without pipelining the replica's batch is one micro-batch unless the knobs cut it (the engine then
        accumulates)."""
        if self.pp == 1 and self.micro_batches is None and self.micro_batch_size is None and self.preset is None:
            return MicroBatching(1, cfg.batch_size)
        return super().batching(cfg)

    def layout(self, cfg) -> Layout:
        """Every rank its own samples, `batch_size` of them, where the linear layers are split (G_intra): AxoNN
        gathers the batches of a layer's ranks around its product."""
        if self.tp > 1:
            return Layout(dp=cfg.workers, mini_batch=cfg.batch_size)
        return super().layout(cfg)

    def rank_launcher(self, cfg) -> str | None:
        """MPI ranks where AxoNN talks MPI: its pipeline's sends, its loss scaler's overflow vote."""
        return "mpiexec" if self.pp > 1 or (cfg.precision == "fp16" and self.tp == 1) else None

    def check(self, cfg) -> None:
        if self.tp < 1 or cfg.workers % self.tp:
            raise ConfigError(f"strategy axonn: tp={self.tp} does not divide workers={cfg.workers}")
        if self.tp > 1 and (self.pp > 1 or self.micro_batches or self.micro_batch_size or self.preset):
            raise ConfigError("strategy axonn: tp > 1 (intra-layer) runs outside AxoNN's engine, one micro-batch per "
                              "step: leave pp at 1 and micro_batches, micro_batch_size and preset unset")
        super().check(cfg)

    def setup(self, model: nn.Module, rank: RankContext) -> Runtime:
        if self.tp > 1:
            return AxoNNIntraLayer(model, rank, self.tp)
        return AxoNNStages(self, model, rank)
