"""Data parallelism with Horovod: `hvd.DistributedOptimizer` all-reduces gradients as backward produces them.

Horovod's background thread wakes every `cycle_time_ms`, fuses the gradients that are ready into
buffers of up to `fusion_threshold_mb` and all-reduces each buffer (gloo on CPU); these two are the
`th` of Study J's model. Its ranks are started by horovodrun (`rank_launcher`), which also runs the
rendezvous of Horovod's own gloo context; the training loop's reductions use the torch process group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from suite.dist import DistEnv
from suite.errors import ConfigError
from suite.optim import build_optimizer
from suite.precision import Precision
from suite.strategies.base import Strategy, broadcast_buffers

MIB = 1024 * 1024


@dataclass
class Horovod(Strategy):
    name: str = "horovod"
    fusion_threshold_mb: float = 128.0
    cycle_time_ms: float = 1.0

    rank_launcher: ClassVar[str] = "horovodrun"

    def check(self, cfg) -> None:
        if self.fusion_threshold_mb < 0:
            raise ConfigError(f"strategy horovod needs fusion_threshold_mb >= 0 (0: no fusion), "
                              f"got {self.fusion_threshold_mb}")
        if self.cycle_time_ms <= 0:
            raise ConfigError(f"strategy horovod needs cycle_time_ms > 0, got {self.cycle_time_ms}")

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        import horovod.torch as hvd

        # Read once, by hvd.init; they override what horovodrun's own options put in the environment.
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(self.fusion_threshold_mb * MIB))
        os.environ["HOROVOD_CYCLE_TIME"] = str(self.cycle_time_ms)
        hvd.init()
        if (hvd.rank(), hvd.size()) != (env.rank, env.world_size):
            raise RuntimeError(f"horovod sees rank {hvd.rank()} of {hvd.size()}, the process group "
                               f"rank {env.rank} of {env.world_size}")
        model = model.to(env.device)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model

    def build_optimizer(self, model: nn.Module, cfg) -> torch.optim.Optimizer:
        import horovod.torch as hvd

        # The optimizer starts without state on every rank, so there is no optimizer state to broadcast:
        # hvd.broadcast_optimizer_state would first create it with a zero-gradient step, which weight decay
        # and Adam's step count turn into a different first update than `single` makes.
        return hvd.DistributedOptimizer(build_optimizer(model.parameters(), cfg),
                                        named_parameters=model.named_parameters(), op=hvd.Average)

    def reduce_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Wait for the all-reduces started during backward (counted in backward, as DDP's are)."""
        optimizer.synchronize()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Precision) -> None:
        with optimizer.skip_synchronize():  # already synchronized; also what fp16 loss scaling needs
            precision.step(optimizer)
        optimizer.zero_grad()  # horovod's takes no arguments; it sets the gradients to None as torch's default

    def before_evaluate(self, model: nn.Module, env: DistEnv) -> None:
        broadcast_buffers(model)
