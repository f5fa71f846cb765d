"""Where a rank sits in DP x PP x TP, and its process groups (the layout's `dp`, `pp` and `tp` mesh dimensions):
`pp x tp` consecutive ranks form one pipeline, `dp = world / (pp x tp)` replicas; each stage is `tp` consecutive
ranks, which split its blocks (tensor parallelism) and send to the ranks of the same tensor-parallel index on the
neighbouring stages.

Each stage's replicas all-reduce their gradients in a data-parallel group; the ranks that hold copies of one tied
weight (GPT-2's embedding on the first stage, the LM head on the last) sum its gradient in a tie group, as
Megatron-LM does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from suite.layout import Layout, RankPlace
from suite.runtime.dist import all_reduce_flat
from suite.runtime.memory import local_tensor


def all_reduce_grads(params: list[nn.Parameter], group, average_over: int = 1) -> None:
    """One flattened all-reduce of the gradients of `params` (missing gradients count as zero)."""
    if not params:
        return
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    all_reduce_flat([local_tensor(p.grad) for p in params], group, average_over)


@dataclass
class Topology:
    layout: Layout
    rank: int
    mesh: object  # the point's device mesh (`dp`, `pp`, `tp`)
    pipe_group: object  # the stages of this replica (at this rank's tensor-parallel index)
    dp_group: object  # this stage's replicas
    tie_group: object = None  # the ranks of this replica holding a tied weight; None when not one of them
    channels: dict[tuple[int, int], object] = field(default_factory=dict)  # (sender, receiver) -> its own group

    @classmethod
    def build(cls, layout: Layout, rank: int, tie_stage_ranks: set[int], device_type: str,
              channels: bool = False) -> Topology:
        """Every rank calls this with the same arguments, in the same order (it creates process groups).
        `channels`: a group of its own for each direction between neighbouring stages (Layout.stage_channels)."""
        mesh = layout.mesh(device_type)
        tie_group = layout.replica_subgroup(rank, tie_stage_ranks) if len(tie_stage_ranks) > 1 else None
        return cls(layout, rank, mesh, mesh["pp"].get_group(), mesh["dp"].get_group(), tie_group,
                   layout.stage_channels(rank) if channels else {})

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def place(self) -> RankPlace:
        return self.layout.place(self.rank)

    @property
    def stage_rank(self) -> int:
        return self.place.stage

    @property
    def replica(self) -> int:
        return self.place.replica

    @property
    def is_first(self) -> bool:
        return self.stage_rank == 0

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the network's last chunk (the last stage; in a V, the first)."""
        return self.layout.chunk_stage(self.pp * self.layout.virtual_stages - 1) == self.stage_rank

    def peer(self, stage_rank: int) -> int:
        """Global rank of a stage rank of this replica, at this rank's tensor-parallel index."""
        return self.layout.rank_of(replace(self.place, stage=stage_rank))

    def replica0(self) -> int:
        """Global rank of this rank's place in replica 0."""
        return self.layout.rank_of(replace(self.place, replica=0))

    def channel(self, sender: int, receiver: int):
        """The process group messages from stage rank `sender` to stage rank `receiver` of this replica go on
        (the default group where no channels were built)."""
        return self.channels.get((self.peer(sender), self.peer(receiver)))

    def average_grads(self, params: list[nn.Parameter]) -> None:
        if self.dp > 1:
            all_reduce_grads(params, self.dp_group, self.dp)

    def sum_tied_grads(self, tied: list[nn.Parameter]) -> None:
        if self.tie_group is not None:
            all_reduce_grads(tied, self.tie_group)
