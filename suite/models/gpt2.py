"""GPT-2, readable in one sitting (after nanoGPT): learned positions, pre-LayerNorm blocks, tied LM head.

Submodule names are the split points of the other strategies: pipelines cut the model into
[tok_emb + pos_emb, blocks..., ln_f + head]; tensor parallelism shards attn.qkv / mlp.fc by columns
and attn.proj / mlp.proj by rows.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

try:  # torch 2.3+
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "math": SDPBackend.MATH}

    def _only(kernel: str) -> AbstractContextManager:
        return sdpa_kernel(_BACKENDS[kernel])
except ImportError:  # torch 2.1 and 2.2 (Lassen's Open-CE build): the same switch under its earlier name

    def _only(kernel: str) -> AbstractContextManager:
        return torch.backends.cuda.sdp_kernel(enable_flash=kernel == "flash", enable_math=kernel == "math",
                                              enable_mem_efficient=kernel == "efficient")


def attention_kernel(kernel: str) -> AbstractContextManager:
    """Where scaled_dot_product_attention runs only `kernel` (network.attention); auto: torch's choice."""
    return nullcontext() if kernel == "auto" else _only(kernel)


def flash_runs(half: bool, capability: float | None) -> bool:
    """Whether torch's FlashAttention-2 kernel runs on a GPU of compute `capability` (None: not known, assumed able):
    in bf16 or fp16, on Ampere (8.0) and later."""
    return half and (capability is None or capability >= 8.0)


@dataclass(frozen=True)
class GPT2Dims:
    n_layer: int
    n_head: int
    n_embd: int

    def name(self) -> str:
        """The name of a GPT-2 of these dimensions that is none of the named sizes."""
        return f"gpt2_L{self.n_layer}_H{self.n_head}_E{self.n_embd}"


# The named sizes, each declared once (as torchtitan keeps its `llama3_configs` beside the model): size `tiny` is
# `network=gpt2_tiny` (conf/network/gpt2_tiny.yaml). Vocabulary and context come from the dataset.
GPT2_SIZES = {
    "nano": GPT2Dims(n_layer=1, n_head=1, n_embd=8),  # negligible: what a rank holds is the framework's
    "tiny": GPT2Dims(n_layer=2, n_head=2, n_embd=64),  # the smoke sweeps and most tests
    "mini": GPT2Dims(n_layer=4, n_head=4, n_embd=128),  # make bench-model's GPT-2
    "mini_wide": GPT2Dims(n_layer=4, n_head=8, n_embd=512),  # 12.6 M parameters in its blocks
    "small": GPT2Dims(n_layer=12, n_head=12, n_embd=768),  # GPT-2 small, 124 M parameters with its vocabulary
    "medium": GPT2Dims(n_layer=24, n_head=16, n_embd=1024),  # GPT-2 medium, 355 M (Study N)
}


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(d)) v under the causal mask, one module so that it can be recomputed alone: Megatron-LM's
    selective recomputation (`activation_checkpointing=selective`) runs it again in backward, where without a fused
    kernel it keeps the scores, softmax and dropout mask, the activations that grow with the sequence squared."""

    def __init__(self, dropout: float, attention: str = "auto") -> None:
        super().__init__()
        self.dropout, self.attention = dropout, attention

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Causal over q's and k's common positions, or where `mask` (queries x keys) is true."""
        with attention_kernel(self.attention):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                  dropout_p=self.dropout if self.training else 0.0)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, attention: str = "auto") -> None:
        super().__init__()
        self.head_dim = n_embd // n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.core = AttentionCore(dropout, attention)
        self.proj = nn.Linear(n_embd, n_embd)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        # qkv's output is laid out head by head ([q k v] of head 0, then head 1, ...) as in Megatron-LM, and
        # heads are inferred from the width: a column shard of qkv holds the whole q, k and v of its heads.
        qkv = self.qkv(x).view(batch, time, -1, 3, self.head_dim).transpose(1, 2)
        y = self.core(*qkv.unbind(3))
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(batch, time, -1)))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, attention: str = "auto") -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, attention)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, attention: str = "auto") -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, attention) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2: residual projections scaled by depth
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
