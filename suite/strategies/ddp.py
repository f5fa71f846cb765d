"""Data parallelism with torch DistributedDataParallel (bucketed all-reduce overlapped with backward),
optionally compressing each gradient bucket before its all-reduce (`grad_compression`)."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import ClassVar

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from suite.errors import BadValue, ConfigError
from suite.layout import will_use_cuda
from suite.runtime.numerics import build_optimizer
from suite.shared_names import Family, GradCompression
from suite.strategies.base import DataParallel, GradientSync, RankContext, Strategy, Supports

MIB = 2**20
FIRST_BUCKET_BYTES = 1 * MIB  # torch DDP closes its first gradient bucket early (dist._DEFAULT_FIRST_BUCKET_BYTES)

# torch 2.14 renamed `broadcast_buffers`; an older torch (a GPU machine's own) knows only the old name.
SYNC_BUFFERS = next(name for name in ("forward_sync_buffers", "broadcast_buffers")
                    if name in inspect.signature(DistributedDataParallel).parameters)
CAST_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


def apply_grad_compression(model: DistributedDataParallel, compression) -> None:
    """Register the DDP communication hook of `compression` (a GradCompressionConfig): buckets cast to fp16 or
    bf16 for the all-reduce, or PowerSGD's rank-r approximation of each gradient matrix (with error feedback)."""
    if compression.name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=compression.rank,
                                            start_powerSGD_iter=compression.start_iter)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif compression.name != "none":
        model.register_comm_hook(None, CAST_HOOKS[compression.name])


@dataclass(frozen=True)
class DDP(Strategy):
    name: str = "ddp"
    family: ClassVar[Family] = Family.replicated
    label: ClassVar[str] = "DDP"
    # Gradient accumulation all-reduces once per step, in the last micro-batch's backward (`no_sync` before it).
    supports: ClassVar[Supports] = Supports(counts_communication=True, grad_compressions=tuple(GradCompression),
                                            grad_accum=True, fp8=True, compile=True)
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    forward_sync_buffers: bool = True
    sync_batchnorm: bool = False

    def check(self, cfg) -> None:
        if self.bucket_cap_mb <= 0:
            raise BadValue(f"strategy ddp needs bucket_cap_mb > 0, got {self.bucket_cap_mb}")
        if self.sync_batchnorm and not will_use_cuda(cfg.cluster):
            raise ConfigError("strategy ddp: sync_batchnorm works on GPUs only (torch's SyncBatchNorm)")

    def gradient_sync(self, dp: int) -> GradientSync:
        return GradientSync(self.bucket_cap_mb * MIB, FIRST_BUCKET_BYTES,
                            buffers_each_forward=self.forward_sync_buffers,
                            bucket_copy=not self.gradient_as_bucket_view)

    def setup(self, model: nn.Module, rank: RankContext) -> DataParallel:
        device = rank.env.device
        model = model.to(device)
        if self.sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            static_graph=self.static_graph,
            find_unused_parameters=self.find_unused_parameters,
            **{SYNC_BUFFERS: self.forward_sync_buffers},
        )
        apply_grad_compression(model, rank.cfg.grad_compression)
        return DDPRuntime(rank, model, build_optimizer(model.parameters(), rank.cfg.optimizer), plain=model.module,
                          sync_buffers=True)


class DDPRuntime(DataParallel):
    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradients accumulate locally (`no_sync`) until the last micro-batch, whose backward all-reduces their sum,
        as torch's DDP documents gradient accumulation."""
        return contextlib.nullcontext() if last else self.model.no_sync()
