"""ZeRO runs as DeepSpeed and Hugging Face recommend (review strategy-tuning, findings 2 and 3, U2): overlap_comm on at
every stage (DeepSpeed's ZeRO-2 tutorial config), gradient buckets sized to the network as Hugging Face's "auto"
sizes them (h^2, and at stage 3 prefetch 0.9 h^2 and persistence 10 h) so that they fill and go out while backward
runs, user keys over both, and the engine's resolved settings recorded with the run."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from omegaconf import OmegaConf

from suite.models.gpt2 import GPT2
from suite.runtime.dist import DistEnv
from suite.runtime.metrics import PhaseTimer
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.zero import Zero, hidden_size, meta_model
from suite.sweep.plan import plan

ADAM = ["optimizer.name=adam", "optimizer.lr=0.001", "workers=2"]


def zero_section(*overrides: str) -> dict:
    (point,) = plan([["strategy=zero", *ADAM, *overrides]])
    return point.config_files["ds_config.json"]["zero_optimization"]


@pytest.mark.parametrize("network, dataset, hidden", [
    ("gpt2_medium", "tokens", 1024),  # n_embd, HF's config.hidden_size
    ("gpt2_small", "tokens", 768),
    ("resnet18", "cifar10", 512),  # the pooled features: the last (largest) of HF's ResNet hidden_sizes
    ("resnet50", "cifar10", 2048),
    ("mobilenet_v2", "cifar10", 1280),
])
def test_the_hidden_size_is_what_the_output_layer_reads(network, dataset, hidden):
    (point,) = plan([[f"network={network}", f"dataset={dataset}", "strategy=zero", *ADAM]])
    assert hidden_size(meta_model(point.cfg)) == hidden


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_buckets_are_sized_as_huggingface_auto_sizes_them(stage):
    """GPT-2 medium (h = 1024): reduce buckets of h^2 = 1 M elements where DeepSpeed's default of 5e8 is larger than
    the model (355 M); overlap_comm at every stage (DeepSpeed resolves it false for 1 and 2)."""
    zero = zero_section("dataset=tokens", "network=gpt2_medium", f"strategy.zero_stage={stage}")
    expected = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True,
                "reduce_bucket_size": 1024**2}
    if stage == 3:
        expected |= {"stage3_prefetch_bucket_size": int(0.9 * 1024**2), "stage3_param_persistence_threshold": 10240}
    assert zero == expected


def test_the_users_keys_win():
    zero = zero_section("dataset=tokens", "network=gpt2_tiny", "strategy.zero_stage=2",
                        "+strategy.ds_config.zero_optimization.overlap_comm=false",
                        "+strategy.ds_config.zero_optimization.reduce_bucket_size=500000000")
    assert (zero["overlap_comm"], zero["reduce_bucket_size"]) == (False, 500000000)


WORKERS, BATCH, SEQ, VOCAB, BLOCKS, WIDTH = 2, 2, 32, 512, 4, 64
OLD_DEFAULTS = {"zero_optimization": {"overlap_comm": False, "reduce_bucket_size": 500000000}}  # DeepSpeed's, 1 and 2


def rank_run(rank: int, init_file: str, out: str, stage: int, precision: str, ds_config: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORKERS)
    cpu = torch.device("cpu")
    cfg = OmegaConf.create({"optimizer": {"name": "adam", "lr": 1e-3, "eps": 1e-8, "weight_decay": 0.0},
                            "workers": WORKERS, "batch_size": BATCH, "grad_accum": 1, "precision": precision,
                            "activation_checkpointing": "none"})
    strategy = Zero(zero_stage=stage, ds_config=ds_config)
    context = RankContext(cfg, DistEnv(rank, WORKERS, rank, WORKERS, cpu, "gloo"), strategy.layout(cfg),
                          make_precision(precision, cpu), PhaseTimer(cpu),
                          lambda out, y: F.cross_entropy(out.flatten(0, 1).float(), y.flatten()))
    torch.manual_seed(0)
    runtime = strategy.setup(GPT2(VOCAB, SEQ, BLOCKS, 2, WIDTH), context)
    reductions, at_first_block = [0], []

    def count(args) -> None:
        if args.name.name in ("ALLREDUCE", "REDUCE_SCATTER", "REDUCE"):
            reductions[0] += 1
    for group in list(dist.distributed_c10d._world.pg_map):
        if group.size() > 1:
            group.register_pre_hook(0x5C1F, count)
    if stage < 3:  # stage 3's parameters are partitioned placeholders
        # the gradient of block 0's attention weights: late in backward, after blocks 3 to 1 and the head
        runtime.plain.blocks[0].attn.qkv.weight.register_hook(lambda grad: at_first_block.append(reductions[0]))
    torch.manual_seed(1 + rank)
    inputs, targets = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
    for _ in range(2):
        reductions[0] = 0
        runtime.train_step(inputs, targets)
    torch.save({"settings": runtime.effective_settings(), "reduced_before_block0": at_first_block[-1:],
                "reductions": reductions[0]}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def run(tmp_path, stage: int, precision: str = "fp32", ds_config: dict | None = None) -> dict:
    tmp_path.mkdir(exist_ok=True)
    mp.start_processes(rank_run, args=(str(tmp_path / "init"), str(tmp_path), stage, precision, ds_config or {}),
                       nprocs=WORKERS, start_method="fork")
    return torch.load(tmp_path / "rank0.pt")


@pytest.mark.slow  # starts ranks
@pytest.mark.parametrize("stage", [1, 2])
def test_gradients_go_out_in_buckets_while_backward_runs(tmp_path, stage):
    """With h^2-element buckets (4096 here; a block holds 50 k parameters) the gradients of blocks 3 to 1 have been
    reduced before backward reaches block 0; with DeepSpeed's defaults for stages 1 and 2 (no overlap_comm, 5e8
    elements) none had, and every gradient went out in one reduction at the end of backward."""
    tuned = run(tmp_path / "tuned", stage)
    assert tuned["reduced_before_block0"][0] >= 3 * BLOCKS
    old = run(tmp_path / "old", stage, ds_config=OLD_DEFAULTS)
    assert old["reduced_before_block0"] == [0]
    assert old["reductions"] < tuned["reductions"]
    settings = tuned["settings"]
    resolved = {k.removeprefix("deepspeed.zero_optimization."): v for k, v in settings.items()
                if k.startswith("deepspeed.zero_optimization.")}
    assert resolved == {"overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True,
                        "reduce_bucket_size": WIDTH**2, "use_multi_rank_bucket_allreduce": True,
                        "allgather_bucket_size": 500000000, "stage3_prefetch_bucket_size": 50000000,
                        "stage3_param_persistence_threshold": 100000, "stage3_max_live_parameters": 1000000000,
                        "stage3_max_reuse_distance": 1000000000}
    assert old["settings"]["deepspeed.zero_optimization.overlap_comm"] is False
    assert settings["deepspeed.optimizer"] == "DeepSpeedZeroOptimizer over torch.optim.adam.Adam"
    assert settings["optimizer.implementation"] == "for-loop"  # torch's choice for CPU tensors
    assert settings["precision.implementation"] == "fp32"
    assert settings["deepspeed.gradient_reduction_dtype"] == "float32"


@pytest.mark.slow  # starts ranks
def test_stage3_records_its_prefetch_persistence_and_precision(tmp_path):
    settings = run(tmp_path, 3, "bf16")["settings"]
    assert settings["deepspeed.zero_optimization.stage3_prefetch_bucket_size"] == int(0.9 * WIDTH**2)
    assert settings["deepspeed.zero_optimization.stage3_param_persistence_threshold"] == 10 * WIDTH
    assert settings["deepspeed.zero_optimization.overlap_comm"] is True
    assert settings["precision.implementation"] == "DeepSpeed torch_autocast (bfloat16)"
    assert settings["deepspeed.optimizer"] == "DeepSpeedZeroOptimizer_Stage3 over torch.optim.adam.Adam"
