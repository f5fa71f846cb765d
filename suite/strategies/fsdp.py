"""Fully sharded data parallelism with torch FSDP2 (`fully_shard`), one unit per layer plus the root.

Each layer of the network (a GPT-2 block, a ResNet block, a VGG convolution; `suite.models.layers`)
is its own unit, gathered just before it runs; the root unit holds what is left (GPT-2's embeddings,
final LayerNorm and the tied head). `reshard_after_forward` true frees a unit's gathered parameters
after its forward and gathers them again for backward (ZeRO-3-like); false keeps them until the
step (ZeRO-2-like: optimizer states and gradients sharded, parameters whole during a step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from suite.dist import DistEnv
from suite.models.layers import block_layers
from suite.optim import ELEMENTWISE_OPTIMIZERS
from suite.strategies.base import Strategy, broadcast_buffers


@dataclass
class FSDP(Strategy):
    name: str = "fsdp"
    counts_communication: ClassVar[bool] = True
    optimizers: ClassVar[tuple[str, ...]] = ELEMENTWISE_OPTIMIZERS  # parameters are sharded
    reshard_after_forward: bool = True

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        model = model.to(env.device)
        mesh = init_device_mesh(env.device.type, (env.world_size,))
        for layer in block_layers(model):
            fully_shard(layer.module, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        return fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward)

    def before_evaluate(self, model: nn.Module, env: DistEnv) -> None:
        broadcast_buffers(model)
