"""Where a point's ranks run, as both the driver (planning, launching) and the ranks see it."""

from __future__ import annotations

import copy
import os

from omegaconf import DictConfig

from suite.errors import ConfigError


def will_use_cuda(cluster) -> bool:
    """Whether a point's ranks will run on GPUs (`auto` on a remote cluster assumes they will)."""
    if cluster.device != "auto":
        return cluster.device == "cuda"
    if cluster.scheduler != "local":
        return True
    import torch  # here, not above: what records a job's point (suite.records.record) never needs torch

    return torch.cuda.is_available()


def for_ranks(cfg: DictConfig) -> DictConfig:
    """The config a point's ranks read: the point's, with `cluster.device=auto` decided as the driver planned (and,
    on a batch cluster, asked for GPUs), so that a rank that finds no GPU fails instead of training on its CPU."""
    ranks = copy.deepcopy(cfg)
    ranks.cluster.device = "cuda" if will_use_cuda(cfg.cluster) else "cpu"
    return ranks


def threads_per_worker(configured: int | None, local_workers: int) -> int:
    """CPU intra-op threads of one rank: as configured, else the cores shared out among this node's ranks."""
    return configured or max(1, (os.cpu_count() or 1) // local_workers)


def node_threads(rank_threads: int, local_workers: int) -> int:
    """The intra-op threads a CPU node's ranks run at once: theirs together, at most its cores (more threads than
    cores only take turns)."""
    return min(rank_threads * local_workers, os.cpu_count() or 1)


# Study N: "4 worker processes by default" for every framework (and PyTorch's ImageNet example's default).
GPU_LOADER_WORKERS = 4


def cores_per_rank(cluster) -> int:
    """CPU cores the scheduler gives each rank: as configured, else the node's cores shared out among its GPUs.
    Neither known: ConfigError, as one core would feed a GPU and its data loader workers alike."""
    cores = cluster.job.cores_per_worker or (cluster.hardware.cores_per_node or 0) // cluster.workers_per_node
    if not cores:
        raise ConfigError(f"cluster {cluster.name}: the CPU cores of each rank are unknown: set "
                          "cluster.hardware.cores_per_node (shared out among its workers_per_node) or "
                          "cluster.job.cores_per_worker")
    return cores


def loader_workers(cfg: DictConfig) -> int:
    """`dataset.loader_workers`, or where it is null as the data needs them: on GPUs 4 worker processes per rank,
    at most the rank's cores less the one that drives its GPU; on CPU none, the ranks' threads using every core."""
    if cfg.dataset.loader_workers is not None:
        return cfg.dataset.loader_workers
    if not will_use_cuda(cfg.cluster):
        return 0
    if cfg.cluster.scheduler == "local":
        cores = (os.cpu_count() or 1) // min(cfg.workers, cfg.cluster.workers_per_node)
    else:
        try:
            cores = cores_per_rank(cfg.cluster)
        except ConfigError:  # said when its job script is written; the loader takes Study N's count meanwhile
            cores = GPU_LOADER_WORKERS + 1
    return max(min(GPU_LOADER_WORKERS, cores - 1), 0)
