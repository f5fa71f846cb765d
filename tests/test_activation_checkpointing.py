"""Activation checkpointing runs checkpointed blocks again in backward and keeps less for it, with the same math
(the launched points are in test_equivalence.py: ddp, fsdp and zero with checkpointing against single)."""

import copy

import torch
import torch.nn.functional as F

from suite.models.gpt2 import GPT2
from suite.models.layers import block_layers
from suite.models.vision import vgg
from suite.runtime.activation_checkpointing import apply_activation_checkpointing


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
    for interval, expected in (("every", 4), ("k=2", 2)):
        model = copy.deepcopy(plain)
        blocks = list(model.blocks)
        calls = [0] * len(blocks)
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda *_, i=i, calls=calls: calls.__setitem__(i, calls[i] + 1))
        assert apply_activation_checkpointing(model, 1 if interval == "every" else 2, None) == expected
        assert model.state_dict().keys() == plain.state_dict().keys()
        kept[interval], grads = train_step(model, tokens)
        # The k-th, 2k-th, ... block runs twice (forward, then again in backward); the others once.
        assert calls == ([2, 2, 2, 2] if interval == "every" else [1, 2, 1, 2])
        torch.testing.assert_close(grads, grads_plain, rtol=0, atol=0)
    assert kept["every"] < kept["k=2"] < kept_plain
    assert kept["every"] < kept_plain / 2


def test_the_layer_that_reads_the_data_is_not_checkpointed():
    """VGG's first convolution keeps its input (the images) either way; checkpointing it would, under DeepSpeed's
    reentrant checkpoint, leave every convolution before the loss without a gradient."""
    model = vgg("vgg11", channels=3, classes=10, image_size=16, width=0.125, dropout=0.0)
    convolutions = block_layers(model)
    assert apply_activation_checkpointing(model, 1, None) == len(convolutions) - 1
    assert model.features[0] is convolutions[0].module
