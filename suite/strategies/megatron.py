"""Megatron-LM's tensor (intra-layer) parallelism for GPT-2, with torch.distributed.tensor.parallel.

`tp` consecutive ranks split every block: attention qkv and the MLP up-projection by columns, the
attention output and MLP down-projection by rows, so each block does one all-reduce in forward and
one in backward per sub-layer. Embeddings, LayerNorms and the tied head stay whole on every rank.
`dp = workers / tp` such groups are data-parallel replicas on the other axis of a 2-D device mesh;
each reads its own data shard and they average gradients after backward. Study N's Megatron-intra
is dp=1, Megatron-data is tp=1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from suite.dist import DistEnv
from suite.errors import ConfigError
from suite.memory import local_tensor
from suite.optim import ELEMENTWISE_OPTIMIZERS
from suite.strategies.base import Strategy

BLOCK_PLAN = {"attn.qkv": ColwiseParallel, "attn.proj": RowwiseParallel,
              "mlp.fc": ColwiseParallel, "mlp.proj": RowwiseParallel}


@dataclass
class Megatron(Strategy):
    name: str = "megatron"
    counts_communication: ClassVar[bool] = True
    optimizers: ClassVar[tuple[str, ...]] = ELEMENTWISE_OPTIMIZERS  # parameters are sharded
    checkpoints_activations: ClassVar[bool] = False  # the tensor-parallel plan addresses the plain blocks
    tp: int = 2
    batch_grows_with_tp: bool = True

    def check(self, cfg) -> None:
        net = cfg.network
        if net.arch != "gpt2":
            raise ConfigError(f"strategy megatron splits GPT-2's attention and MLP; network {net.name} ({net.arch}) "
                              "has no such layers")
        if self.tp < 1 or cfg.workers % self.tp:
            raise ConfigError(f"strategy megatron: tp={self.tp} does not divide workers={cfg.workers}")
        if net.n_head % self.tp:
            raise ConfigError(f"strategy megatron: tp={self.tp} does not divide n_head={net.n_head} of {net.name}")

    def dp(self, cfg) -> int:
        return cfg.workers // self.tp

    def global_batch_size(self, cfg) -> int:
        """With `batch_grows_with_tp` (Study N's Megatron-intra) the batch per worker is fixed, so each
        tensor-parallel group trains on batch_size x tp; otherwise each group trains on batch_size."""
        return cfg.batch_size * (cfg.workers if self.batch_grows_with_tp else self.dp(cfg))

    def derived_params(self, cfg) -> dict:
        return {"dp": self.dp(cfg)}

    def data_shards(self, cfg) -> int:
        return self.dp(cfg)

    def data_shard(self, env: DistEnv) -> tuple[int, int]:
        return env.rank // self.tp, env.world_size // self.tp

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        mesh = init_device_mesh(env.device.type, (env.world_size // self.tp, self.tp), mesh_dim_names=("dp", "tp"))
        self.dp_group, self.dp_size = mesh["dp"].get_group(), mesh["dp"].size()
        model = model.to(env.device)
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], {name: style() for name, style in BLOCK_PLAN.items()})
        return model

    def reduce_gradients(self, model: nn.Module) -> None:
        """Average this rank's gradient shards over the replicas that hold the same shards (one all-reduce)."""
        if self.dp_size == 1:
            return
        grads = [local_tensor(p.grad) for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        flat /= self.dp_size
        for grad, chunk in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(chunk.view_as(grad))
