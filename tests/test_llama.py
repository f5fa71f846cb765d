"""Llama 3 (suite.models.llama): its published shapes, grouped-query attention, rotary positions, the layouts that
tensor parallelism splits, and the tensor-parallel degrees it refuses."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from suite.config import DatasetConfig, NetworkConfig
from suite.errors import ConfigError
from suite.models import build_model, check_network, resolve_network
from suite.models.layers import flatten_layers
from suite.models.llama import LLAMA3_SIZES, GroupedQueryAttention, SwiGLU, apply_rope, rope_frequencies
from suite.sweep.plan import plan

TOKENS = DatasetConfig(name="tokens", kind="tokens", vocab_size=97, seq_len=16)


def llama(size: str, **dims) -> NetworkConfig:
    return resolve_network(NetworkConfig(family="llama3", size=size, **dims))


def test_the_8b_flavor_has_llama_3_8bs_parameters():
    """Meta's published shape with Llama 3's vocabulary: 8.03e9 parameters, the untied embedding and head included
    (FFN width 14336 from its rule: 2/3 x 4 x 4096 x 1.3 rounded up to 1024)."""
    net = llama("8b")
    assert (net.name, net.n_kv_head, net.ffn_dim_multiplier, net.multiple_of) == ("llama3_8b", 8, 1.3, 1024)
    assert LLAMA3_SIZES["8b"].ffn_hidden == 14336
    assert LLAMA3_SIZES["70b"].ffn_hidden == 28672 and LLAMA3_SIZES["405b"].ffn_hidden == 53248
    with torch.device("meta"):
        model = build_model(net, DatasetConfig(name="tokens", kind="tokens", vocab_size=128256, seq_len=8192))
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248


def test_overridden_dimensions_are_named_by_what_is_built():
    assert llama("tiny").name == "llama3_tiny"
    assert llama("tiny", n_kv_head=4).name == "llama3_L2_H4_KV4_E64_F192"
    assert llama("tiny", n_kv_head=4).size is None


def test_tiny_predicts_every_token_and_its_layers_compute_the_model():
    """Logits per position; the pipelines' layers [embedding, blocks, norm + head] in order are the model, whose
    head is its own (no tied weights), with GPT-2's submodule names; a later token does not change an earlier
    position's logits (causal)."""
    torch.manual_seed(0)
    model = build_model(llama("tiny"), TOKENS)
    block = ["ln_1.weight", "attn.qkv.weight", "attn.proj.weight", "ln_2.weight", "mlp.fc.weight", "mlp.proj.weight"]
    assert [name for name, _ in model.named_parameters()] == [
        "tok_emb.weight", *(f"blocks.{i}.{name}" for i in range(2) for name in block), "ln_f.weight", "head.weight"]
    assert model.head.weight is not model.tok_emb.weight
    idx = torch.randint(0, 97, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 97)
    x = idx
    for layer in flatten_layers(model):
        x = layer.module(x)
    torch.testing.assert_close(x, logits)
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 97
    torch.testing.assert_close(model(changed)[:, :-1], logits[:, :-1])


def meta_scaled(freqs: list[float]) -> list[float]:
    """Meta's `apply_scaling` (llama-models, models/llama3), as written there: a loop over the frequencies."""
    low_wavelen, high_wavelen = 8192 / 1, 8192 / 4
    scaled = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            scaled.append(freq)
        elif wavelen > low_wavelen:
            scaled.append(freq / 8)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            scaled.append((1 - smooth) * freq / 8 + smooth * freq)
    return scaled


def test_rope_is_metas_rotation_with_llama_3_1_frequencies():
    """The frequencies are theta=500000's scaled as Meta scales them (the fastest kept, the slowest slowed 8x, a
    band blended); the rotation is Meta's: adjacent pairs as complex numbers times exp(i t f)."""
    head_dim = 128
    plain = [500000.0 ** (-i / head_dim) for i in range(0, head_dim, 2)]
    freqs = rope_frequencies(head_dim)
    torch.testing.assert_close(freqs, torch.tensor(meta_scaled(plain)))
    assert freqs[0] == 1.0 and freqs[-1] == pytest.approx(plain[-1] / 8)
    assert plain[-1] / 8 < freqs[40] < plain[40]  # in the blended band: wavelengths between 2048 and 8192

    x = torch.randn(2, 3, 10, head_dim)
    angles = torch.outer(torch.arange(10.0), freqs)
    expected = torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * torch.polar(
        torch.ones_like(angles), angles)).flatten(-2)
    torch.testing.assert_close(apply_rope(x), expected)


def test_query_heads_share_their_groups_key_and_value():
    """qkv's output is laid out group by group ([q heads of group g, k_g, v_g] ...): each query head attends with
    the key and value head of its group, written out head by head with an explicit causal softmax."""
    torch.manual_seed(0)
    n_embd, n_head, n_kv_head, time = 32, 4, 2, 6
    attn = GroupedQueryAttention(n_embd, n_head, n_kv_head)
    x = torch.randn(1, time, n_embd)
    head_dim, group = n_embd // n_head, n_head // n_kv_head
    groups = attn.qkv(x)[0].view(time, n_kv_head, group + 2, head_dim)
    causal = torch.ones(time, time).tril().bool()
    heads = []
    for h in range(n_head):
        g, j = divmod(h, group)
        q, k, v = apply_rope(groups[:, g, j]), apply_rope(groups[:, g, group]), groups[:, g, group + 1]
        scores = (q @ k.T / math.sqrt(head_dim)).masked_fill(~causal, float("-inf"))
        heads.append(F.softmax(scores, -1) @ v)
    torch.testing.assert_close(attn(x)[0], attn.proj(torch.cat(heads, -1)))


def test_column_shards_of_whole_groups_and_pairs_compute_their_share():
    """What tensor parallelism relies on: a contiguous half of qkv's rows (one key-value group of two) with the
    matching half of proj's columns, and a half of the SwiGLU's fc rows (whole gate-up pairs) with the matching half
    of its proj's columns, each compute a share of the output; the two shares sum to the whole."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    for module, split_by_columns in ((GroupedQueryAttention(32, 4, 2), "qkv"), (SwiGLU(32, 48), "fc")):
        shares = [rank_share(module, split_by_columns, rank, 2)(x) for rank in range(2)]
        torch.testing.assert_close(shares[0] + shares[1], module(x))


def rank_share(module: nn.Module, split_by_columns: str, rank: int, ranks: int) -> nn.Module:
    """`module` as a tensor-parallel rank holds it (torch's ColwiseParallel and RowwiseParallel, local tensors):
    its contiguous share of `split_by_columns`'s output rows, and the matching input columns of `proj`."""
    share = copy.deepcopy(module)
    columns = getattr(share, split_by_columns)
    columns.weight = nn.Parameter(columns.weight.chunk(ranks)[rank])
    share.proj.weight = nn.Parameter(share.proj.weight.chunk(ranks, dim=1)[rank])
    return share


@pytest.mark.parametrize("overrides, message", [
    ({"n_kv_head": 3}, "n_head=4 is not divisible by n_kv_head=3"),
    ({"n_embd": 36, "n_head": 4, "n_kv_head": 1}, "head width n_embd / n_head = 9 is odd"),
])
def test_check_network_refuses_llamas_that_cannot_be_built(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_network(llama("tiny", **overrides), TOKENS)


@pytest.mark.parametrize("strategy", [["strategy=megatron", "strategy.tp=4", "workers=4"],
                                      ["strategy=fsdp", "strategy.tp=4", "workers=4"]])
def test_a_tp_that_does_not_divide_the_key_value_heads_is_refused_in_one_line(strategy):
    """tiny has 4 query heads in 2 key-value groups: 4 ranks would split a group."""
    with pytest.raises(ConfigError) as info:
        plan([["dataset=tokens", "dataset.seq_len=32", "dataset.vocab_size=512", "network=llama3_tiny", *strategy]])
    message = str(info.value)
    assert "tp=4 does not divide n_kv_head=2 of llama3_tiny (a rank holds whole key-value groups)" in message
    assert "\n" not in message
