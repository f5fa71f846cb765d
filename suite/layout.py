"""How a point's ranks divide the work and where they run: one value, computed before launch and again in every
rank, and the cores, threads and loader processes each rank gets on its node (the same rules for the driver, which
plans and launches, and for the ranks).

A point's ranks form a grid of `dp` data-parallel replicas x `pp` pipeline stages x `cp` context-parallel
ranks x `tp` tensor-parallel ranks. Rank r sits at (replica, stage, cp rank, tp rank) in row-major order, so the
`tp` ranks of a stage are consecutive and a replica's ranks are a consecutive block (Megatron-LM's order; torchtitan's
mesh puts cp between the data-parallel and tensor-parallel dimensions too). Each replica reads its own shard of every
global batch, `mini_batch` samples, cut into `micro_batches` where it is pipelined; every rank of a replica reads the
replica's batch, and each of its `cp` ranks trains on its part of every sequence.
`shard` is how many ranks split the parameters and optimizer states (ZeRO, FSDP), a degree
beside the grid, not one of its axes. PipeDream's replicated stages (`stage_replicas`, e.g. 2-1-1)
are not a grid: stage s runs on its own consecutive ranks, one pipeline (`dp` 1) whose mini-batch
is a round of `micro_batches` that each stage's replicas take round-robin, micro-batch k on its
replica k mod (the stage's ranks). GPipe in one process (torchgpipe) runs its `pp` stages on
devices that process drives: one rank, `pp` devices. Every process group of a point is a
dimension of the device mesh this value builds (`mesh`), so dp x tp and dp x pp are built alike.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig

from suite.errors import ConfigError

MESH_DIMS = ("dp", "pp", "cp", "tp")


@dataclass(frozen=True)
class RankPosition:
    replica: int
    stage: int
    tp_rank: int
    cp_rank: int = 0


@dataclass(frozen=True)
class Layout:
    dp: int  # data-parallel replicas
    mini_batch: int  # samples one replica trains on per step
    pp: int = 1  # pipeline stages per replica
    tp: int = 1  # tensor-parallel ranks per stage
    cp: int = 1  # context-parallel ranks per stage, each training on its part of every sequence
    shard: int = 1  # ranks over which parameters and optimizer states are split (ZeRO, FSDP)
    micro_batches: int = 1  # a replica's mini-batch is cut into these (pipelines; gradient accumulation elsewhere)
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved schedules)
    stages_in_one_process: bool = False  # torchgpipe: one process drives the `pp` stage devices
    v_shape: bool = False  # two chunks a rank in a V (ZBV, DualPipeV: rank r holds chunks r and 2 pp - 1 - r)
    stage_replicas: tuple[int, ...] = ()  # ranks per stage where they differ (PipeDream's 2-1-1); () on the grid

    def __post_init__(self) -> None:
        if min(self.dp, self.pp, self.tp, self.cp, self.shard, self.micro_batches, self.virtual_stages, self.mini_batch,
               *self.stage_replicas) < 1:
            raise ValueError(f"every degree of a layout is positive: {self}")
        if self.mini_batch % self.micro_batches:
            raise ValueError(f"mini-batch {self.mini_batch} does not split into {self.micro_batches} micro-batches")
        if self.stage_replicas and (len(self.stage_replicas) != self.pp or (self.dp, self.tp) != (1, 1)
                                    or any(self.micro_batches % r for r in self.stage_replicas)):
            raise ValueError(f"replicated stages are one pipeline of pp stages whose round of micro-batches each "
                             f"stage's replicas divide: {self}")
        if self.cp > 1 and self.pp > 1:
            raise ValueError(f"context parallelism is laid out without pipeline stages here: {self}")

    def stage_width(self, stage: int) -> int:
        """Ranks that run one pipeline stage's micro-batches: its replicas (the grid's are in pipelines of their own,
        `dp`)."""
        return self.stage_replicas[stage] if self.stage_replicas else self.dp

    @property
    def replication(self) -> str:
        """The stages' replicas as PipeDream writes them: `2-1-1`."""
        return "-".join(str(self.stage_width(s)) for s in range(self.pp))

    def chunk_stage(self, chunk: int) -> int:
        """The pipeline stage (rank of a replica's pipeline) that holds model chunk `chunk`: chunk s on stage
        s % pp (a loop, as interleaved 1F1B places them), or in a V."""
        if self.v_shape and chunk >= self.pp:
            return 2 * self.pp - 1 - chunk
        return chunk % self.pp

    def stage_chunks(self, stage: int) -> list[int]:
        """The model chunks pipeline stage `stage` holds, in the order the network runs them."""
        return [c for c in range(self.pp * self.virtual_stages) if self.chunk_stage(c) == stage]

    @property
    def rank_stages(self) -> int:
        """Pipeline stages that are ranks of their own (1 when one process drives them all)."""
        return 1 if self.stages_in_one_process else self.pp

    @property
    def processes(self) -> int:
        """Ranks the launcher starts."""
        return sum(self.stage_replicas) if self.stage_replicas else self.dp * self.rank_stages * self.cp * self.tp

    @property
    def devices(self) -> int:
        return sum(self.stage_replicas) if self.stage_replicas else self.dp * self.pp * self.cp * self.tp

    @property
    def global_batch(self) -> int:
        return self.dp * self.mini_batch

    @property
    def micro_batch_size(self) -> int:
        return self.mini_batch // self.micro_batches

    def position(self, rank: int) -> RankPosition:
        if self.stage_replicas:
            stage = next(s for s in range(self.pp) if rank < self.rank_of(RankPosition(0, s + 1, 0)))
            return RankPosition(rank - self.rank_of(RankPosition(0, stage, 0)), stage, 0)
        replica, rest = divmod(rank, self.rank_stages * self.cp * self.tp)
        stage, rest = divmod(rest, self.cp * self.tp)
        cp_rank, tp_rank = divmod(rest, self.tp)
        return RankPosition(replica, stage, tp_rank, cp_rank)

    def data_shard(self, rank: int) -> tuple[int, int]:
        """(index, count) of the shard of the training data this rank reads: its replica's (replicated stages are
        one pipeline, which reads all of it)."""
        return (0, 1) if self.stage_replicas else (self.position(rank).replica, self.dp)

    def params(self) -> dict[str, Any]:
        """Recorded with the run (the performance model reads these)."""
        params = {"processes": self.processes, "dp": self.dp, "pp": self.pp, "tp": self.tp, "shard": self.shard,
                  "global_batch_size": self.global_batch, "mini_batch_size": self.mini_batch}
        if self.pp > 1 or self.micro_batches > 1:
            params.update(micro_batches=self.micro_batches, micro_batch_size=self.micro_batch_size,
                          pipeline_stages=self.pp, pipeline_replicas=self.dp, virtual_stages=self.virtual_stages)
        if self.stage_replicas:
            params["stage_replicas"] = self.replication
        if self.cp > 1:
            params["cp"] = self.cp
        return params

    def rank_of(self, place: RankPosition) -> int:
        if self.stage_replicas:
            return sum(self.stage_replicas[:place.stage]) + place.replica
        return ((place.replica * self.rank_stages + place.stage) * self.cp + place.cp_rank) * self.tp + place.tp_rank

    def runs(self, place: RankPosition) -> range:
        """The micro-batches of a mini-batch the rank at `place` runs: all of its replica's on the grid; with
        replicated stages, its share of the round."""
        return range(place.replica, self.micro_batches, self.stage_width(place.stage)) if self.stage_replicas \
            else range(self.micro_batches)

    def holder(self, place: RankPosition, stage: int, micro_batch: int) -> int:
        """The rank that runs micro-batch `micro_batch` (counted from the first) on `stage` for the rank at `place`:
        on the grid its own replica's, at its tensor-parallel index; with replicated stages, that stage's replica
        micro_batch mod its ranks."""
        if self.stage_replicas:
            return self.rank_of(RankPosition(micro_batch % self.stage_replicas[stage], stage, 0))
        return self.rank_of(replace(place, stage=stage))

    def replica_subgroup(self, rank: int, stages: set[int]):
        """The process group of the ranks of `rank`'s replica on `stages` at its tensor-parallel index (e.g. those
        holding copies of a tied weight, split alike): one group per replica and index, all created by every rank;
        None when `rank` is not in its group."""
        import torch.distributed as dist

        mine = None
        here = self.position(rank)
        for replica in range(self.dp):
            for tp_rank in range(self.tp):
                group = dist.new_group(sorted(self.rank_of(RankPosition(replica, s, tp_rank)) for s in stages))
                if (replica, tp_rank) == (here.replica, here.tp_rank) and here.stage in stages:
                    mine = group
        return mine

    def stage_channels(self, rank: int) -> dict[tuple[int, int], Any]:
        """A process group for each direction between consecutive stages of a replica, keyed (sender, receiver):
        activations go down one, gradients up the other. On one NCCL communicator a rank's sends and receives run
        in the order they were posted, so two stages that each post a send before the receive the other waits for
        (PipeDream's steady state) would wait on each other forever; gloo buffers sends and never shows it. Every
        rank creates all of them; the result holds the channels `rank` sends or receives on."""
        import torch.distributed as dist

        mine = {}
        for upper, lower in self.neighbours():
            for channel in ((upper, lower), (lower, upper)):
                group = dist.new_group(sorted(channel))
                if rank in channel:
                    mine[channel] = group
        return mine

    def neighbours(self) -> list[tuple[int, int]]:
        """Every pair of ranks on consecutive stages that exchange activations (upper stage first). With replicated
        stages, replicas i and j of stages r and r' wide share micro-batches k = i mod r = j mod r' when i and j
        agree mod gcd(r, r') (the Chinese remainder theorem)."""
        if self.stage_replicas:
            return [(self.rank_of(RankPosition(i, s, 0)), self.rank_of(RankPosition(j, s + 1, 0)))
                    for s, (upper, lower) in enumerate(itertools.pairwise(self.stage_replicas))
                    for i in range(upper) for j in range(lower) if (i - j) % math.gcd(upper, lower) == 0]
        return [(self.rank_of(RankPosition(replica, stage, tp_rank)),
                 self.rank_of(RankPosition(replica, stage + 1, tp_rank)))
                for replica in range(self.dp) for tp_rank in range(self.tp) for stage in range(self.rank_stages - 1)]

    def stage_groups(self, rank: int):
        """The process group of each stage's replicas (every rank creates all of them); the one of `rank`'s stage."""
        import torch.distributed as dist

        mine = None
        for stage in range(self.pp):
            group = dist.new_group([self.rank_of(RankPosition(j, stage, 0)) for j in range(self.stage_width(stage))])
            if self.position(rank).stage == stage:
                mine = group
        return mine

    def mesh(self, device_type: str):
        """The point's device mesh, dimensions `dp`, `pp`, `cp`, `tp` (sizes 1 included); every rank calls it."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, (self.dp, self.rank_stages, self.cp, self.tp), mesh_dim_names=MESH_DIMS)


def divisors(n: int) -> list[int]:
    """The sizes a dimension of `n` ranks can take."""
    return [d for d in range(1, n + 1) if n % d == 0]


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
