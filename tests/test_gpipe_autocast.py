"""gpipe computes in the point's precision: torchgpipe runs each partition's forward on a worker thread and
recomputes checkpointed micro-batches in backward, both outside the autocast of the thread that calls the pipe
(autocast state is thread-local), so every partition enters the precision's autocast itself."""

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
from suite.strategies.gpipe import GPipe

VOCAB, SEQ, BATCH, CHUNKS = 64, 8, 4, 2


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


@pytest.mark.parametrize("one_rank_group", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], indirect=True)
@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_gpipe_partitions_compute_in_the_points_precision(one_rank_group, precision, dtype):
    env = one_rank_group
    cfg = OmegaConf.create({"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
                            "dataset": {"kind": "tokens", "vocab_size": VOCAB, "seq_len": SEQ},
                            "cluster": {"share_gpus": True}})
    rank = RankContext(cfg, env, Layout(dp=1, pp=2, mini_batch=BATCH, micro_batches=CHUNKS,
                                        stages_in_one_process=True),
                       make_precision(precision, env.device), PhaseTimer(env.device), lm_loss)
    torch.manual_seed(0)
    model = GPT2(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=2, n_embd=16)
    runtime = GPipe(balance=[2, 2], checkpoint="always").setup(model, rank)
    assert {d.type for d in runtime.model.devices} == {env.device.type}
    linears = [m for m in runtime.model.modules() if isinstance(m, nn.Linear)]
    seen = []
    for linear in linears:
        linear.register_forward_hook(lambda module, args, output: seen.append(output.dtype))

    inputs, targets = torch.randint(0, VOCAB, (2, BATCH, SEQ))
    runtime.train_step(inputs, targets)

    # Every matmul of every micro-batch, on the worker threads and again in the recomputation during backward.
    assert len(seen) == 2 * CHUNKS * len(linears)
    assert set(seen) == {dtype}
    assert {p.dtype for p in runtime.model.parameters()} == {torch.float32}  # fp32 master weights
