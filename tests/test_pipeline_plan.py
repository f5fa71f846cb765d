"""Pipeline points: micro-batching rules and presets, partitioning, and what is rejected before launch."""

import pytest
import torch

from suite.errors import ConfigError
from suite.models.layers import Layer
from suite.pipeline.microbatch import MicroBatching, micro_batching
from suite.pipeline.partition import stage_sizes
from suite.sweep.plan import plan

TOKENS = ["dataset=tokens", "network=gpt2_tiny", "dataset.seq_len=16", "dataset.samples=512"]

REJECTED = {
    "batch not divisible into micro-batches": (["strategy=1f1b", "workers=2", "batch_size=30",
                                                "strategy.micro_batches=4"],
                                               "batch_size=30 does not split into strategy.micro_batches=4: set "
                                               "strategy.micro_batches to a divisor of 30 (2, 3, 5) or batch_size to a "
                                               "multiple of 4 (32)"),
    "batch not divisible by micro-batch size": (["strategy=gpipe_dist", "workers=2", "batch_size=30",
                                                 "strategy.micro_batch_size=4"],
                                                "micro-batches of strategy.micro_batch_size=4: set "
                                                "strategy.micro_batch_size to a divisor of 30"),
    "workers not a multiple of pp": (["strategy=1f1b", "workers=3", "strategy.pp=2"], "pipelines of 2 stages"),
    "gpipe beyond one node": (["strategy=gpipe", "workers=4", "cluster.workers_per_node=2"],
                              "one process on one node"),
    "gpipe devices do not match workers": (["strategy=gpipe", "workers=2", "strategy.devices=[cpu]"],
                                           "1 devices listed"),
    "unknown checkpoint mode": (["strategy=gpipe", "workers=2", "strategy.checkpoint=sometimes"], "checkpoint="),
    "more stages than layers": ([*TOKENS, "strategy=gpipe_dist", "workers=5", "batch_size=40"],
                                "only 4 layers"),
    "explicit balance of the wrong sum": ([*TOKENS, "strategy=1f1b", "workers=2", "strategy.balance=[1,2]"],
                                          "sum to the network's 4 layers"),
    "unknown balancer": (["strategy=1f1b", "workers=2", "strategy.balance=by_magic"], "balance=by_magic"),
    "study_j preset on tokens": ([*TOKENS, "strategy=gpipe", "workers=2", "strategy.preset=study_j"],
                                 "no GPipe batch for dataset tokens"),
    "study_j preset with micro_batches": (["strategy=gpipe", "workers=2", "strategy.preset=study_j",
                                           "strategy.micro_batches=8"], "leave micro_batches"),
    "interleaving that does not divide": ([*TOKENS, "strategy=1f1b", "workers=2", "strategy.virtual_stages=2",
                                           "batch_size=6", "strategy.micro_batches=3"], "divisible by the 2"),
    "pipedream with micro-batches": (["strategy=pipedream", "workers=2", "+strategy.micro_batches=4"],
                                     "pipedream has no micro_batches"),
    "fp16 in a pipeline": (["strategy=gpipe_dist", "workers=2", "precision=fp16", "cluster=thetagpu",
                            "cluster.job.account=x"], "strategy gpipe_dist does not train in precision=fp16"),
    "replicas that do not sum to the workers": (["strategy=pipedream", "workers=4", "strategy.replicas=[2,1]"],
                                                "replicas=[2, 1] puts 3 ranks on its stages, not the workers=4"),
    "a replicated stage without a rank": (["strategy=pipedream", "workers=4", "strategy.replicas=[2,0,2]"],
                                          "leaves a stage without a rank"),
    "pp and replicas": (["strategy=pipedream", "workers=4", "strategy.pp=2", "strategy.replicas=[2,1,1]"],
                        "give pp or replicas, not both"),
    "a replicated stage with no layers": ([*TOKENS, "strategy=pipedream", "workers=6",
                                           "strategy.replicas=[2,1,1,1,1]"], "only 4 layers"),
    "a replicated stage given no layers": ([*TOKENS, "strategy=pipedream", "workers=4", "strategy.replicas=[2,1,1]",
                                            "strategy.balance=[0,2,2]"], "balance"),
    "activation checkpointing in pipedream": (["strategy=pipedream", "workers=2", "activation_checkpointing=2"],
                                              "strategy pipedream does not apply activation_checkpointing=2"),
}


@pytest.mark.parametrize("case", REJECTED)
def test_bad_pipeline_point_is_rejected(case):
    overrides, expected = REJECTED[case]
    with pytest.raises(ConfigError) as info:
        plan([overrides])
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_presets_follow_the_studies():
    assert micro_batching("study_n", None, None, 32, 4, "cifar10") == MicroBatching(16, 32)  # 4 x stages of 32
    assert micro_batching("study_j", None, None, 64, 4, "cifar10") == MicroBatching(32, 64)  # 2048 in 32
    assert micro_batching("study_j", None, None, 32, 4, "imagenet") == MicroBatching(12, 32)  # 384 in 12
    assert micro_batching(None, None, None, 32, 2, "cifar10") == MicroBatching(8, 4)  # 4 x stages by default
    assert micro_batching(None, None, 8, 32, 2, "cifar10") == MicroBatching(4, 8)


def test_pipeline_point_records_its_pipeline_shape():
    (dp_pp,) = plan([["strategy=1f1b", "workers=4", "strategy.pp=2", "batch_size=16", "strategy.micro_batches=4"]])
    assert dp_pp.global_batch_size == 32  # 2 replicas x a mini-batch of 16
    shape = {"pipeline_stages": 2, "micro_batches": 4, "micro_batch_size": 4, "pipeline_replicas": 2}
    assert {k: dp_pp.layout.params()[k] for k in shape} == shape
    (gpipe,) = plan([["strategy=gpipe", "workers=2", "strategy.preset=study_j"]])
    assert gpipe.global_batch_size == 2048 and gpipe.processes == 1  # one process drives both devices


def test_balance_by_parameters_or_explicit():
    layers = [Layer(f"{i}.", torch.nn.Linear(w, w)) for i, w in enumerate([64, 8, 8, 8, 64])]
    sample = torch.randn(4, 64)
    assert stage_sizes("by_params", layers, 2, sample, torch.device("cpu")) == [2, 3]  # 4160+72 vs 144+4160
    assert stage_sizes([3, 2], layers, 2, sample, torch.device("cpu")) == [3, 2]
