"""gpipe_dist and 1f1b compute each stage's forward and the loss in the point's precision, and the backward outside
autocast (AMP: "backward passes under autocast are not recommended"); torch.distributed.pipelining runs both in one
`schedule.step`. Both schedules run here on one rank: 1f1b with two virtual stages, gpipe_dist with one stage."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from suite.layout import Layout
from suite.models.gpt2 import GPT2
from suite.runtime.metrics import PhaseTimer
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.gpipe_dist import GPipeDist
from suite.strategies.one_f_one_b import OneFOneB

VOCAB, SEQ, BATCH, CHUNKS = 64, 8, 4, 2



@pytest.mark.parametrize("strategy", [OneFOneB(virtual_stages=2), GPipeDist()], ids=["1f1b", "gpipe_dist"])
@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_stage_forwards_and_loss_autocast_and_backward_does_not(one_rank_group, strategy, precision, dtype):
    env = one_rank_group
    losses = []

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses.append((logits.dtype, torch.is_autocast_enabled("cpu")))
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten())

    cfg = OmegaConf.create({"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
                            "dataset": {"kind": "tokens", "vocab_size": VOCAB, "seq_len": SEQ},
                            "cluster": {"share_gpus": False}})
    layout = Layout(dp=1, pp=1, mini_batch=BATCH, micro_batches=CHUNKS, virtual_stages=strategy.chunks_per_device())
    rank = RankContext(cfg, env, layout, make_precision(precision, env.device), PhaseTimer(env.device), lm_loss)
    torch.manual_seed(0)
    runtime = strategy.setup(GPT2(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=2, n_embd=16), rank)
    forward, backward = [], []
    for linear in (m for m in runtime.model.modules() if isinstance(m, nn.Linear)):
        linear.register_forward_hook(lambda module, args, output: forward.append(output.dtype))
        linear.register_full_backward_pre_hook(lambda module, grad_out: backward.append(
            torch.is_autocast_enabled("cpu")))

    inputs, targets = torch.randint(0, VOCAB, (2, BATCH, SEQ))
    loss = runtime.train_step(inputs, targets)

    assert torch.isfinite(loss)
    # Every micro-batch's, and the forward and backward torch runs first to learn the shapes between stages.
    assert forward and set(forward) == {dtype}
    assert backward and set(backward) == {False}
    assert set(losses) == {(dtype, precision != "fp32")}
    assert {p.dtype for p in runtime.model.parameters()} == {torch.float32}  # fp32 master weights
