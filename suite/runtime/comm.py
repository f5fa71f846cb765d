"""Communication volume of training steps (`comm_mb_per_step`): the bytes this rank sends in collectives.

Every process group calls a pre-hook for each collective, whoever issues it (DDP's reducer and its
communication hooks, FSDP2, DTensor, DeepSpeed), with the tensors it is handed; the hook counts them
while a training step runs. A collective of N bytes (the whole buffer: for an all-gather its output, for
a reduce-scatter its input) among p ranks counts what each rank sends with bandwidth-optimal (ring)
algorithms, the factors of NCCL's bus bandwidth: all-reduce 2N(p-1)/p, all-gather, reduce-scatter and
all-to-all N(p-1)/p, broadcast and send N, reduce N except on its root (in a chain every rank but the
root forwards a partial sum; reductions to different roots add up to a reduce-scatter). Receives and
barriers send nothing; a group of one rank sends nothing. With two ranks, an all-reduce of the gradients
counts their size once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.distributed.distributed_c10d import _world

try:
    from torch._C._distributed_c10d import PreHookArgs
except ImportError:  # process-group pre-hooks came with torch 2.14: an older torch (a GPU machine's own) counts none
    PreHookArgs = None

HOOK_ID = 0x5C0C  # one pre-hook of ours per process group
# Share of the buffer one rank sends, given the group's size and whether this rank is the collective's root; by
# the name of torch's HookOpName.
SHARE_SENT = {
    "ALLREDUCE": lambda p, root: 2 * (p - 1) / p,
    "ALLGATHER": lambda p, root: (p - 1) / p,
    "REDUCE_SCATTER": lambda p, root: (p - 1) / p,
    "ALLTOALL": lambda p, root: (p - 1) / p,
    "BROADCAST": lambda p, root: 1.0,
    "REDUCE": lambda p, root: 0.0 if root else 1.0,
    "SEND": lambda p, root: 1.0,
}


def buffer_bytes(args) -> int:
    return max(sum(t.numel() * t.element_size() for t in tensors)
               for tensors in (args.input_tensors, args.output_tensors))


class CommVolume:
    """Bytes sent in the collectives of every process group that exists when it is created; nothing is
    counted when not `enabled` (a strategy that also communicates outside torch.distributed), nor by a torch
    without process-group hooks (`counts` false)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.counts = enabled and PreHookArgs is not None
        self.counting = False
        self.sent_bytes = 0.0
        for group in list(_world.pg_map) if self.counts else []:  # torch lists its process groups only there
            if group.size() > 1:
                group.register_pre_hook(HOOK_ID, self._hook(group.size(), group.rank()))

    def _hook(self, ranks: int, rank: int):
        def count(args) -> None:
            if self.counting and args.name.name in SHARE_SENT:
                self.sent_bytes += SHARE_SENT[args.name.name](ranks, args.root == rank) * buffer_bytes(args)
        return count

    @contextlib.contextmanager
    def counted(self, timed: bool) -> Iterator[None]:
        """Count the collectives issued inside the block if it is part of a timed step."""
        self.counting = timed
        try:
            yield
        finally:
            self.counting = False
