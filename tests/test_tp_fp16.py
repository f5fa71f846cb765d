"""Megatron in fp16: the loss scaler steps over tensor-parallel gradients (DTensors beside plain tensors), and an
overflow in one rank's shard alone makes every rank of the tensor-parallel group skip the step.

Two real gloo ranks build the strategy's runtime (`Megatron.setup`) for a small GPT-2 with tp=2.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from omegaconf import OmegaConf

from suite.layout import Layout
from suite.models.gpt2 import GPT2
from suite.runtime.dist import DistEnv
from suite.runtime.metrics import local_tensor
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.megatron import Megatron

pytestmark = pytest.mark.slow  # starts two ranks

TP, VOCAB, SEQ = 2, 64, 8


def train_step(runtime, precision, inputs, targets) -> None:
    with runtime.loss_context():  # the logits split by vocabulary: the loss on them (loss_parallel)
        precision.backward(F.cross_entropy(runtime.model(inputs).flatten(0, -2), targets.flatten()))
    precision.step(runtime.optimizer)
    runtime.optimizer.zero_grad()


def weights(model) -> list[torch.Tensor]:
    return [local_tensor(p.detach()).clone() for p in model.parameters()]


def run_rank(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)  # a forked rank, as DataLoader's forked workers do
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    cpu = torch.device("cpu")
    cfg = OmegaConf.create({"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}})
    precision = make_precision("fp16", cpu)  # GradScaler("cpu"): the scaler's logic on a GPU
    context = RankContext(cfg, DistEnv(rank, TP, rank, TP, cpu, "gloo"), Layout(dp=1, mini_batch=2, tp=TP),
                          precision, timer=None, loss_fn=None)
    torch.manual_seed(0)
    runtime = Megatron(tp=TP).setup(GPT2(vocab_size=VOCAB, block_size=SEQ, n_layer=1, n_head=2, n_embd=16), context)
    inputs, targets = torch.randint(0, VOCAB, (2, 2, SEQ))

    before = weights(runtime.model)
    train_step(runtime, precision, inputs, targets)
    stepped = weights(runtime.model)
    moved = any(not torch.equal(b, s) for b, s in zip(before, stepped))

    # An overflow in this rank's shard of one split layer only: its peer's gradients are all finite.
    def overflow(grad):
        grad.to_local()[0, 0] = float("inf")
        return grad

    if rank == 1:
        runtime.model.blocks[0].attn.qkv.weight.register_hook(overflow)
    train_step(runtime, precision, inputs, targets)
    kept = all(torch.equal(s, a) for s, a in zip(stepped, weights(runtime.model)))
    torch.save({"moved": moved, "kept": kept, "skipped": precision.skipped_steps}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def test_tensor_parallel_fp16_steps_and_every_rank_skips_an_overflow_in_one_shard(tmp_path):
    # Forked: the ranks inherit the imported suite, where spawned ones import torch again (~10 s on a loaded machine).
    mp.start_processes(run_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=TP, start_method="fork")
    for rank in range(TP):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert result == {"moved": True, "kept": True, "skipped": 1}, (rank, result)
