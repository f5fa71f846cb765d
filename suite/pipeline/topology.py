"""Where a rank sits in DP x PP, and its process groups: `pp` consecutive ranks form one pipeline,
`dp = world / pp` replicas (the layout's `dp` and `pp` mesh dimensions).

Rank r is stage `r % pp` of replica `r // pp`. Each stage's replicas all-reduce their gradients in a
data-parallel group; the ranks that hold copies of one tied weight (GPT-2's embedding on the first
stage, the LM head on the last) sum its gradient in a tie group, as Megatron-LM does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from suite.layout import Layout
from suite.runtime.dist import all_reduce_flat


def all_reduce_grads(params: list[nn.Parameter], group, average_over: int = 1) -> None:
    """One flattened all-reduce of the gradients of `params` (missing gradients count as zero)."""
    if not params:
        return
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    all_reduce_flat([p.grad for p in params], group, average_over)


@dataclass
class Topology:
    pp: int
    dp: int
    rank: int
    pipe_group: object  # the stages of this replica
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
        return cls(layout.pp, layout.dp, rank, mesh["pp"].get_group(), mesh["dp"].get_group(), tie_group,
                   layout.stage_channels(rank) if channels else {})

    @property
    def stage_rank(self) -> int:
        return self.rank % self.pp

    @property
    def replica(self) -> int:
        return self.rank // self.pp

    @property
    def is_first(self) -> bool:
        return self.stage_rank == 0

    @property
    def is_last(self) -> bool:
        return self.stage_rank == self.pp - 1

    def peer(self, stage_rank: int) -> int:
        """Global rank of a stage rank of this replica."""
        return self.replica * self.pp + stage_rank

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
