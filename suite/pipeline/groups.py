"""A pipelined rank's process groups (`PipelineGroups`), from where it sits in DP x PP x TP (the layout's `dp`,
`pp` and `tp` mesh dimensions): `pp x tp` consecutive ranks form one pipeline, `dp = world / (pp x tp)` replicas;
each stage is `tp` consecutive ranks, which split its blocks (tensor parallelism) and send to the ranks of the same
tensor-parallel index on the neighbouring stages.

Each stage's replicas all-reduce their gradients in a data-parallel group; the ranks that hold copies of one tied
weight (GPT-2's embedding on the first stage, the LM head on the last) sum its gradient in a tie group, as
Megatron-LM does. PipeDream's replicated stages (Layout.stage_replicas) are no grid and have no mesh: a stage's
replicas form its data-parallel group, and the neighbour a micro-batch goes to depends on the micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from suite.layout import Layout, RankPosition
from suite.runtime.dist import all_reduce_flat
from suite.runtime.metrics import local_tensor


def all_reduce_grads(params: list[nn.Parameter], group, average_over: int = 1) -> None:
    """One flattened all-reduce of the gradients of `params` (missing gradients count as zero)."""
    if not params:
        return
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    all_reduce_flat([local_tensor(p.grad) for p in params], group, average_over)


@dataclass
class PipelineGroups:
    layout: Layout
    rank: int
    mesh: object  # the point's device mesh (`dp`, `pp`, `tp`); None with replicated stages
    pipe_group: object  # the stages of this replica (at this rank's tensor-parallel index); None: replicated stages
    dp_group: object  # this stage's replicas
    tie_group: object = None  # the ranks of this replica holding a tied weight; None when not one of them
    channels: dict[tuple[int, int], object] = field(default_factory=dict)  # (sender, receiver) -> its own group

    @classmethod
    def build(cls, layout: Layout, rank: int, tie_stage_ranks: set[int], device_type: str,
              channels: bool = False) -> PipelineGroups:
        """Every rank calls this with the same arguments, in the same order (it creates process groups).
        `channels`: a group of its own for each direction between neighbouring stages (Layout.stage_channels)."""
        if layout.stage_replicas:
            return cls(layout, rank, None, None, layout.stage_groups(rank),
                       channels=layout.stage_channels(rank) if channels else {})
        mesh = layout.mesh(device_type)
        tie_group = layout.replica_subgroup(rank, tie_stage_ranks) if len(tie_stage_ranks) > 1 else None
        return cls(layout, rank, mesh, mesh["pp"].get_group(), mesh["dp"].get_group(), tie_group,
                   layout.stage_channels(rank) if channels else {})

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def dp(self) -> int:
        """Replicas of this rank's stage, which average its gradients."""
        return self.layout.stage_width(self.stage_rank)

    @property
    def tp_group(self):
        """This stage's tensor-parallel ranks (None without a mesh: one rank per stage)."""
        return self.mesh["tp"].get_group() if self.mesh is not None else None

    @property
    def position(self) -> RankPosition:
        return self.layout.position(self.rank)

    @property
    def stage_rank(self) -> int:
        return self.position.stage

    @property
    def replica(self) -> int:
        return self.position.replica

    @property
    def is_first(self) -> bool:
        return self.stage_rank == 0

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the network's last chunk (the last stage; in a V, the first)."""
        return self.layout.chunk_stage(self.pp * self.layout.virtual_stages - 1) == self.stage_rank

    def peer(self, stage_rank: int, micro_batch: int = 0) -> int:
        """Global rank that runs micro-batch `micro_batch` (of the stream, see `stream_index`) on stage rank
        `stage_rank`: on the grid this replica's, at this rank's tensor-parallel index."""
        return self.layout.holder(self.position, stage_rank, micro_batch)

    def stream_index(self, local: int) -> int:
        """The index in the pipeline's stream of micro-batches of the `local`-th this rank runs (replicated stages
        take them round-robin)."""
        return local * self.dp + self.replica if self.layout.stage_replicas else local

    def replica0(self) -> int:
        """Global rank of this rank's place in replica 0."""
        return self.layout.rank_of(replace(self.position, replica=0))

    def carries(self, index: int) -> bool:
        """Whether this rank runs the stream's batch `index` (every one of its replica's, on the grid)."""
        return not self.layout.stage_replicas or index % self.dp == self.replica

    def channel(self, sender: int, receiver: int, micro_batch: int = 0):
        """The process group micro-batch `micro_batch`'s messages from stage rank `sender` to stage rank `receiver`
        go on (the default group where no channels were built)."""
        return self.channels.get((self.peer(sender, micro_batch), self.peer(receiver, micro_batch)))

    def average_grads(self, params: list[nn.Parameter]) -> None:
        if self.dp > 1:
            all_reduce_grads(params, self.dp_group, self.dp)

    def sum_tied_grads(self, tied: list[nn.Parameter]) -> None:
        if self.tie_group is not None:
            all_reduce_grads(tied, self.tie_group)
