"""Where this process sits in the job, and the process group it joins."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from suite.errors import ConfigError
from suite.launch_timing import mark
from suite.layout import threads_per_worker
from suite.runtime.gpu_build import missing_gpu_code
from suite.runtime.gpu_query import nvidia_driver
from suite.runtime.rendezvous import Rendezvous
from suite.runtime.torch_api import INIT_TAKES_DEVICE_ID


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(requested: str, local_rank: int, gpu_order: list[int] | None = None) -> torch.device:
    """This rank's device. A point's ranks get `cuda` or `cpu`, as the driver planned the point
    (`suite.layout.for_ranks`); `auto`, from a process that plans its own point, takes a GPU when CUDA is
    available, else the CPU. A rank's GPU is its local rank's entry of `gpu_order` (the cluster's GPU numbering near
    each rank's cores), else its local rank's number; a rank that sees no GPU is refused in one line."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        visible = torch.cuda.device_count()
        if not visible:
            raise ConfigError(no_gpu_seen())
        gpu = gpu_order[local_rank % len(gpu_order)] if gpu_order else local_rank
        return torch.device("cuda", gpu % visible)
    return torch.device(requested)


def no_gpu_seen() -> str:
    """Why a rank meant to run on a GPU cannot, with what decides which GPUs it sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU-only build)"
    return (f"the point runs on GPUs (cluster.device=cuda, or auto on a machine or cluster with GPUs) but this rank "
            f"sees none: CUDA_VISIBLE_DEVICES={'unset' if visible is None else repr(visible)}, {nvidia_driver()}, "
            f"torch {torch.__version__} built for {build}")


def init_distributed(device: str, threads: int | None, rendezvous: Rendezvous, share_gpus: bool = False,
                     gpu_order: list[int] | None = None) -> DistEnv:
    """Join the process group of the job that `rendezvous` describes (see `suite.runtime.rendezvous`).

    Every strategy runs in a process group, `single` in one of size 1, so the reductions of the
    training loop are the same code for all of them. GPUs take NCCL, unless ranks share them (gloo).
    """
    r = rendezvous
    mark("joining", r.rank)
    dev = resolve_device(device, r.local_rank, gpu_order)
    if dev.type == "cuda":
        missing = missing_gpu_code(torch.cuda.get_device_capability(dev), torch.cuda.get_arch_list(),
                                   torch.version.cuda)
        if missing:
            raise ConfigError(missing)
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(threads_per_worker(threads, r.local_world_size))
    backend = "nccl" if dev.type == "cuda" and not share_gpus else "gloo"
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", r.master_addr)
        os.environ.setdefault("MASTER_PORT", str(r.master_port))
        # One rank meets nobody: an in-process store, no port to listen on (a free port the launcher picked can be
        # taken by another sweep on the machine before the rank binds it: EADDRINUSE). More ranks: env://, so that
        # under torchrun they join its agent's store instead of opening another one.
        store = {"store": dist.HashStore()} if r.world_size == 1 else {}
        dist.init_process_group(
            backend, rank=r.rank, world_size=r.world_size, timeout=timedelta(minutes=10), **store,
            **({"device_id": dev} if backend == "nccl" and INIT_TAKES_DEVICE_ID else {}),
        )
    mark("joined", r.rank)
    return DistEnv(r.rank, r.world_size, r.local_rank, r.local_world_size, dev, backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_flat(tensors: list[torch.Tensor], group=None, average_over: int = 1) -> None:
    """One flattened all-reduce of `tensors` (summed, or averaged over `average_over`), written back in place."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    if average_over > 1:
        flat /= average_over
    for tensor, chunk in zip(tensors, flat.split([t.numel() for t in tensors])):
        tensor.copy_(chunk.view_as(tensor))


def broadcast_batch(inputs: torch.Tensor, targets: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of token ids (int64 [batch, sequence] inputs and targets) that the group's first rank loaded, on
    every rank of the group, as Megatron-LM's `broadcast_data` sends it: its shape, then inputs and targets in one
    buffer. The other ranks pass empty tensors on their device."""
    source = dist.get_global_rank(group, 0)
    sending = dist.get_rank() == source
    shape = torch.tensor(inputs.shape if sending else (0, 0), dtype=torch.int64, device=inputs.device)
    dist.broadcast(shape, source, group=group)
    batch = (torch.stack((inputs, targets)) if sending else
             torch.empty((2, *shape.tolist()), dtype=torch.int64, device=inputs.device))
    dist.broadcast(batch, source, group=group)
    inputs, targets = batch.unbind()
    return inputs, targets
