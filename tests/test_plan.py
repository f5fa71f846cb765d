"""Malformed points are rejected before any process starts, with one clear line and a non-zero exit."""

import re
import subprocess
import sys

import pytest

from conftest import run_suite
from suite.errors import ConfigError
from suite.paths import CONF_DIR
from suite.strategies import build_strategy
from suite.sweep.plan import plan
from suite.sweep.sweep_files import expand, sweep_lines

MALFORMED = {
    "unknown strategy": (["strategy=dpp"], "strategy=dpp: no such strategy; did you mean ddp? (strategy: 1f1b, "),
    "misspelt key": (["epoch=2"], "epoch=2: the config has no key epoch; did you mean epochs? (its keys: "),
    "misspelt knob": (["strategy=gpipe", "strategy.micro_batche=4"],
                      "strategy.micro_batche=4: strategy has no key micro_batche; did you mean micro_batches?"),
    "misspelt cluster": (["cluster=lasen"], "cluster=lasen: no such cluster; did you mean lassen?"),
    # the choices listed are networks, not the schema Hydra stores beside them (network_schema)
    "unknown network": (["network=gpt2_xl"], "network=gpt2_xl: no such network; did you mean gpt2_small? (network: "
                        "gpt2_medium, gpt2_mini, gpt2_mini_wide, gpt2_nano, gpt2_small, gpt2_tiny, llama3_405b, "
                        "llama3_70b, llama3_8b, llama3_nano, llama3_tiny, mobilenet_v2, resnet152"),
    "a framework's implementation run": (["framework=megatron_lm"], "Megatron-LM's implementation is priced, not run"),
    "single on two workers": (["strategy=single", "workers=2"], "strategy single runs one process"),
    "transformer on images": (["network=gpt2_tiny"], "gpt2"),
    "unknown precision": (["precision=fp8"], "precision=fp8"),
    "fp16 without a GPU": (["precision=fp16"], "fp16 needs a GPU"),
    "real data without a path": (["dataset=wikitext103", "network=gpt2_tiny"], "path"),
    "unknown strategy knob": (["strategy=ddp", "+strategy.bucket_cap=5"], "bucket_cap"),
    "bad strategy knob": (["strategy=ddp", "strategy.bucket_cap_mb=0"], "bucket_cap_mb > 0"),
    "word for a number knob": (["strategy=ddp", "strategy.bucket_cap_mb=abc"],
                               "strategy ddp: bucket_cap_mb=abc is not a number"),
    "word for a boolean knob": (["strategy=ddp", "strategy.static_graph=maybe"],
                                "strategy ddp: static_graph=maybe is not true or false"),
    "fraction for an integer knob": (["strategy=zero", "optimizer.name=adam", "strategy.zero_stage=1.5"],
                                     "strategy zero: zero_stage=1.5 is not an integer"),
    "word for an optional integer knob": (["dataset=tokens", "network=gpt2_tiny", "strategy=1f1b", "workers=2",
                                           "strategy.micro_batches=many"],
                                          "strategy 1f1b: micro_batches=many is not an integer or null"),
    "numbers for a list of strings": (["strategy=gpipe", "workers=2", "strategy.devices=[0,1]"],
                                      "strategy gpipe: devices=[0, 1] is not a list of strings or null"),
    "word for a mapping knob": (["strategy=zero", "optimizer.name=adam", "strategy.ds_config=abc"],
                                "strategy zero: ds_config=abc is not a mapping"),
    "fewer samples than a batch": (["strategy=ddp", "workers=2", "dataset.samples=10"], "fewer than one global"),
    "more steps than the data holds": (["dataset=digits", "batch_size=64", "steps_per_epoch=30"],
                                       "steps_per_epoch=30 but 1437 samples give 22 batches"),
    "unknown scheduler": (["cluster.scheduler=sge"], "cluster.scheduler=sge is not one of local, slurm, lsf, pbs"),
    "unreachable accuracy target": (["target.value=95"], "target.value=95.0 is not a reachable val_accuracy"),
    "sync batch-norm on CPU": (["strategy=ddp", "strategy.sync_batchnorm=true"], "GPUs only"),
    "negative workers": (["workers=-1"], "workers must be positive"),
    "negative momentum": (["optimizer.momentum=-0.9"], "optimizer.momentum must be >= 0, got -0.9"),
    "negative weight decay": (["optimizer.weight_decay=-0.01"], "optimizer.weight_decay must be >= 0, got -0.01"),
    "negative eps": (["optimizer.name=adam", "optimizer.eps=-1e-8"], "optimizer.eps must be >= 0, got -1e-08"),
    "negative stop margin": (["cluster.job.stop_margin_s=-5"], "cluster.job.stop_margin_s must be >= 0, got -5"),
    "no memory a rank": (["cluster.job.mem_per_worker_gb=0"], "cluster.job.mem_per_worker_gb must be positive"),
    "fault before the first step": (["fault.kind=error", "fault.step=0"], "fault.step must be >= 1"),
    "zero stage 4": (["strategy=zero", "strategy.zero_stage=4"], "zero_stage must be 1, 2 or 3"),
    "zero parameter offload below stage 3": (["strategy=zero", "strategy.zero_stage=2", "strategy.offload=params"],
                                             "offload=params needs zero_stage=3"),
    "horovod negative fusion threshold": (["strategy=horovod", "strategy.fusion_threshold_mb=-1"],
                                          "fusion_threshold_mb >= 0"),
    "horovod zero cycle time": (["strategy=horovod", "strategy.cycle_time_ms=0"], "cycle_time_ms > 0"),
    "zero with sgd": (["strategy=zero", "optimizer.name=sgd"], "strategy zero does not train with optimizer.name=sgd"),
    "zero with the default optimizer": (["strategy=zero"], "strategy zero does not train with optimizer.name=sgd (the "
                                        "default; set optimizer.name=adam or adamw and an optimizer.lr for it)"),
    "zero with lamb": (["strategy=zero", "optimizer.name=lamb"],
                       "strategy zero does not train with optimizer.name=lamb"),
    "lamb on sharded parameters": (["strategy=fsdp", "workers=2", "optimizer.name=lamb"],
                                   "strategy fsdp does not train with optimizer.name=lamb (use sgd, adam, adamw)"),
    "bf16 on V100s": (["cluster=lassen", "cluster.job.account=x", "precision=bf16"], "not NVIDIA V100; use fp16"),
    "unknown gradient compression": (["strategy=ddp", "grad_compression.name=int8"],
                                     "grad_compression.name=int8 is not one of none, fp16, bf16, powersgd"),
    "gradient compression beyond ddp": (["strategy=zero", "optimizer.name=adam", "grad_compression.name=fp16"],
                                        "strategy zero does not compress gradients"),
    "powersgd of rank 0": (["strategy=ddp", "grad_compression.name=powersgd", "grad_compression.rank=0"],
                           "grad_compression.rank must be positive"),
    "bad checkpointing interval": (["activation_checkpointing=0"], "activation_checkpointing=0 is not none, every"),
    "selective recomputation of a CNN": (["activation_checkpointing=selective"],
                                         "activation_checkpointing=selective recomputes a decoder's attention cores; "
                                         "network resnet18 has none"),
    "operator-level selective recomputation of a CNN": (["activation_checkpointing=selective_op"],
                                                        "activation_checkpointing=selective_op checkpoints a decoder's "
                                                        "blocks; network resnet18 has none"),
    "operator-level selective recomputation under DeepSpeed": (["dataset=tokens", "network=gpt2_tiny", "strategy=zero",
                                                                "optimizer.name=adam",
                                                                "activation_checkpointing=selective_op"],
                                                               "strategy zero checkpoints with its library's own "
                                                               "function"),
    "selective recomputation under torchgpipe": (["dataset=tokens", "network=gpt2_tiny", "strategy=gpipe", "workers=2",
                                                  "activation_checkpointing=selective"],
                                                 "strategy gpipe does not apply activation_checkpointing=selective"),
    "no micro-batch to accumulate": (["grad_accum=0"], "grad_accum must be positive, got 0"),
    "accumulation under horovod": (["strategy=horovod", "grad_accum=2"],
                                   "strategy horovod does not accumulate gradients (grad_accum=2); leave it 1 (ddp, "
                                   "fsdp, megatron, single, zero accumulate)"),
    "accumulation in a pipeline": (["strategy=1f1b", "workers=2", "grad_accum=2"],
                                   "a pipeline's micro-batches are its accumulation (strategy.micro_batches)"),
    "megatron on a CNN": (["strategy=megatron", "workers=2"], "strategy megatron splits a decoder's attention"),
    "sequence parallel not dividing the sequence": (["dataset=tokens", "dataset.seq_len=33", "network=gpt2_tiny",
                                                     "strategy=megatron", "workers=2",
                                                     "strategy.sequence_parallel=true"],
                                                    "sequence_parallel needs tp=2 to divide dataset.seq_len=33"),
    "sequence parallel in fsdp without tp": (["dataset=tokens", "network=gpt2_tiny", "strategy=fsdp", "workers=2",
                                              "strategy.sequence_parallel=true"],
                                             "strategy fsdp: sequence_parallel splits the sequence over "
                                             "tensor-parallel ranks; set strategy.tp > 1"),
    "megatron tp not dividing workers": (["dataset=tokens", "network=gpt2_tiny", "strategy=megatron", "workers=3"],
                                         "tp=2 does not divide 3 workers"),
    "megatron tp not dividing heads": (["dataset=tokens", "network=gpt2_tiny", "strategy=megatron", "workers=4",
                                        "strategy.tp=4"],
                                       "tp=4 does not divide n_head=2"),
    "axonn tp not dividing workers": (["strategy=axonn", "workers=3", "strategy.tp=2"],
                                      "strategy axonn: tp=2 does not divide workers=3"),
    "axonn tp with its pipeline": (["strategy=axonn", "workers=4", "strategy.tp=2", "strategy.pp=2"],
                                   "strategy axonn: tp > 1 (intra-layer) runs outside AxoNN's engine, one micro-batch "
                                   "per step: leave pp at 1 and micro_batches, micro_batch_size and preset unset"),
    "3D layout not the world size": (["dataset=tokens", "network=gpt2_tiny", "strategy=1f1b", "workers=6",
                                      "strategy.pp=2", "strategy.tp=2"],
                                     "strategy 1f1b: workers=6 do not form pipelines of 2 stages x tp=2"),
    "3D tp not dividing heads": (["dataset=tokens", "network=gpt2_tiny", "strategy=1f1b", "workers=8",
                                  "strategy.pp=2", "strategy.tp=4"],
                                 "strategy 1f1b: tp=4 does not divide n_head=2 of gpt2_tiny"),
    "3D tp of a CNN": (["strategy=gpipe_dist", "workers=4", "strategy.pp=2", "strategy.tp=2"],
                       "strategy gpipe_dist: tp=2 splits a decoder's attention and MLP"),
    "3D tp in one stage": (["dataset=tokens", "network=gpt2_tiny", "strategy=1f1b", "workers=2", "strategy.pp=1",
                            "strategy.tp=2"], "tp=2 in one stage is tensor parallelism alone: use strategy=megatron"),
    "a V schedule without two chunks a rank": (["dataset=tokens", "network=gpt2_tiny", "strategy=1f1b", "workers=2",
                                                 "strategy.schedule=zbv"],
                                                "schedule=zbv runs two chunks a rank, in a V: set "
                                                "strategy.virtual_stages=2 (not 1)"),
    "dualpipev with fewer micro-batches than chunks": (["dataset=tokens", "network=gpt2_tiny", "strategy=1f1b",
                                                        "workers=2", "strategy.schedule=dualpipev",
                                                        "strategy.virtual_stages=2", "strategy.micro_batches=2"],
                                                       "schedule=dualpipev needs at least as many micro-batches as "
                                                       "chunks, 4; micro_batches=2"),
    "memory-efficient attention on CPU": (["dataset=tokens", "network=gpt2_tiny", "network.attention=efficient"],
                                          "network.attention=efficient needs a GPU"),
    "flash attention on V100s": (["dataset=tokens", "network=gpt2_tiny", "cluster=lassen", "cluster.job.account=x",
                                  "precision=fp16", "network.attention=flash"],
                                 "needs bf16 or fp16 on a GPU of compute capability 8.0+ (torch's FlashAttention-2), "
                                 "not compute capability 7.0"),
    "flash attention in fp32 on a GPU": (["dataset=tokens", "network=gpt2_tiny", "cluster=dgx_a100_80gb",
                                          "cluster.job.account=x", "network.attention=flash"],
                                         "not precision=fp32; use auto, efficient or math"),
    "unknown attention kernel": (["dataset=tokens", "network=gpt2_tiny", "network.attention=sdpa"],
                                 "network.attention"),
    "unknown network family": (["network.family=alexnet"],
                               "network.family=alexnet is not one of gpt2, llama3, resnet, vgg, mobilenet"),
    "unknown network size": (["network=resnet18", "network.size=34"],
                             "network.size=34 is not a size of resnet: one of 18, 50, 152"),
    "network size of the wrong type": (["dataset=tokens", "network=gpt2_tiny", "network.size=[1,2]"],
                                       "network.size=[1, 2]: Cannot convert 'list' to string"),
    # Seen on an H100: gloo's send of a CUDA tensor fails ("writev ... Bad address").
    "pipeline stages on shared GPUs": (["cluster=slurm", "cluster.share_gpus=true", "dataset=tokens",
                                        "network=gpt2_tiny", "strategy=1f1b", "workers=2"],
                                       "strategy 1f1b: its stages send each other CUDA tensors, which gloo cannot"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_point_is_rejected(case):
    overrides, expected = MALFORMED[case]
    with pytest.raises(ConfigError, match=None) as info:
        plan([overrides])
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_a_misspelt_name_is_answered_before_torch_is_imported(results):
    """Issue 59: `strategy=dpp` took 12-20 s to reject, after the heavy imports; composed first it takes about one."""
    probe = ("import sys; from suite.__main__ import main; code = main(['strategy=dpp', 'workers=2']); "
             "print(code, sorted(m for m in ('torch', 'mlflow') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.split("\n")[0] == "2 []", result.stdout + result.stderr
    assert result.stderr.startswith("error: strategy=dpp: no such strategy; did you mean ddp?"), result.stderr


def test_a_bad_network_size_rejects_a_sweep_that_records_invalid_points():
    invalid = []
    with pytest.raises(ConfigError, match=None) as info:
        plan([["network=resnet18"], ["network=resnet18", "network.size=34"]], invalid=invalid)
    assert str(info.value) == "network=resnet18 network.size=34: network.size=34 is not a size of resnet: one of 18, " \
                              "50, 152"
    assert invalid == []


def test_a_point_is_recorded_under_the_name_of_the_network_it_builds():
    """A dimension overridden on a size is another network, with a name of its own; the dimensions of a size are
    that size, however they are given (one point, one identity)."""
    tokens = ["dataset=tokens", "strategy=single"]
    tiny, deeper, mini = plan([[*tokens, "network=gpt2_tiny"], [*tokens, "network=gpt2_tiny", "network.n_layer=4"],
                               [*tokens, "network=gpt2_tiny", "network.n_layer=4", "network.n_head=4",
                                "network.n_embd=128"], [*tokens, "network=gpt2_mini"]])
    assert [p.label for p in (tiny, deeper, mini)] == ["tokens/gpt2_tiny/single/w1", "tokens/gpt2_L4_H2_E64/single/w1",
                                                       "tokens/gpt2_mini/single/w1"]
    assert (deeper.cfg.network.n_layer, deeper.cfg.network.n_embd, deeper.cfg.network.size) == (4, 64, None)
    (by_size,) = plan([[*tokens, "network=gpt2_tiny", "network.size=mini"]])
    assert by_size.config_hash == mini.config_hash
    # GPT-2's dimensions given to a whole grid (bench-model's ARGS) leave its CNNs as they are
    (resnet,) = plan([["network=resnet18"], ["network=resnet18", "network.n_layer=1"]])  # one point, one identity
    assert (resnet.cfg.network.name, resnet.cfg.network.n_layer) == ("resnet18", 0)


@pytest.mark.parametrize("sweep", sorted(path.stem for path in (CONF_DIR / "sweep").glob("*.yaml")))
def test_every_sweep_file_expands_and_picks_its_networks_by_name(sweep):
    """Its interpolations resolve, its lines parse, and a network is a named size, not a size's dimensions
    overridden."""
    jobs = [job for line in sweep_lines(sweep) for job in expand(line, multirun=True)]
    assert jobs and not [o for job in jobs for o in job if o.startswith("network.n_")]


def test_sweep_without_multirun_is_rejected():
    with pytest.raises(ConfigError, match="add -m"):
        expand(["strategy=single,ddp"], multirun=False)


@pytest.mark.slow
def test_a_grid_skips_the_points_that_cannot_run_and_refuses_one_where_none_can(results):
    result = run_suite("-m", "strategy=single,ddp", "workers=1,2", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines()[-2:] == [
        "skipped cifar10/resnet18/single/w2: strategy single runs one process, but workers=2",
        "skipped 1 point(s) that cannot run; 3 to run"]
    assert "3 point(s); results in" in result.stdout
    result = run_suite("-m", "strategy=single", "workers=2,3")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: strategy=single workers=2: strategy single runs one process, but workers=2",
        "error: strategy=single workers=3: strategy single runs one process, but workers=3"]
    result = run_suite("strategy=single", "workers=2")  # asked for alone: refused as it is
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: strategy single runs one process, but workers=2"]
    assert not (results / "points").exists()  # nothing was launched


def test_points_of_one_label_are_named_apart_by_the_overrides_they_differ_in():
    """Issue 59: 11 of study_n_mini's runs shared their name with another in MLflow's runs table."""
    common = ["dataset=tokens", "network=gpt2_tiny", "workers=2", "optimizer.name=adam"]
    points = plan([[*common, "strategy=zero", f"strategy.zero_stage={stage}"] for stage in (1, 3)]
                  + [[*common, "strategy=ddp"], [*common[:-1], "strategy=ddp", "optimizer.name=lamb"]])
    assert [p.run_name for p in points] == [
        "tokens/gpt2_tiny/zero/w2 strategy.zero_stage=1", "tokens/gpt2_tiny/zero/w2 strategy.zero_stage=3",
        "tokens/gpt2_tiny/ddp/w2 optimizer.name=adam", "tokens/gpt2_tiny/ddp/w2 optimizer.name=lamb"]
    (alone,) = plan([[*common, "strategy=ddp"]])
    assert alone.run_name == alone.label == "tokens/gpt2_tiny/ddp/w2"


def test_multirun_expands_the_cartesian_product():
    jobs = expand(["strategy=ddp", "workers=1,2", "precision=fp32,bf16"], multirun=True)
    assert len(jobs) == 4 and ["strategy=ddp", "workers=2", "precision=bf16"] in jobs


def test_zero_point_carries_its_deepspeed_config():
    """The generated ds_config follows the point (batches, precision, Study N's Adam) and takes extra keys, which win
    over the generated ones (overlap_comm is generated true: tests/test_zero_tuning.py)."""
    (point,) = plan([["strategy=zero", "optimizer.name=adam", "optimizer.lr=0.001", "optimizer.weight_decay=0.01",
                      "workers=2", "batch_size=4", "strategy.zero_stage=3", "strategy.offload=params",
                      "precision=bf16", "+strategy.ds_config.zero_optimization.overlap_comm=false"]])
    ds = point.config_files["ds_config.json"]
    batches = (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"])
    assert batches == (8, 4, 1)
    assert ds["optimizer"]["type"] == "Adam"
    assert {k: ds["optimizer"]["params"][k] for k in ("lr", "weight_decay")} == {"lr": 0.001, "weight_decay": 0.01}
    assert ds["torch_autocast"]["dtype"] == "bfloat16" and "bf16" not in ds and "fp16" not in ds
    zero = ds["zero_optimization"]
    assert {k: zero[k] for k in ("stage", "offload_optimizer", "offload_param", "overlap_comm")} == {
        "stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}, "overlap_comm": False}


def test_a_problem_of_several_points_is_one_line_with_their_count():
    with pytest.raises(ConfigError) as info:
        plan(expand(["strategy=single,ddp", "precision=fp32,fp16", "workers=2"], multirun=True))
    assert str(info.value).splitlines() == [
        "strategy=single precision=fp32 workers=2: strategy single runs one process, but workers=2",
        "precision=fp16 needs a GPU (loss scaling); use bf16 on CPU (2 of 4 points, e.g. strategy=single "
        "precision=fp16 workers=2)",
    ]


def test_a_problem_of_every_point_says_so():
    with pytest.raises(ConfigError) as info:
        plan(expand(["strategy=single,ddp", "workers=1,2", "precision=fp8"], multirun=True))
    assert str(info.value) == "precision=fp8 is not one of fp32, bf16, fp16 (all 4 points)"


def test_strategies_compared_in_one_sweep_train_with_the_points_optimizer():
    """No strategy changes the optimizer behind the point's back: `-m strategy=ddp,zero` compares like with like."""
    ddp, zero = plan(expand(["strategy=ddp,zero", "workers=2", "optimizer.name=adam"], multirun=True))
    assert ddp.cfg.optimizer == zero.cfg.optimizer


@pytest.mark.parametrize("overrides, knob, value", [
    (["strategy=ddp", "strategy.bucket_cap_mb=5"], "bucket_cap_mb", 5),  # an integer is a number
    (["dataset=tokens", "network=gpt2_tiny", "strategy=1f1b", "workers=2", "strategy.pp=null"], "pp", None),
    (["strategy=gpipe", "workers=2", "strategy.devices=[cpu,cpu]"], "devices", ["cpu", "cpu"]),
    (["strategy=gpipe", "workers=2", "strategy.balance=[5,5]"], "balance", [5, 5]),  # Any
    (["strategy=zero", "optimizer.name=adam", "+strategy.ds_config.zero_optimization.overlap_comm=true"],
     "ds_config", {"zero_optimization": {"overlap_comm": True}}),
], ids=["int_for_float", "optional_int", "list_of_strings", "any", "mapping"])
def test_knobs_of_their_type_are_taken(overrides, knob, value):
    (point,) = plan([overrides])
    assert getattr(build_strategy(point.cfg), knob) == value


def test_only_a_sweep_with_a_horovod_point_needs_horovod():
    """The default sweep runs on `make setup` alone; a horovod point needs `make horovod` too."""
    smoke = plan([job for line in sweep_lines("smoke") for job in expand(line, multirun=True)])
    assert {library.make_target for point in smoke for library in point.strategy.requires} <= {"setup"}
    (horovod,) = plan([["strategy=horovod", "workers=2"]])
    assert [library.make_target for library in horovod.strategy.requires] == ["horovod"]


# Hashes these points had when they were first recorded: a setting added since must leave them as they were
# (IDENTITY_DEFAULTS), or every stored sweep would run again instead of resuming.
RECORDED_HASHES = {
    ("dataset=tokens", "network=gpt2_tiny", "strategy=ddp", "workers=2"): "292d909a248d4fd1",
    ("dataset=cifar10", "network=resnet18", "strategy=zero", "strategy.zero_stage=3", "workers=2",
     "optimizer.name=adam", "optimizer.lr=0.001"): "d50f85c17a6a2a46",
}


@pytest.mark.parametrize("line", RECORDED_HASHES, ids=["ddp", "zero3"])
def test_a_points_identity_is_what_it_was_when_recorded(line):
    (point,) = plan([list(line)])
    assert point.config_hash == RECORDED_HASHES[line]
    (shared,) = plan([[*line, "cluster.share_gpus=true"]])
    assert shared.config_hash != point.config_hash
    # The machine's description is not a point's identity, but the memory a CPU rank is held to changes what runs.
    (described,) = plan([[*line, "cluster.hardware.cores_per_node=2"]])
    assert described.config_hash == point.config_hash
    held = {gb: plan([[*line, f"cluster.hardware.device_memory_gb={gb}"]])[0].config_hash for gb in (1, 2)}
    assert len({point.config_hash, *held.values()}) == 3


def test_a_large_grid_says_how_many_points_it_plans_and_how_far_it_is(monkeypatch, capsys):
    """Hostile inputs 3, case 7: 1,000 points planned in minutes of silence. The count first, then a line every
    few seconds (here every point: the thresholds lowered)."""
    from suite.sweep.compose import PlanningProgress

    monkeypatch.setattr(PlanningProgress, "ANNOUNCED", 3)
    monkeypatch.setattr(PlanningProgress, "EVERY_S", 0.0)
    points = plan([["dataset=digits", "network=resnet18", f"seed={seed}"] for seed in range(3)])
    assert len(points) == 3
    # the seconds as the machine takes them: a loaded one composes a point in more than one
    lines = [re.sub(r" in \d+ s$", " in N s", line) for line in capsys.readouterr().err.splitlines()[:5]]
    assert lines == ["[plan] 3 points to plan", "[plan] 0 of 3 points composed in N s",
                     "[plan] 1 of 3 points composed in N s", "[plan] 2 of 3 points composed in N s",
                     "[plan] 0 of 3 points checked in N s"]


def test_a_grid_composes_each_choice_of_files_once_into_the_configs_hydra_composes_whole():
    """Hostile inputs 3, case 7: Hydra composes about ten points a second. Points that differ in values only share
    one composition; each is what Hydra composes whole, values, added and deleted keys, nested groups and errors
    alike."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from suite.config import register_schema
    from suite.sweep.compose import Composer, compose_point

    jobs = [["dataset=tokens", "network=gpt2_tiny", f"strategy={s}", f"workers={w}", f"optimizer.lr={lr}"]
            for s in ("ddp", "megatron") for w in (1, 2) for lr in ("0.1", "1e-3")]
    jobs += [["strategy=ddp", "strategy.bucket_cap_mb=5", "seed=3"], ["cluster=lassen", "cluster/gpu=a100_sxm4_40gb",
             "cluster.job.account=x"], ["strategy=ddp", "+strategy.extra=1"], ["~tracking.experiment"],
             ["strategy=megatron", "strategy.tpp=2"], ["workers=abc"], ["strategy=dpp", "workers=2"], ["epoch=2"]]

    def outcome(compose, overrides):
        try:
            return OmegaConf.to_yaml(compose(overrides))
        except ConfigError as e:
            return f"error: {e}"

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        composer = Composer()
        for overrides in jobs:
            assert outcome(composer, overrides) == outcome(compose_point, overrides), overrides
    assert len(composer.files) == 9  # the grid's 8 points: 2 (one a strategy); the other 8 points: 7 (2 the defaults)
    assert outcome(composer, ["epoch=2"]).startswith("error: epoch: the config has no key epoch; did you mean epochs?")


def test_a_points_hash_taken_while_it_is_checked_is_the_hash_of_its_config():
    """Planning takes the resolved config once, for the checks and the hash, and builds a strategy once per set of
    knobs: the points are what planning them one by one made."""
    from suite.sweep.plan import config_hash
    from suite.sweep.sweep_files import sweep_jobs

    jobs = [job for name in ("smoke", "pipelines", "layouts_3d", "model_bench") for job in sweep_jobs(name, [])]
    points = plan(jobs, invalid=[])
    assert len(points) > 50
    assert all(p.config_hash == config_hash(p.cfg) for p in points)
    assert all(p.strategy == build_strategy(p.cfg) for p in points)
