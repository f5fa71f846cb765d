"""Megatron's data path as Megatron-LM's (`get_batch`, `broadcast_data`; review strategy-tuning, finding 10): only a
tensor-parallel group's first rank loads the batch, and its step broadcasts it to the group's other ranks.

Two real gloo ranks, one tensor-parallel group, take their batches from the training loop's own loaders and batch
iterator (`make_loaders`, `Trainer._batches`) over a data set that counts what it is asked for, and train a small
GPT-2 with the strategy's runtime (`Megatron.setup`) against the same model trained whole in one process.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from suite.data import Datasets
from suite.layout import Layout
from suite.models.gpt2 import GPT2
from suite.runtime.dist import DistEnv
from suite.runtime.metrics import PhaseTimer
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.megatron import Megatron
from suite.worker.trainer import Trainer, make_loaders

RANKS, VOCAB, SEQ, BATCH, STEPS = 2, 64, 8, 4, 3
CFG = {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
       "dataset": {"loader_workers": 0}, "seed": 0}


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # the training loop's
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


class CountedTokens(Dataset):
    """Random token sequences; `loaded` counts the items read."""

    def __init__(self, samples: int) -> None:
        self.sequences = torch.randint(0, VOCAB, (samples, SEQ + 1), generator=torch.Generator().manual_seed(0))
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.loaded += 1
        return self.sequences[index, :-1], self.sequences[index, 1:]


def small_gpt2() -> GPT2:
    torch.manual_seed(0)
    return GPT2(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=2, n_embd=16)


def train_rank(rank: int) -> dict:
    cpu = torch.device("cpu")
    cfg = OmegaConf.create(CFG)
    env = DistEnv(rank, RANKS, rank, RANKS, cpu, "gloo")
    layout = Layout(dp=1, mini_batch=BATCH, tp=RANKS)
    context = RankContext(cfg, env, layout, make_precision("fp32", cpu), PhaseTimer(cpu), loss_fn)
    runtime = Megatron(tp=RANKS).setup(small_gpt2(), context)
    data = CountedTokens(BATCH * STEPS)
    # The training loop's batch path, on a stand-in for the Trainer that holds what `_batches` reads.
    trainer = Trainer.__new__(Trainer)
    trainer.loaders = make_loaders(cfg, Datasets(data, data, "language_model"), layout, env)
    trainer.parallel, trainer.timer, trainer.env = runtime, context.timer, env
    batches = list(Trainer._batches(trainer, 0, STEPS))
    losses = torch.stack([runtime.train_step(inputs, targets) for inputs, targets in batches])

    reference = small_gpt2()
    optimizer = torch.optim.SGD(reference.parameters(), lr=CFG["optimizer"]["lr"])
    reference_losses = []
    for inputs, targets in batches if rank == 0 else []:  # the batches that rank 0 loaded
        loss = loss_fn(reference(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reference_losses.append(loss.detach())
    weights = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
               for name, p in runtime.model.named_parameters()}
    return {"loaded": data.loaded, "batch_sizes": [(x.numel(), y.numel()) for x, y in batches],
            "losses": losses, "reference_losses": reference_losses,
            "weights": weights, "reference_weights": {n: p.detach() for n, p in reference.named_parameters()},
            "batch_source": runtime.effective_settings()["megatron.batch_source"]}


def run_rank(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=RANKS)
    torch.save(train_rank(rank), f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow  # starts two ranks
def test_a_tensor_parallel_rank_other_than_the_first_loads_no_batch_and_trains_the_same(tmp_path):
    # Forked: the ranks inherit the imported suite, where spawned ones import torch again.
    mp.start_processes(run_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=RANKS, start_method="fork")
    first, other = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(RANKS))
    assert first["loaded"] == BATCH * STEPS and first["batch_sizes"] == [(BATCH * SEQ,) * 2] * STEPS
    assert other["loaded"] == 0 and other["batch_sizes"] == [(0, 0)] * STEPS  # empty tensors in its step's place
    reference_losses = torch.stack(first["reference_losses"])
    assert reference_losses[0] != reference_losses[-1]  # the weights did move
    for result in (first, other):
        torch.testing.assert_close(result["losses"], reference_losses, rtol=1e-5, atol=1e-6)
        for name, value in first["reference_weights"].items():
            torch.testing.assert_close(result["weights"][name], value, rtol=1e-4, atol=1e-6, msg=name)
        assert result["batch_source"].startswith("tp rank 0 loads it")
