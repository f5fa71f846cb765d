"""Context parallelism: each of a replica's `cp` ranks trains on its part of every sequence, and attention reads the
keys and values of the whole sequence, all-gathered from the group in each layer.

This is the all-gather form Llama 3 was trained with (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.2:
"we adopt an all-gather based method where we first all-gather the key (K) and value (V) tensors, and then compute
attention output for the local query (Q) tensor chunk"), not torch's ring exchange (`context_parallel`), whose
attention handlers are the CUDA kernels' (flash, efficient, cuDNN) and so cannot run on CPU ranks. Both send each
rank the whole sequence's keys and values once per layer (gathered at once here, in cp - 1 steps of a ring there),
and split the load alike:
- the sequence is cut into 2 cp chunks and rank r holds chunks r and 2 cp - 1 - r (Llama 3's and torch's head-tail
  load balancing), so that under the causal mask every rank attends over as many (query, key) pairs;
- a rank's keys are rotated at their positions in the whole sequence and its queries attend to the gathered keys
  at or before their own position;
- gradients of the gathered keys and values go back to the ranks that made them (the gather's backward is a
  reduce-scatter), and the replicas' reduction (FSDP's or megatron's, over data x context ranks) averages what
  each rank's part of the sequence contributed.
The group's loss is the mean over its ranks' (each the mean over as many tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout
from suite.runtime.torch_api import all_gather_autograd


@dataclass(frozen=True)
class SequenceShard:
    """Rank `index` of a context-parallel group of `size` ranks (process group `group`)."""

    group: object
    index: int
    size: int

    def positions(self, time: int, device: torch.device, index: int | None = None) -> torch.Tensor:
        """The positions in the whole sequence of the `time` tokens rank `index` (this one by default) holds."""
        index = self.index if index is None else index
        chunk = time // 2
        return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device)
                          for c in (index, 2 * self.size - 1 - index)])

    def take(self, sequences: torch.Tensor) -> torch.Tensor:
        """This rank's part of a batch of whole sequences (batch, time, ...)."""
        return sequences[:, self.positions(sequences.shape[1] // self.size, sequences.device)]

    def gather_keys_values(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's keys and values (batch, heads, time, head_dim), in rank order, in one collective."""
        local = torch.stack((k, v)).movedim(3, 0).contiguous()  # (time, 2, batch, heads, head_dim): gathered on dim 0
        whole = all_gather_autograd(local, 0, self.group).movedim(0, 3)
        return whole[0], whole[1]

    def causal_mask(self, time: int, device: torch.device) -> torch.Tensor:
        """(time, cp time): whether each of this rank's queries attends to each gathered key."""
        keys = torch.cat([self.positions(time, device, index) for index in range(self.size)])
        return self.positions(time, device)[:, None] >= keys[None, :]

    def train_on_part(self, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], inputs: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
        """A training `step` on this rank's part of each sequence; the loss returned is the group's mean (each rank's
        over as many tokens), as every rank of the group holds it."""
        import torch.distributed as dist

        loss = step(self.take(inputs), self.take(targets))
        dist.all_reduce(loss, group=self.group)
        return loss / self.size

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        """The whole sequences (batch, cp time, ...) from every rank's part (no gradient: evaluation's logits). Each
        rank writes its part into one zeroed tensor, which an in-place all-reduce sums (as `whole_logits` does, for
        gloo, which has no all-gather of GPU tensors)."""
        import torch.distributed as dist

        whole = torch.zeros((local.shape[0], local.shape[1] * self.size, *local.shape[2:]), dtype=local.dtype,
                            device=local.device)
        whole[:, self.positions(local.shape[1], local.device)] = local
        dist.all_reduce(whole, group=self.group)
        return whole

def apply_context_parallel(model: nn.Module, mesh, layout: Layout, rank: int) -> SequenceShard | None:
    """Give each attention layer that can take a part of each sequence (Llama's: its positions are rotary, computed
    from the token's place) rank `rank`'s shard of the layout's context-parallel group; None where cp is 1."""
    if layout.cp == 1:
        return None
    shard = SequenceShard(mesh["cp"].get_group(), layout.position(rank).cp_rank, layout.cp)
    for module in model.modules():
        if hasattr(module, "sequence"):
            module.sequence = shard
    return shard


def replica_mesh(mesh, layout: Layout):
    """The ranks over which the replicas average their gradients (or shard them): the data-parallel ranks and,
    under context parallelism, their context-parallel ranks (torchtitan's `dp_shard_cp`), each of which took part
    of the replica's sequences."""
    return mesh["dp", "cp"]._flatten("dp_cp") if layout.cp > 1 else mesh["dp"]


def check_context_split(strategy: str, cfg, cp: int, ranks: int) -> None:
    """Before launch: `cp` ranks can split each sequence of the point's network and `ranks` (the workers of one
    tensor-parallel index) into groups of `cp`."""
    if cp < 1 or ranks % cp:
        raise ConfigError(f"strategy {strategy}: cp={cp} does not divide the {ranks} ranks of each tensor-parallel "
                          "index (workers / tp)")
    if cp == 1:
        return
    net, seq_len = cfg.network, cfg.dataset.seq_len
    if net.arch != "llama3":
        raise ConfigError(f"strategy {strategy}: cp={cp} splits the sequences of a network with rotary positions "
                          f"(Llama 3); network {net.name} ({net.arch}) has none")
    if seq_len % (2 * cp):
        raise ConfigError(f"strategy {strategy}: cp={cp} cuts each sequence into 2 x cp = {2 * cp} equal chunks; "
                          f"dataset.seq_len={seq_len} is not a multiple of {2 * cp}")
    if net.attention == "flash":
        raise ConfigError(f"strategy {strategy}: cp={cp} attends under a mask of the gathered keys' positions, which "
                          "the flash kernel does not take; use network.attention=auto or efficient")
    if "context_parallel" not in cfg.framework:
        raise ConfigError(f"strategy {strategy}: cp={cp} is priced as its framework attends under context parallelism, "
                          f"which {cfg.framework.names[0]}'s file (conf/framework/) does not say "
                          "(context_parallel.attention: masked or causal)")
