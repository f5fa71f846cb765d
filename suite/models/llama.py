"""Llama 3, readable in one sitting (after Meta's reference model and torchtitan's `llama3`): rotary positions with
Llama 3.1's frequency scaling, pre-RMSNorm blocks, grouped-query attention, SwiGLU feed-forward, untied embedding
and output head, no biases.

Submodules carry GPT-2's names (`suite.models.gpt2`), the split points of the other strategies: pipelines cut the
model into [tok_emb, blocks..., ln_f + head]; tensor parallelism shards attn.qkv / mlp.fc by columns and
attn.proj / mlp.proj by rows. For a column shard to stay whole, qkv's output is laid out by key-value group (a group's
query heads, then its key and value heads), and mlp.fc's as interleaved (gate, up) pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from suite.models.gpt2 import AttentionCore

ROPE_THETA = 500_000.0
# Llama 3.1's stretch of the rotary frequencies to a longer context (Meta's `apply_scaling`): wavelengths longer than
# the original context over LOW_FREQ_FACTOR are slowed by ROPE_SCALE, shorter than it over HIGH_FREQ_FACTOR kept,
# and the band between blended smoothly.
ROPE_SCALE, LOW_FREQ_FACTOR, HIGH_FREQ_FACTOR, ORIGINAL_CONTEXT = 8.0, 1.0, 4.0, 8192
NORM_EPS = 1e-5


@dataclass(frozen=True)
class LlamaDims:
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_dim_multiplier: float = 1.0  # Llama's None
    multiple_of: int = 256

    @property
    def ffn_hidden(self) -> int:
        """Llama's SwiGLU width: two thirds of 4 x n_embd, times ffn_dim_multiplier, rounded up to multiple_of."""
        hidden = int(self.ffn_dim_multiplier * int(2 * 4 * self.n_embd / 3))
        return self.multiple_of * -(-hidden // self.multiple_of)

    def name(self) -> str:
        """The name of a Llama 3 of these dimensions that is none of the named sizes."""
        return f"llama3_L{self.n_layer}_H{self.n_head}_KV{self.n_kv_head}_E{self.n_embd}_F{self.ffn_hidden}"


# The named sizes, each declared once (as torchtitan's `llama3_configs`): size `tiny` is `network=llama3_tiny`
# (conf/network/llama3_tiny.yaml). Vocabulary and context come from the dataset (Llama 3's: 128256 tokens).
LLAMA3_SIZES = {
    "nano": LlamaDims(n_layer=1, n_head=2, n_kv_head=1, n_embd=8, multiple_of=8),  # negligible
    "tiny": LlamaDims(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, multiple_of=32),  # trains in seconds
    "8b": LlamaDims(n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, ffn_dim_multiplier=1.3, multiple_of=1024),
    "70b": LlamaDims(n_layer=80, n_head=64, n_kv_head=8, n_embd=8192, ffn_dim_multiplier=1.3, multiple_of=4096),
    "405b": LlamaDims(n_layer=126, n_head=128, n_kv_head=8, n_embd=16384, ffn_dim_multiplier=1.2, multiple_of=4096),
}


def rope_frequencies(head_dim: int) -> torch.Tensor:
    """The rotation rate of each pair of a head's dimensions: theta^(-2i/d), scaled as Llama 3.1 scales them."""
    freqs = ROPE_THETA ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    wavelength = 2 * math.pi / freqs
    smooth = (ORIGINAL_CONTEXT / wavelength - LOW_FREQ_FACTOR) / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR)
    blended = (1 - smooth) * freqs / ROPE_SCALE + smooth * freqs
    scaled = torch.where(wavelength > ORIGINAL_CONTEXT / LOW_FREQ_FACTOR, freqs / ROPE_SCALE, blended)
    return torch.where(wavelength < ORIGINAL_CONTEXT / HIGH_FREQ_FACTOR, freqs, scaled)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """x (batch, heads, time, head_dim) with each adjacent pair of its dimensions (Meta's complex view) rotated by
    its frequency times its token's position (0, 1, ... unless given). Computed in each call, not kept as a buffer:
    a layer a pipeline stage or a meta-device build holds on its own needs nothing from the model, and the angles
    cost little beside attention."""
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)
    angles = torch.outer(positions.float(), rope_frequencies(x.shape[-1]).to(x.device))
    cos, sin = angles.cos(), angles.sin()
    even, odd = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return normed.type_as(x) * self.weight


class GroupedQueryAttention(nn.Module):
    """n_head query heads sharing n_kv_head key-value heads, a group of n_head / n_kv_head queries each. Under context
    parallelism (`sequence`, suite.strategies.context_parallel) x is this rank's part of each sequence: its tokens
    are rotated at their own positions and attend to the whole sequence's keys and values, gathered."""

    sequence = None  # a SequenceShard under context parallelism

    def __init__(self, n_embd: int, n_head: int, n_kv_head: int, attention: str = "auto") -> None:
        super().__init__()
        self.head_dim, self.group = n_embd // n_head, n_head // n_kv_head
        # qkv's output, group by group: the group's query heads, its key head, its value head. Groups are inferred
        # from the width: a column shard of whole groups holds the queries, key and value of its heads.
        self.qkv = nn.Linear(n_embd, (n_head + 2 * n_kv_head) * self.head_dim, bias=False)
        self.core = AttentionCore(0.0, attention)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        groups = self.qkv(x).view(batch, time, -1, self.group + 2, self.head_dim)
        q = groups[:, :, :, :self.group].flatten(2, 3).transpose(1, 2)  # (batch, heads, time, head_dim)
        k, v = groups[:, :, :, self.group].transpose(1, 2), groups[:, :, :, self.group + 1].transpose(1, 2)
        positions = mask = None
        if self.sequence is not None:
            positions, mask = self.sequence.positions(time, x.device), self.sequence.causal_mask(time, x.device)
        q, k = apply_rope(q, positions), apply_rope(k, positions)
        if self.sequence is not None:
            k, v = self.sequence.gather_keys_values(k, v)
        # each key-value head repeated for the queries of its group (torchtitan's repeat_kv)
        k, v = (t.repeat_interleave(self.group, dim=1) for t in (k, v))
        y = self.core(q, k, v, mask)
        return self.proj(y.transpose(1, 2).reshape(batch, time, -1))


class SwiGLU(nn.Module):
    def __init__(self, n_embd: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 2 * hidden, bias=False)  # Meta's w1 and w3, as interleaved (gate, up) pairs
        self.proj = nn.Linear(hidden, n_embd, bias=False)  # Meta's w2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x).unflatten(-1, (-1, 2)).unbind(-1)
        return self.proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, dims: LlamaDims, attention: str = "auto") -> None:
        super().__init__()
        self.ln_1 = RMSNorm(dims.n_embd)
        self.attn = GroupedQueryAttention(dims.n_embd, dims.n_head, dims.n_kv_head, attention)
        self.ln_2 = RMSNorm(dims.n_embd)
        self.mlp = SwiGLU(dims.n_embd, dims.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Llama(nn.Module):
    def __init__(self, vocab_size: int, dims: LlamaDims, attention: str = "auto") -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, dims.n_embd)
        self.blocks = nn.ModuleList(Block(dims, attention) for _ in range(dims.n_layer))
        self.ln_f = RMSNorm(dims.n_embd)
        self.head = nn.Linear(dims.n_embd, vocab_size, bias=False)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):  # residual projections scaled by depth, as GPT-2's
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * dims.n_layer))
            elif param.dim() == 2:
                nn.init.normal_(param, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
