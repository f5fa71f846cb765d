"""GPipe as both studies ran it: torchgpipe, one process driving every stage on its own device.

`workers` counts devices (GPUs, or `cpu` entries on a CPU machine), so the speedup table compares
it with data parallelism on the same number of devices; the launcher starts one process. On CPU
every `cpu` entry shares one torchgpipe worker thread, so the stages run one after the other: the
math is GPipe's, the overlap is not. Single-node by nature.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from torchgpipe import GPipe as TorchGPipe

from suite.dist import DistEnv
from suite.errors import ConfigError
from suite.models.layers import flatten_layers, tied_parameters
from suite.pipeline.partition import cut, sum_grads, untie
from suite.precision import Precision
from suite.strategies.base import LossFn
from suite.strategies.pipeline import Pipeline
from suite.timing import PhaseTimer

CHECKPOINT_MODES = ("always", "except_last", "never")


@dataclass
class GPipe(Pipeline):
    name: str = "gpipe"
    devices: list[str] | None = None  # None: cuda:0..workers-1 on GPUs, else `workers` x "cpu"
    checkpoint: str = "except_last"  # torchgpipe's activation recomputation: always | except_last | never

    def stages(self, cfg) -> int:
        return cfg.workers

    def processes(self, cfg) -> int:
        return 1

    def check(self, cfg) -> None:
        if self.checkpoint not in CHECKPOINT_MODES:
            raise ConfigError(f"strategy gpipe: checkpoint={self.checkpoint} is not one of "
                              f"{', '.join(CHECKPOINT_MODES)}")
        if self.devices is not None and len(self.devices) != cfg.workers:
            raise ConfigError(f"strategy gpipe: {len(self.devices)} devices listed but workers={cfg.workers} "
                              "(workers counts the devices)")
        if cfg.nodes > 1:
            raise ConfigError(f"strategy gpipe (torchgpipe) drives all its devices from one process on one node, "
                              f"but workers={cfg.workers} needs {cfg.nodes} nodes; use gpipe_dist across nodes")
        super().check(cfg)

    def _devices(self, env: DistEnv, count: int) -> list[torch.device]:
        if self.devices is not None:
            return [torch.device(d) for d in self.devices]
        if env.device.type == "cuda":
            return [torch.device("cuda", i) for i in range(count)]
        return [torch.device("cpu")] * count

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        layers = flatten_layers(model)
        self.tied = untie(layers, tied_parameters(layers))
        sizes = self._stage_sizes(layers, cfg, env)
        groups = cut(layers, sizes)
        self.layers = [layer for group in groups for layer in group]
        self._micro_batches = self.batching(cfg).micro_batches
        self.timer: PhaseTimer | None = None
        self.stage_devices = self._devices(env, len(sizes))
        pipe = TorchGPipe(nn.Sequential(*(layer.module for group in groups for layer in group)), balance=sizes,
                          devices=self.stage_devices, chunks=self._micro_batches, checkpoint=self.checkpoint)
        for index, partition in enumerate(pipe.partitions):
            self._time_partition(partition, index)
        return pipe

    def _time_partition(self, partition: nn.Module, index: int) -> None:
        """Host-clock timers around each partition's forward and backward (CPU; on GPUs the clock would
        not cover queued kernels, so stage times are only taken on CPU)."""
        started: dict[str, float] = {}

        def start(kind: str):
            def hook(*_):
                started[kind] = time.perf_counter()
            return hook

        def stop(kind: str):
            def hook(*_):
                if self.timer is not None and self.timer.enabled and kind in started:
                    elapsed = time.perf_counter() - started.pop(kind)
                    self.timer.totals[kind] += elapsed
                    self.timer.totals[f"stage{index}.{kind}"] += elapsed
            return hook

        if self.stage_devices[index].type == "cpu":
            partition.register_forward_pre_hook(start("forward"))
            partition.register_forward_hook(stop("forward"))
            partition.register_full_backward_pre_hook(start("backward"))
            partition.register_full_backward_hook(stop("backward"))

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                   targets: torch.Tensor, loss_fn: LossFn, precision: Precision, timer: PhaseTimer) -> torch.Tensor:
        self.timer = timer
        with timer.phase("pipeline"):
            with precision.autocast():
                outputs = model(inputs.to(model.devices[0]))
                loss = loss_fn(outputs, targets.to(outputs.device))
            precision.backward(loss)
            for copies in self.tied:
                sum_grads(copies)
        with timer.phase("optimizer"):
            precision.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def forward(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return model(inputs.to(model.devices[0]))

    def stage_peak_memory(self, memory_by_rank: list[dict[str, float]]) -> dict[int, float]:
        if self.stage_devices[0].type != "cuda":
            return {}  # the stages share one process's host memory: not separable
        return {i: torch.cuda.max_memory_reserved(d) / 2**20 for i, d in enumerate(self.stage_devices)}

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {name: value for layer in self.layers for name, value in layer.named_state().items()}
