"""Malformed points are rejected before any process starts, with one clear line and a non-zero exit."""

import pytest

from conftest import run_suite
from suite.errors import ConfigError
from suite.sweep.plan import expand, plan

MALFORMED = {
    "unknown strategy": (["strategy=dpp"], "strategy/dpp"),
    "misspelt key": (["epoch=2"], "epoch"),
    "single on two workers": (["strategy=single", "workers=2"], "strategy single runs one process"),
    "transformer on images": (["network=gpt2_tiny"], "gpt2"),
    "unknown precision": (["precision=fp8"], "precision=fp8"),
    "fp16 without a GPU": (["precision=fp16"], "fp16 needs a GPU"),
    "real data without a path": (["dataset=wikitext103", "network=gpt2_tiny"], "path"),
    "unknown strategy knob": (["strategy=ddp", "+strategy.bucket_cap=5"], "bucket_cap"),
    "bad strategy knob": (["strategy=ddp", "strategy.bucket_cap_mb=0"], "bucket_cap_mb > 0"),
    "fewer samples than a batch": (["strategy=ddp", "workers=2", "dataset.samples=10"], "fewer than one global"),
    "more steps than the data holds": (["dataset=digits", "batch_size=64", "steps_per_epoch=30"],
                                       "steps_per_epoch=30 but 1437 samples give 22 batches"),
    "unknown scheduler": (["cluster.scheduler=sge"], "cluster.scheduler=sge is not one of local, slurm, lsf, pbs"),
    "unreachable accuracy target": (["target.value=95"], "target.value=95.0 is not a reachable val_accuracy"),
    "sync batch-norm on CPU": (["strategy=ddp", "strategy.sync_batchnorm=true"], "GPUs only"),
    "negative workers": (["workers=-1"], "workers must be positive"),
    "zero stage 4": (["strategy=zero", "strategy.zero_stage=4"], "zero_stage must be 1, 2 or 3"),
    "zero parameter offload below stage 3": (["strategy=zero", "strategy.zero_stage=2", "strategy.offload=params"],
                                             "offload=params needs zero_stage=3"),
    "horovod negative fusion threshold": (["strategy=horovod", "strategy.fusion_threshold_mb=-1"],
                                          "fusion_threshold_mb >= 0"),
    "horovod zero cycle time": (["strategy=horovod", "strategy.cycle_time_ms=0"], "cycle_time_ms > 0"),
    "zero with sgd": (["strategy=zero", "optimizer.name=sgd"], "strategy zero does not train with optimizer.name=sgd"),
    "zero with lamb": (["strategy=zero", "optimizer.name=lamb"],
                       "strategy zero does not train with optimizer.name=lamb"),
    "lamb on sharded parameters": (["strategy=fsdp", "workers=2", "optimizer.name=lamb"],
                                   "strategy fsdp does not train with optimizer.name=lamb (use sgd, adam, adamw)"),
    "bf16 on V100s": (["cluster=lassen", "cluster.job.account=x", "precision=bf16"], "not NVIDIA V100; use fp16"),
    "unknown gradient compression": (["strategy=ddp", "grad_compression.name=int8"],
                                     "grad_compression.name=int8 is not one of none, fp16, bf16, powersgd"),
    "gradient compression beyond ddp": (["strategy=zero", "grad_compression.name=fp16"],
                                        "strategy zero does not compress gradients"),
    "powersgd of rank 0": (["strategy=ddp", "grad_compression.name=powersgd", "grad_compression.rank=0"],
                           "grad_compression.rank must be positive"),
    "bad checkpointing interval": (["activation_checkpointing=0"], "activation_checkpointing=0 is not none, every"),
    "checkpointing under megatron": (["dataset=tokens", "network=gpt2_tiny", "strategy=megatron", "workers=2",
                                      "activation_checkpointing=every"],
                                     "strategy megatron does not apply activation_checkpointing=every"),
    "megatron on a CNN": (["strategy=megatron", "workers=2"], "strategy megatron splits GPT-2's attention"),
    "sequence parallel not dividing the sequence": (["dataset=tokens", "dataset.seq_len=33", "network=gpt2_tiny",
                                                     "strategy=megatron", "workers=2",
                                                     "strategy.sequence_parallel=true"],
                                                    "sequence_parallel needs tp=2 to divide dataset.seq_len=33"),
    "megatron tp not dividing workers": (["dataset=tokens", "network=gpt2_tiny", "strategy=megatron", "workers=3"],
                                         "tp=2 does not divide workers=3"),
    "megatron tp not dividing heads": (["dataset=tokens", "network=gpt2_tiny", "strategy=megatron", "workers=4",
                                        "strategy.tp=4", "network.n_head=2", "network.n_embd=64"],
                                       "tp=4 does not divide n_head=2"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_point_is_rejected(case):
    overrides, expected = MALFORMED[case]
    with pytest.raises(ConfigError, match=None) as info:
        plan([overrides])
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_sweep_without_multirun_is_rejected():
    with pytest.raises(ConfigError, match="add -m"):
        expand(["strategy=single,ddp"], multirun=False)


@pytest.mark.slow
def test_cli_rejects_a_bad_sweep_before_launching_anything(results):
    result = run_suite("-m", "strategy=single,ddp", "workers=2")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: strategy=single workers=2: strategy single runs one process, but workers=2"
    ]
    assert not (results / "points").exists()  # nothing was launched


def test_multirun_expands_the_cartesian_product():
    jobs = expand(["strategy=ddp", "workers=1,2", "precision=fp32,bf16"], multirun=True)
    assert len(jobs) == 4 and ["strategy=ddp", "workers=2", "precision=bf16"] in jobs


def test_zero_point_carries_its_deepspeed_config():
    """The generated ds_config follows the point (batches, precision, Study N's Adam) and takes extra keys."""
    (point,) = plan([["strategy=zero", "workers=2", "batch_size=4", "strategy.zero_stage=3", "strategy.offload=params",
                      "precision=bf16", "+strategy.ds_config.zero_optimization.overlap_comm=true"]])
    ds = point.config_files["ds_config.json"]
    batches = (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"])
    assert batches == (8, 4, 1)
    assert ds["optimizer"]["type"] == "Adam"
    assert {k: ds["optimizer"]["params"][k] for k in ("lr", "weight_decay")} == {"lr": 0.001, "weight_decay": 0.01}
    assert ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
    assert ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                       "offload_param": {"device": "cpu"}, "overlap_comm": True}
