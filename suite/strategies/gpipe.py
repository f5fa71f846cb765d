"""GPipe as both studies ran it: torchgpipe, one process driving every stage on its own device.

`workers` counts devices (GPUs, or `cpu` entries on a CPU machine), so the speedup table compares
it with data parallelism on the same number of devices; the launcher starts one process. On CPU
every `cpu` entry shares one torchgpipe worker thread, so the stages run one after the other: the
math is GPipe's, the overlap is not. Single-node by nature.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from torchgpipe import GPipe as TorchGPipe

from suite.errors import ConfigError
from suite.layout import Layout
from suite.models.layers import Layer, flatten_layers, tied_parameters
from suite.pipeline.partition import StageModule, cut, sum_grads, untie
from suite.runtime.numerics import AutocastForward, build_optimizer
from suite.shared_names import Family
from suite.strategies.base import RankContext, Runtime
from suite.strategies.pipeline import Pipeline, partition_settings, pipeline_metrics


class TorchGPipeRuntime(Runtime):
    """torchgpipe's GPipe over the stage devices of this one process; copies of a tied weight on different
    stages (untied to live on their own device) sum their gradients before the step."""

    def __init__(self, rank: RankContext, pipe: TorchGPipe, groups: list[list[Layer]],
                 tied: list[list[nn.Parameter]]) -> None:
        super().__init__(rank, pipe, build_optimizer(pipe.parameters(), rank.cfg.optimizer))
        self.layers, self.tied = [layer for group in groups for layer in group], tied
        self.stage_layers = [len(group) for group in groups]
        rank.timer.devices = self.devices
        for index, partition in enumerate(pipe.partitions):
            if pipe.devices[index].type == "cpu":
                self._time_partition(partition, index)

    @property
    def devices(self) -> list[torch.device]:
        return list(dict.fromkeys(self.model.devices))  # partitions may share a device (cluster.share_gpus, CPU)

    def effective_settings(self) -> dict[str, Any]:
        return {**super().effective_settings(), **partition_settings(self.stage_layers)}

    def _time_partition(self, partition: nn.Module, index: int) -> None:
        """Host-clock timers around each partition's forward and backward, from module hooks (torchgpipe runs
        the partitions itself); only on CPU, where the host clock covers the work."""
        started: dict[str, float] = {}
        timer = self.rank.timer

        def start(kind: str):
            def hook(*_):
                started[kind] = time.perf_counter()
            return hook

        def stop(kind: str):
            def hook(*_):
                if kind in started:
                    timer.add(time.perf_counter() - started.pop(kind), kind, f"stage{index}.{kind}")
            return hook

        partition.register_forward_pre_hook(start("forward"))
        partition.register_forward_hook(stop("forward"))
        partition.register_full_backward_pre_hook(start("backward"))
        partition.register_full_backward_hook(stop("backward"))

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        timer, precision = self.rank.timer, self.rank.precision
        with timer.phase("pipeline"):
            with precision.autocast():  # for the loss: the stages enter it on their own threads (AutocastForward)
                outputs = self.model(inputs.to(self.model.devices[0]))
                loss = self.rank.loss_fn(outputs, targets.to(outputs.device))
            precision.backward(loss)
            for copies in self.tied:
                sum_grads(copies)
        with timer.phase("optimizer"):
            precision.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs.to(self.model.devices[0]))

    def summary_metrics(self, memory_by_rank: list[dict[str, float]]) -> dict[str, float]:
        # Each stage's GPU as this one rank measured it; on CPU the stages share the host memory: not separable.
        by_device = memory_by_rank[0].get("by_device", {})
        peaks = {i: by_device[str(d)]["peak_memory_mb"] for i, d in enumerate(self.model.devices)
                 if str(d) in by_device}
        layout = self.rank.layout
        return pipeline_metrics(self.rank.timer, layout.pp, layout.micro_batches, True, lambda s: s, peaks)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {name: value for layer in self.layers for name, value in layer.named_state().items()}


@dataclass(frozen=True)
class GPipe(Pipeline):
    name: str = "gpipe"
    family: ClassVar[Family] = Family.flushed_pipeline
    label: ClassVar[str] = "TorchGPipe"
    forwards_all_first: ClassVar[bool] = True
    devices: list[str] | None = None  # None: cuda:0..workers-1 on GPUs, else `workers` x "cpu"
    checkpoint: Literal["always", "except_last", "never"] = "except_last"  # torchgpipe's activation recomputation

    @classmethod
    def probes(cls) -> dict[str, list[str]]:
        return {cls.name: ["strategy.micro_batches=4"]}

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        """One pipeline of every rank (torchgpipe's devices are one process's)."""
        return [[f"strategy.micro_batches={m}"] for m in cls.micro_batch_counts(workers, batch)] if workers > 1 else []

    def stages(self, cfg) -> int:
        return cfg.workers

    def layout(self, cfg) -> Layout:
        batching = self.batching(cfg)
        return Layout(dp=1, pp=cfg.workers, mini_batch=batching.mini_batch, micro_batches=batching.micro_batches,
                      stages_in_one_process=True)

    def check(self, cfg) -> None:
        if self.devices is not None and len(self.devices) != cfg.workers:
            raise ConfigError(f"strategy gpipe: {len(self.devices)} devices listed but workers={cfg.workers} "
                              "(workers counts the devices)")
        if cfg.nodes > 1:
            raise ConfigError(f"strategy gpipe (torchgpipe) drives all its devices from one process on one node, "
                              f"but workers={cfg.workers} needs {cfg.nodes} nodes; use gpipe_dist across nodes")
        super().check(cfg)

    def recomputed_forward_share(self, layout: Layout) -> float:
        """torchgpipe checkpoints every micro-batch (`always`), all but the last (`except_last`) or none."""
        checkpointed = {"always": layout.micro_batches, "except_last": layout.micro_batches - 1, "never": 0}
        return checkpointed[self.checkpoint] / layout.micro_batches

    def _devices(self, device: torch.device, count: int, share_gpus: bool) -> list[torch.device]:
        if self.devices is not None:
            return [torch.device(d) for d in self.devices]
        if device.type == "cuda":  # more partitions than GPUs only where the cluster shares them
            visible = torch.cuda.device_count()
            if count > visible and not share_gpus:
                raise ConfigError(f"strategy gpipe: {count} partitions but this process sees {visible} GPU(s); "
                                  "give it a GPU per partition, or set cluster.share_gpus=true to share them")
            return [torch.device("cuda", i % visible) for i in range(count)]
        return [torch.device("cpu")] * count

    def setup(self, model: nn.Module, rank: RankContext) -> TorchGPipeRuntime:
        layers = flatten_layers(model)
        tied = untie(layers, tied_parameters(layers))
        sizes = self.stage_sizes(layers, rank)
        groups = cut(layers, sizes)
        devices = self._devices(rank.env.device, len(sizes), rank.cfg.cluster.share_gpus)
        stages = nn.Sequential(*(AutocastForward(StageModule(group), rank.precision) for group in groups))
        pipe = TorchGPipe(stages, balance=[1] * len(stages), devices=devices, chunks=rank.layout.micro_batches,
                          checkpoint=self.checkpoint)
        return TorchGPipeRuntime(rank, pipe, groups, tied)
