"""Megatron as Megatron-LM's authors run it (issue 41, review findings 6-9): the embedding and LM head split by
vocabulary with the loss computed on the split logits (never gathered), a multi-tensor optimizer, and the
data-parallel gradient reduction either after backward (Megatron-LM's default) or overlapped with it
(`overlap_grad_reduce`), each recorded as an effective setting.

Two real gloo ranks build the strategy's runtime (`Megatron.setup`) for a small GPT-2 with an odd vocabulary, split
unevenly as GPT-2's 50257 is, and train it against the same model trained whole in one process.
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
from suite.runtime.metrics import PhaseTimer, local_tensor
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.megatron import Megatron, OverlappedReduction, megatron_bucket_size, param_groups
from suite.sweep.plan import plan

RANKS, VOCAB, SEQ, BATCH = 2, 67, 8, 4
# SGD, not Adam: these tests are about what the ranks exchange. Adam divides each gradient by its own magnitude, so
# where the exact gradient is zero or cancels (the keys' bias of attention, which softmax ignores) it turns rounding
# noise, which differs with the CPU's vector width, into steps of lr: 1.1e-5 apart after two steps on AVX-512, 1.7x
# the bound under ATEN_CPU_CAPABILITY=default. SGD moves a weight by lr times its gradient's rounding error
# (~1e-7 relative), far inside rtol 1e-4.
SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # the training loop's
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def small_gpt2() -> GPT2:
    torch.manual_seed(0)
    return GPT2(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=2, n_embd=16)


def runtime_on(rank: int, strategy: Megatron, dp: int):
    cpu = torch.device("cpu")
    cfg = OmegaConf.create({"optimizer": SGD})
    layout = Layout(dp=dp, mini_batch=BATCH, tp=RANKS // dp)
    context = RankContext(cfg, DistEnv(rank, RANKS, rank, RANKS, cpu, "gloo"), layout, make_precision("fp32", cpu),
                          PhaseTimer(cpu), loss_fn)
    return strategy.setup(small_gpt2(), context)


def full_weights(model) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def vocab_parallel_rank(rank: int, out: str) -> dict:
    """tp=2: the logits stay split by vocabulary, the step gathers nothing, and it trains as the whole model."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    runtime = runtime_on(rank, Megatron(tp=RANKS), dp=1)
    torch.manual_seed(1)  # the same batch on both ranks: one tensor-parallel group
    inputs, targets = torch.randint(0, VOCAB, (2, BATCH, SEQ))
    logits = runtime.model(inputs)
    counter = CommDebugMode()
    with counter:
        losses = [runtime.train_step(inputs, targets) for _ in range(2)]
    reference = small_gpt2()
    optimizer = torch.optim.SGD(reference.parameters(), lr=SGD["lr"], momentum=SGD["momentum"], foreach=False)
    reference_losses = []
    for _ in range(2):
        loss = loss_fn(reference(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reference_losses.append(loss.detach())
    weights, reference_weights = full_weights(runtime.model), dict(reference.named_parameters())
    counts = {str(op): n for op, n in counter.get_comm_counts().items() if n}
    return {
        "logits": (isinstance(logits, DTensor) and logits.placements == (Shard(2),), tuple(logits.to_local().shape)),
        "gathers": sum(n for op, n in counts.items() if "all_gather" in op),
        "all_reduces": sum(n for op, n in counts.items() if "all_reduce" in op),
        "losses": (torch.stack(losses), torch.stack(reference_losses)),
        # the equivalence tests' bounds (tests/test_equivalence.py)
        "weights_close": all(torch.allclose(weights[n], p.detach(), rtol=1e-4, atol=1e-6)
                             for n, p in reference_weights.items()),
        "groups": [all(isinstance(p, DTensor) for p in g["params"]) for g in runtime.optimizer.param_groups],
        "foreach": runtime.optimizer.defaults["foreach"],
        "evaluated": tuple(runtime.forward(inputs).shape),
        "effective": runtime.effective_settings(),
    }


def overlapped_rank(rank: int, out: str) -> dict:
    """tp=1, dp=2: buckets of a few thousand gradients are all-reduced while backward runs, to the same averaged
    gradients as the flat all-reduce after backward."""
    torch.manual_seed(10 + rank)  # each replica its own batch
    inputs, targets = torch.randint(0, VOCAB, (2, BATCH, SEQ))
    grads = {}
    for overlap in (False, True):
        runtime = runtime_on(rank, Megatron(tp=1, overlap_grad_reduce=overlap, bucket_size=4000), dp=RANKS)
        with runtime.loss_context():
            runtime.rank.precision.backward(loss_fn(runtime.model(inputs), targets))
        if overlap:
            launched_in_backward = list(runtime.overlapped.launched)
            buckets = len(runtime.overlapped.buckets)
        runtime.reduce_gradients()
        grads[overlap] = {n: local_tensor(p.grad).clone() for n, p in runtime.model.named_parameters()}
        effective = runtime.effective_settings()
    return {"buckets": buckets, "launched_in_backward": launched_in_backward,
            "same": all(torch.allclose(grads[True][n], g, rtol=1e-5, atol=1e-7) for n, g in grads[False].items()),
            "effective": effective}


def run_rank(rank: int, init_file: str, out: str, case) -> None:
    torch.set_num_threads(1)  # a forked rank, as DataLoader's forked workers do
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=RANKS)
    torch.save(case(rank, out), f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def ranks_report(tmp_path, case) -> list[dict]:
    # Forked: the ranks inherit the imported suite, where spawned ones import torch again (~10 s on a loaded machine).
    mp.start_processes(run_rank, args=(str(tmp_path / "init"), str(tmp_path), case), nprocs=RANKS, start_method="fork")
    return [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(RANKS)]


def test_defaults_are_megatron_lms():
    (point,) = plan([["dataset=tokens", "network=gpt2_tiny", "strategy=megatron", "workers=2"]])
    knobs = point.cfg.strategy
    assert knobs.vocab_parallel is True and knobs.overlap_grad_reduce is False and knobs.bucket_size is None
    assert megatron_bucket_size(1) == 40_000_000 and megatron_bucket_size(64) == 64_000_000


def test_split_and_whole_parameters_take_separate_groups():
    from torch.distributed.tensor import DTensor

    model = torch.nn.Linear(2, 2)
    assert [len(g["params"]) for g in param_groups(model)] == [2]  # no DTensor: one group
    assert not any(isinstance(p, DTensor) for p in param_groups(model)[0]["params"])


@pytest.mark.slow  # starts two ranks
def test_vocab_parallel_logits_are_never_gathered_and_train_as_single(tmp_path):
    for rank, result in enumerate(ranks_report(tmp_path, vocab_parallel_rank)):
        # This rank's 34 or 33 of the 67 logits per token, a DTensor split on the vocabulary.
        assert result["logits"] == (True, (BATCH, SEQ, 34 - rank)), rank
        assert result["gathers"] == 0, result
        assert result["all_reduces"] > 0  # the blocks' and the loss's
        torch.testing.assert_close(*result["losses"], rtol=1e-5, atol=1e-6)
        assert result["weights_close"]
        assert result["groups"] == [True, False] and result["foreach"] is True
        assert result["evaluated"] == (BATCH, SEQ, VOCAB)  # evaluation reads the whole logits
        effective = result["effective"]
        assert effective["optimizer.implementation"] == "foreach"
        assert effective["megatron.dp_reduction"] == "none (dp=1)"
        assert effective["megatron.vocab_parallel"].startswith("split")


@pytest.mark.slow  # starts two ranks
def test_overlapped_reduction_runs_in_backward_and_averages_as_the_flat_one(tmp_path):
    for result in ranks_report(tmp_path, overlapped_rank):
        assert result["buckets"] > 2
        assert all(result["launched_in_backward"]), result
        assert result["same"]
        reduction = result["effective"]["megatron.dp_reduction"]
        assert reduction.startswith(f"overlapped with backward: {result['buckets']} bucket(s)")
        assert result["effective"]["megatron.vocab_parallel"] == "whole (tp=1)"  # nothing to split


def test_overlapped_buckets_follow_backward_order():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (5, 3, 4, 2)]
    reduction = OverlappedReduction(params, group=None, dp=2, bucket_size=6)
    assert [[p.numel() for p in bucket] for bucket in reduction.buckets] == [[2, 4], [3], [5]]
