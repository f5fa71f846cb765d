"""Where this process sits in the job, and the process group it joins."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


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


def will_use_cuda(cluster) -> bool:
    """Whether a point's ranks will run on GPUs (`auto` on a remote cluster assumes they will)."""
    if cluster.device != "auto":
        return cluster.device == "cuda"
    return cluster.scheduler != "local" or torch.cuda.is_available()


def resolve_device(requested: str, local_rank: int) -> torch.device:
    """`auto` takes this rank's GPU when CUDA is available, else the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(requested)


def threads_per_worker(configured: int | None, local_workers: int) -> int:
    """CPU intra-op threads of one rank: as configured, else the cores shared out among this node's ranks."""
    return configured or max(1, (os.cpu_count() or 1) // local_workers)


def init_distributed(device: str, threads: int | None) -> DistEnv:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Every strategy runs in a process group, `single` in one of size 1, so the reductions of the
    training loop are the same code for all of them.
    """
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(threads_per_worker(threads, local_world_size))
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(minutes=10),
            device_id=dev if dev.type == "cuda" else None,
        )
    return DistEnv(rank, world_size, local_rank, local_world_size, dev, backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
