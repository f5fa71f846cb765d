"""Data parallelism with Horovod: `hvd.DistributedOptimizer` all-reduces gradients as backward produces them.

Horovod's background thread wakes every `cycle_time_ms`, fuses the gradients that are ready into
buffers of up to `fusion_threshold_mb` and all-reduces each buffer (gloo on CPU); these two are the
`th` of Study J's model. Its ranks are started by horovodrun (`rank_launcher`), which also runs the
rendezvous of Horovod's own gloo context; the training loop's reductions use the torch process group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from suite.errors import BadValue
from suite.runtime.numerics import build_optimizer
from suite.shared_names import Family
from suite.strategies.base import DataParallel, GradientSync, Library, RankContext, Strategy

MIB = 1024 * 1024


class HorovodOptimizer(DataParallel):
    """The shared step around `hvd.DistributedOptimizer`, whose all-reduces start during backward."""

    def backward(self, loss: torch.Tensor) -> None:
        super().backward(loss)
        self.optimizer.synchronize()  # wait for the all-reduces (counted in backward, as DDP's are)

    def effective_settings(self) -> dict[str, Any]:
        """Beside the optimizer and precision: where Horovod reduces this rank's gradients (NCCL on the GPU only
        if it was built with it, else staged through host memory to gloo or MPI) and which controller negotiates."""
        import horovod.torch as hvd

        controller = "gloo" if hvd.gloo_enabled() else "mpi"
        if self.rank.env.device.type != "cuda":
            operations = controller
        else:
            operations = "nccl" if hvd.nccl_built() else f"{controller}, staged through host memory"
        return {**super().effective_settings(), "horovod.operations": operations, "horovod.controller": controller}

    def step(self) -> None:
        with self.optimizer.skip_synchronize():  # already synchronized; also what fp16 loss scaling needs
            self.rank.precision.step(self.optimizer)
        self.optimizer.zero_grad()  # horovod's takes no arguments; it sets the gradients to None as torch's default


@dataclass(frozen=True)
class Horovod(Strategy):
    name: str = "horovod"
    family: ClassVar[Family] = Family.replicated
    label: ClassVar[str] = "Horovod"
    base_memory_of: ClassVar[str] = "horovod"  # its library's rank, not DDP's
    requires: ClassVar[tuple[Library, ...]] = (Library("Horovod", "horovod", "horovod", ("horovodrun",)),)
    fusion_threshold_mb: float = 128.0
    cycle_time_ms: float = 1.0

    def rank_launcher(self, cfg) -> str:
        return "horovodrun"

    def check(self, cfg) -> None:
        if self.fusion_threshold_mb < 0:
            raise BadValue(f"strategy horovod needs fusion_threshold_mb >= 0 (0: no fusion), "
                              f"got {self.fusion_threshold_mb}")
        if self.cycle_time_ms <= 0:
            raise BadValue(f"strategy horovod needs cycle_time_ms > 0, got {self.cycle_time_ms}")

    def gradient_sync(self, dp: int) -> GradientSync:
        return GradientSync(self.fusion_threshold_mb * MIB, cycle_s=self.cycle_time_ms / 1000)

    def setup(self, model: nn.Module, rank: RankContext) -> HorovodOptimizer:
        import horovod.torch as hvd

        env = rank.env
        # Read once, by hvd.init; they override what horovodrun's own options put in the environment.
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(self.fusion_threshold_mb * MIB))
        os.environ["HOROVOD_CYCLE_TIME"] = str(self.cycle_time_ms)
        hvd.init()
        if (hvd.rank(), hvd.size()) != (env.rank, env.world_size):
            raise RuntimeError(f"horovod sees rank {hvd.rank()} of {hvd.size()}, the process group "
                               f"rank {env.rank} of {env.world_size}")
        model = model.to(env.device)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # The optimizer starts without state on every rank, so there is no optimizer state to broadcast:
        # hvd.broadcast_optimizer_state would first create it with a zero-gradient step, which weight decay
        # and Adam's step count turn into a different first update than `single` makes.
        optimizer = hvd.DistributedOptimizer(build_optimizer(model.parameters(), rank.cfg.optimizer),
                                             named_parameters=model.named_parameters(), op=hvd.Average)
        return HorovodOptimizer(rank, model, optimizer, sync_buffers=True)
