"""ZeRO's mixed precision is torch AMP as every other strategy runs it (fp32 parameters, the forward under autocast,
fp16 scaled by DeepSpeed's GradScaler), not DeepSpeed's half-precision parameters: an image network with BatchNorm
trains in bf16 and fp16, an overflow on one rank alone makes every rank skip the step and back off the scale, the
skip is counted, and checkpointed blocks are recomputed under the forward's autocast.

Real gloo ranks (forked) build the strategy's runtime (`Zero.setup`) for a small CNN with BatchNorm.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from suite.runtime.dist import DistEnv
from suite.runtime.metrics import PhaseTimer
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.zero import Zero

pytestmark = pytest.mark.slow  # starts ranks

WORKERS, BATCH, STEPS, OVERFLOW_STEP = 2, 4, 5, 3


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))


def rank_config(precision: str, checkpointing: str = "none", workers: int = WORKERS):
    return OmegaConf.create({"optimizer": {"name": "adam", "lr": 0.01, "eps": 1e-8, "weight_decay": 0.0},
                             "workers": workers, "batch_size": BATCH, "grad_accum": 1, "precision": precision,
                             "activation_checkpointing": checkpointing})


def run_rank(rank: int, init_file: str, out: str, stage: int, precision_name: str) -> None:
    torch.set_num_threads(1)
    os.environ.pop("DS_ACCELERATOR", None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORKERS)
    cpu = torch.device("cpu")
    cfg, strategy = rank_config(precision_name), Zero(zero_stage=stage)
    # The precision as on a GPU: fp16 on the host, which plan() refuses for a point, is the GPU's logic here.
    context = RankContext(cfg, DistEnv(rank, WORKERS, rank, WORKERS, cpu, "gloo"), strategy.layout(cfg),
                          make_precision(precision_name, cpu), PhaseTimer(cpu), lambda out, y: F.cross_entropy(out, y))
    runtime = strategy.setup(cnn(), context)
    linear_outputs = []
    runtime.plain[4].register_forward_hook(lambda module, inputs, output: linear_outputs.append(output.dtype))
    if rank == 1:  # an overflow in this rank's gradients only, at one step
        backwards = [0]

        def overflow(grad):
            backwards[0] += 1
            return grad.clone().fill_(float("inf")) if backwards[0] == OVERFLOW_STEP else grad
        runtime.plain[4].weight.register_hook(overflow)
    torch.manual_seed(1 + rank)
    inputs, targets = torch.randn(BATCH, 3, 8, 8), torch.randint(0, 10, (BATCH,))
    scaler = runtime.optimizer.torch_autocast_gradscaler
    losses, scales, weights = [], [], []
    for _ in range(STEPS):
        losses.append(runtime.train_step(inputs, targets).item())
        scales.append(scaler.get_scale() if scaler else None)
        weights.append(runtime.full_state_dict()["4.weight"])
    torch.save({"losses": losses, "scales": scales, "weights": weights, "skipped": runtime.skipped_steps(),
                "parameter_dtypes": {p.dtype for p in runtime.held_parameters()}, "linear_outputs": linear_outputs,
                "accelerator": os.environ["DS_ACCELERATOR"]}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def train(tmp_path, stage: int, precision: str) -> list[dict]:
    # Forked: the ranks inherit the imported suite, where spawned ones import torch again.
    mp.start_processes(run_rank, args=(str(tmp_path / "init"), str(tmp_path), stage, precision), nprocs=WORKERS,
                       start_method="fork")
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORKERS)]


def test_mixed_precision_is_torch_autocast_not_half_parameters():
    cfg = OmegaConf.create({"workers": 2, "batch_size": 4, "grad_accum": 1, "precision": "bf16",
                            "optimizer": {"name": "adam", "lr": 0.1, "eps": 1e-8, "weight_decay": 0.0}})
    generated = Zero().generated_config(cfg, cnn())
    assert generated["torch_autocast"] == {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    assert "bf16" not in generated and "fp16" not in generated
    assert "torch_autocast" not in Zero().generated_config(OmegaConf.merge(cfg, {"precision": "fp32"}), cnn())


@pytest.mark.parametrize("stage", [1, 3])
def test_fp16_trains_fp32_parameters_and_every_rank_skips_one_ranks_overflow(tmp_path, stage):
    ranks = train(tmp_path, stage, "fp16")
    for rank in ranks:
        assert rank["parameter_dtypes"] == {torch.float32}
        assert set(rank["linear_outputs"]) == {torch.float16}
        assert rank["accelerator"] == "cpu"
        step = OVERFLOW_STEP - 1
        assert torch.equal(rank["weights"][step], rank["weights"][step - 1])  # skipped on every rank
        assert rank["scales"][step] == rank["scales"][step - 1] / 2  # and the scale backed off
        assert rank["skipped"] >= 1 and rank["losses"][-1] < rank["losses"][0]
    assert ranks[0]["skipped"] == ranks[1]["skipped"] and ranks[0]["scales"] == ranks[1]["scales"]


def test_bf16_trains_an_image_network_with_batchnorm(tmp_path):
    for rank in train(tmp_path, 1, "bf16"):
        assert rank["parameter_dtypes"] == {torch.float32}
        assert set(rank["linear_outputs"]) == {torch.bfloat16}
        assert rank["skipped"] == 1 and rank["scales"] == [None] * STEPS  # the overflow, with no scale to back off
        assert rank["losses"][-1] < rank["losses"][0]


def recompute_rank(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)  # forked: the parent's thread pool does not survive a fork (DataLoader's workers do this)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=1)
    cpu = torch.device("cpu")
    cfg, strategy = rank_config("bf16", checkpointing="every", workers=1), Zero(zero_stage=1)
    context = RankContext(cfg, DistEnv(0, 1, 0, 1, cpu, "gloo"), strategy.layout(cfg), make_precision("bf16", cpu),
                          PhaseTimer(cpu), None)
    strategy.setup(nn.Linear(4, 4), context)  # configures DeepSpeed's checkpointing
    block, output_dtypes = nn.Linear(8, 8), []

    def forward(x):
        y = block(x)
        output_dtypes.append(y.dtype)
        return y
    x = torch.randn(2, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = strategy.checkpoint_fn()(forward, x)
    y.float().sum().backward()  # outside autocast, as the engine's backward runs
    torch.save(output_dtypes, f"{out}/output_dtypes.pt")
    dist.destroy_process_group()


def test_checkpointed_blocks_recompute_under_the_forwards_autocast(tmp_path):
    mp.start_processes(recompute_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=1, start_method="fork")
    assert torch.load(tmp_path / "output_dtypes.pt") == [torch.bfloat16, torch.bfloat16]  # forward, recomputation
