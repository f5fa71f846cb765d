"""The settings a run's libraries resolved, beyond its knobs, are recorded with it as params `effective.<name>`:
the optimizer's kernels, the precision's implementation, TF32 and cuDNN flags, and the communication environment
(issue 41, item 4)."""

import pytest
import torch

from conftest import DIGITS, run_suite
from suite.records.store import Store
from suite.runtime.numerics import optimizer_implementation
from suite.strategies.pipeline import layer_count
from suite.sweep.plan import plan


def test_the_optimizer_implementation_is_the_kernel_torch_runs():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_implementation(torch.optim.SGD(params, lr=0.1, foreach=False)) == "for-loop"
    assert optimizer_implementation(torch.optim.SGD(params, lr=0.1, foreach=True)) == "foreach"
    assert optimizer_implementation(torch.optim.Adam(params, fused=True)) == "fused"
    assert optimizer_implementation(torch.optim.Adam(params)) == "for-loop"  # torch's choice for CPU tensors


@pytest.mark.slow  # two ranks train
def test_a_run_records_what_its_ranks_ran_with(results, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")  # as a site's job setup may export it
    result = run_suite(*DIGITS, "strategy=ddp", "workers=2", "epochs=1", "steps_per_epoch=2",
                       "record_prediction=false", "math.tf32=true", "math.cudnn_benchmark=true")
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = Store().runs("adhoc")
    effective = {k.removeprefix("effective."): v for k, v in run.data.params.items() if k.startswith("effective.")}
    assert effective["optimizer.implementation"] == "for-loop"
    assert effective["precision.implementation"] == "fp32"
    assert run.data.params["math.tf32"] == "True"  # the knob (issue 41, item 2) and what the ranks then ran with
    assert (effective["tf32.matmul"], effective["tf32.conv"], effective["cudnn.benchmark"]) == ("True",) * 3
    assert effective["env.NCCL_DEBUG"] == "WARN"
    assert not any(k.startswith("env.") and not k.startswith(("env.NCCL_", "env.TORCH_NCCL_", "env.HOROVOD_",
                                                              "env.GLOO_", "env.UCX_", "env.FI_"))
                   for k in effective)


@pytest.mark.slow  # two ranks train
def test_a_pipeline_run_records_the_cut_its_balance_made(results):
    overrides = [*DIGITS, "strategy=gpipe_dist", "workers=2", "epochs=1", "steps_per_epoch=2",
                 "record_prediction=false"]
    (point,) = plan([overrides])
    result = run_suite(*overrides)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = Store().runs("adhoc")
    assert run.data.params["strategy.balance"] == "by_time"  # the default, as torchgpipe's authors recommend
    stage_layers = [int(n) for n in run.data.params["effective.pipeline.stage_layers"].split(",")]
    assert len(stage_layers) == 2 and min(stage_layers) >= 1 and sum(stage_layers) == layer_count(point.cfg)


@pytest.mark.slow  # two ranks under horovodrun
def test_a_horovod_run_records_how_horovod_reduces(results):
    """Review U1: whether Horovod reduced on NCCL or through the host, its controller, and the HOROVOD_* settings the
    suite sets from the knobs."""
    result = run_suite(*DIGITS, "strategy=horovod", "workers=2", "epochs=1", "steps_per_epoch=2",
                       "record_prediction=false", "strategy.cycle_time_ms=2.5")
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = Store().runs("adhoc")
    params = run.data.params
    assert (params["effective.horovod.operations"], params["effective.horovod.controller"]) == ("gloo", "gloo")
    assert params["effective.env.HOROVOD_CYCLE_TIME"] == "2.5"
