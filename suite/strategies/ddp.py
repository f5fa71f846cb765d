"""Data parallelism with torch DistributedDataParallel (bucketed all-reduce overlapped with backward)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from suite.dist import DistEnv, will_use_cuda
from suite.errors import ConfigError
from suite.strategies.base import Strategy, broadcast_buffers


@dataclass
class DDP(Strategy):
    name: str = "ddp"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    forward_sync_buffers: bool = True
    sync_batchnorm: bool = False

    def check(self, cfg) -> None:
        if self.bucket_cap_mb <= 0:
            raise ConfigError(f"strategy ddp needs bucket_cap_mb > 0, got {self.bucket_cap_mb}")
        if self.sync_batchnorm and not will_use_cuda(cfg.cluster):
            raise ConfigError("strategy ddp: sync_batchnorm works on GPUs only (torch's SyncBatchNorm)")

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        model = model.to(env.device)
        if self.sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return DistributedDataParallel(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            static_graph=self.static_graph,
            find_unused_parameters=self.find_unused_parameters,
            forward_sync_buffers=self.forward_sync_buffers,
        )

    def before_evaluate(self, model: nn.Module, env: DistEnv) -> None:
        broadcast_buffers(model.module)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module
