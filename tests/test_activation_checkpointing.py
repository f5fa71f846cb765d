"""Activation checkpointing runs checkpointed blocks again in backward and keeps less for it, with the same math
(the launched points are in test_equivalence.py: ddp, fsdp and zero with checkpointing against single)."""

import copy
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from suite.models.gpt2 import GPT2
from suite.models.layers import block_layers
from suite.models.llama import LLAMA3_SIZES, Llama
from suite.models.vision import vgg
from suite.runtime.model_transforms import apply_activation_checkpointing


def train_step(model: GPT2, tokens: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
    """Forward and backward once; return the bytes autograd kept for backward and the gradients."""
    kept = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    return kept, [p.grad for p in model.parameters()]


def test_checkpointed_blocks_recompute_and_keep_less():
    torch.manual_seed(0)
    plain = GPT2(vocab_size=512, block_size=32, n_layer=4, n_head=2, n_embd=64)
    tokens = torch.randint(0, 512, (8, 32))
    kept_plain, grads_plain = train_step(plain, tokens)
    kept = {}
    for interval, expected in (("every", 4), ("2", 2)):
        model = copy.deepcopy(plain)
        blocks = list(model.blocks)
        calls = [0] * len(blocks)
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda *_, i=i, calls=calls: calls.__setitem__(i, calls[i] + 1))
        assert apply_activation_checkpointing(model, interval, None) == expected
        assert model.state_dict().keys() == plain.state_dict().keys()
        kept[interval], grads = train_step(model, tokens)
        # The k-th, 2k-th, ... block runs twice (forward, then again in backward); the others once.
        assert calls == ([2, 2, 2, 2] if interval == "every" else [1, 2, 1, 2])
        torch.testing.assert_close(grads, grads_plain, rtol=0, atol=0)
    assert kept["every"] < kept["2"] < kept_plain
    assert kept["every"] < kept_plain / 2


def test_the_layer_that_reads_the_data_is_not_checkpointed():
    """VGG's first convolution keeps its input (the images) either way; checkpointing it would, under DeepSpeed's
    reentrant checkpoint, leave every convolution before the loss without a gradient."""
    model = vgg("vgg11", channels=3, classes=10, image_size=16, width=0.125, dropout=0.0)
    convolutions = block_layers(model)
    assert apply_activation_checkpointing(model, "every", None) == len(convolutions) - 1
    assert model.features[0] is convolutions[0].module


def test_selective_recomputes_only_the_attention_cores_and_drops_their_scores():
    """Megatron-LM's selective recomputation: each block's attention core runs again in backward, nothing else does;
    under the math kernel it no longer keeps the scores, their softmax and its dropout mask (3 b h s^2 values a block,
    dropout on), and the gradients are the same bits."""
    torch.manual_seed(0)
    layers, heads, batch, seq = 4, 2, 8, 32
    plain = GPT2(vocab_size=512, block_size=seq, n_layer=layers, n_head=heads, n_embd=64, dropout=0.1,
                 attention="math")
    tokens = torch.randint(0, 512, (batch, seq))
    torch.manual_seed(1)
    kept_plain, grads_plain = train_step(plain, tokens)
    model = copy.deepcopy(plain)
    cores = [block.attn.core for block in model.blocks]
    calls = {"core": 0, "mlp": 0}
    for core in cores:
        core.register_forward_pre_hook(lambda *_: calls.__setitem__("core", calls["core"] + 1))
    for block in model.blocks:
        block.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__("mlp", calls["mlp"] + 1))
    assert apply_activation_checkpointing(model, "selective", None) == layers
    assert model.state_dict().keys() == plain.state_dict().keys()
    torch.manual_seed(1)
    kept, grads = train_step(model, tokens)
    assert calls == {"core": 2 * layers, "mlp": layers}
    torch.testing.assert_close(grads, grads_plain, rtol=0, atol=0)
    scores = batch * heads * seq * seq
    assert kept_plain - kept >= layers * scores * (4 + 4)  # the fp32 softmax and scores at least


class OpCalls(TorchDispatchMode):
    """Counts the calls of each aten operator (by packet name) run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func._overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("network", ["gpt2", "llama"])
def test_selective_op_keeps_every_other_matmul_and_the_attention(network):
    """torchtitan's operator policy: of a block's forward, the 1st, 3rd, ... matrix multiply and the attention kernel
    are kept, the 2nd, 4th, ... multiply and the elementwise ops run again in backward; the gradients are the same
    bits. A block multiplies 4 times (attn.qkv, attn.proj, mlp.fc, mlp.proj: GPT-2's addmm with their biases,
    Llama's mm): of the 2nd and 4th, recomputation stops (torch's early stop) before the 4th, whose output only
    the residual sum reads, which needs nothing of it for backward."""
    torch.manual_seed(0)
    layers, seq = 2, 32
    plain = (GPT2(vocab_size=512, block_size=seq, n_layer=layers, n_head=2, n_embd=64) if network == "gpt2"
             else Llama(512, LLAMA3_SIZES["tiny"]))
    matmul, activation = ("addmm", "gelu") if network == "gpt2" else ("mm", "silu")
    tokens = torch.randint(0, 512, (4, seq))
    with OpCalls() as plain_ops:
        _, grads_plain = train_step(plain, tokens)
    model = copy.deepcopy(plain)
    assert apply_activation_checkpointing(model, "selective_op", None) == layers
    assert model.state_dict().keys() == plain.state_dict().keys()
    with OpCalls() as ops:
        _, grads = train_step(model, tokens)
    torch.testing.assert_close(grads, grads_plain, rtol=0, atol=0)
    again = ops.calls - plain_ops.calls
    assert again[matmul] == layers
    assert again[activation] == layers
    assert again["_scaled_dot_product_flash_attention_for_cpu"] == 0
