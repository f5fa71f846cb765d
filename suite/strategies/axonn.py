"""AxoNN (Singh and Bhatele; Study N's authors' framework), run through its own engine as Study N ran it.

`axonn.init` builds AxoNN's process groups over the suite's process group (already initialised: gloo on CPU ranks,
NCCL on GPUs): G_inter = `strategy.pp` stages per replica (its inter-layer parallelism), G_data = workers / pp
replicas. Each step is AxoNN's `AxoNN_Inter_Layer_Engine.forward_backward_optimizer` on the rank's stage: with one
stage, the replica's micro-batches forward and backward in turn; with several, AxoNN's message-driven pipeline, the
first stage injecting pp micro-batches and then one per message it receives, activations and their gradients sent
with mpi4py (so the ranks are MPI's: mpiexec starts them, `launchers.mpiexec`); then the cross-entropy's gradients
(computed in full precision), `sync_gradients` averaging over the data-parallel group, and the optimizer's step.
Study N ran it data parallel (pp = 1). The installed package is `make axonn`'s (suite/tools/install_axonn.py): as
published on GPU machines, patched for CPU ranks elsewhere; the run records which.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import nn

from suite.errors import ConfigError
from suite.models import build_model
from suite.models.layers import flatten_layers
from suite.pipeline.microbatch import MicroBatching
from suite.pipeline.partition import cut
from suite.placement import will_use_cuda
from suite.strategies.base import Library, RankContext, Supports
from suite.strategies.pipeline import DistributedPipeline, DistributedStages, profile_sample
from suite.vocabulary import Family

# AxoNN's computation dtype per precision: its own loss scaling in float16 (the final softmax in full precision).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def activation_shapes(cfg, stage_layers: list[int]) -> list[list[int]]:
    """The shape of the activation entering each stage, then of the last stage's output (-1: the micro-batch), from
    one sample through the network on the meta device (nothing computed)."""
    with torch.device("meta"):
        layers = flatten_layers(build_model(cfg.network, cfg.dataset))
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

        super().__init__(spec, model, rank, sum_tied=True)
        layout, cfg = rank.layout, rank.cfg
        ax.init(G_inter=layout.pp, G_data=layout.dp, gpus_per_node=cfg.cluster.workers_per_node)
        if cfg.precision == "fp16":  # its loss scaler agrees on overflows over MPI_COMM_WORLD, at any pp
            from mpi4py import MPI

            if not MPI.Is_initialized():
                MPI.Init()
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
        from suite.tools.install_axonn import installed_build

        build = installed_build() or {"version": "unknown", "build": "not installed by make axonn"}
        return {**super().effective_settings(), "axonn.version": build["version"], "axonn.build": build["build"],
                "precision.implementation": "AxoNN's engine" + (" + its loss scaler"
                                                                if self.rank.cfg.precision == "fp16" else "")}


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

    @property
    def family(self) -> Family:
        return Family.replicated if self.pp == 1 else Family.flushed_pipeline

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[], *super().candidates(workers, batch)]

    def batching(self, cfg) -> MicroBatching:
        """Without pipelining the replica's batch is one micro-batch unless the knobs cut it (the engine then
        accumulates)."""
        if self.pp == 1 and self.micro_batches is None and self.micro_batch_size is None and self.preset is None:
            return MicroBatching(1, cfg.batch_size)
        return super().batching(cfg)

    def rank_launcher(self, cfg) -> str | None:
        """MPI ranks where AxoNN talks MPI: its pipeline's sends, its loss scaler's overflow vote."""
        return "mpiexec" if self.pp > 1 or cfg.precision == "fp16" else None

    def check(self, cfg) -> None:
        if cfg.precision == "fp16" and not will_use_cuda(cfg.cluster):
            raise ConfigError("strategy axonn: precision=fp16 (AxoNN's loss scaling) runs on GPUs only; use fp32 or "
                              "bf16 on CPU ranks")
        super().check(cfg)

    def setup(self, model: nn.Module, rank: RankContext) -> AxoNNStages:
        return AxoNNStages(self, model, rank)
