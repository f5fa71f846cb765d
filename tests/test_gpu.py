"""The CUDA paths on a real GPU (`make test-gpu`; `make test` does not collect these): the `gpu_checks` sweep through
the real driver, every point's record, and fp16 loss scaling."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from suite.paths import REPO_ROOT
from suite.records.store import Store
from suite.runtime.precision import make_precision
from suite.vocabulary import DEVICE_MEMORY

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CONTRACT = {"epoch_time_s_mean", "throughput_samples_s_mean", "peak_memory_mb", "time_forward_s", "time_backward_s",
            "time_optimizer_s", "samples_per_epoch", "peak_cuda_allocated_mb", "peak_cuda_reserved_mb",
            "achieved_tflops"}
# What NVML sees a process hold beyond the allocator's cache: the CUDA context, cuBLAS/cuDNN workspaces, NCCL.
CONTEXT_MB = 3072


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory) -> Store:
    """The store of one `gpu_checks` sweep, run through the real driver."""
    assert torch.cuda.is_available(), "make test-gpu needs a CUDA GPU"
    results = tmp_path_factory.mktemp("results")
    env = {**os.environ, "SUITE_RESULTS_DIR": str(results)}
    env.pop("MLFLOW_TRACKING_URI", None)
    sweep = subprocess.run([sys.executable, "-m", "suite", "--sweep", "gpu_checks"], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=1800)
    print(sweep.stdout[-6000:], sweep.stderr[-6000:])
    assert (results / "mlflow.db").exists(), sweep.stderr[-2000:]
    return Store(f"sqlite:///{results / 'mlflow.db'}")


@pytest.fixture(scope="module")
def gpu_runs(sweep_store) -> dict:
    """Every point's run, by (strategy, zero stage or tp, precision, workers)."""
    return {key(r): r for r in sweep_store.runs("gpu_checks") if "suite.sweep" not in r.data.tags}


def key(run) -> tuple[str, str, str, int]:
    p = run.data.params
    variant = p.get("strategy.zero_stage") or p.get("strategy.tp") or ""
    return p["strategy"], variant, p["precision"], int(p["workers"])


def failures(gpu_runs: dict, check) -> list[str]:
    """`check(run)` over every finished run: the messages of those it finds wrong."""
    found = []
    for k, run in sorted(gpu_runs.items()):
        if run.data.tags["suite.status"] == "finished":
            found += [f"{k}: {message}" for message in check(run)]
    return found


def test_every_strategy_finishes_on_cuda(gpu_runs):
    failed = [f"{k}: {r.data.tags['suite.status']}: {r.data.tags.get('suite.error', '')}"
              for k, r in sorted(gpu_runs.items()) if r.data.tags["suite.status"] != "finished"]
    assert not failed, "\n".join(failed)
    assert len(gpu_runs) == 22


def test_contract_metrics_and_cuda_event_phase_times(gpu_runs):
    stage_phases = {"time_forward_s", "time_backward_s"}

    def check(run):
        m = run.data.metrics
        gpipe = run.data.params["strategy"] == "gpipe"  # torchgpipe runs its partitions: one CUDA-event range
        missing = sorted((CONTRACT - stage_phases if gpipe else CONTRACT) - m.keys())
        if missing:
            yield f"missing {missing}"
        elif gpipe:
            if not m["time_optimizer_s"] > 0 or "peak_memory_mb_stage1" not in m:
                yield f"optimizer time {m['time_optimizer_s']}, stage peaks {sorted(k for k in m if '_stage' in k)}"
            if stage_phases & m.keys():
                yield f"untimed phases recorded: {sorted(stage_phases & m.keys())}"
        elif not m["time_forward_s"] > 0 < m["time_backward_s"]:
            yield f"phase times forward {m['time_forward_s']} backward {m['time_backward_s']}"
    assert not failures(gpu_runs, check), "\n".join(failures(gpu_runs, check))


def test_allocator_and_nvml_peaks_recorded_and_consistent(gpu_runs):
    def check(run):
        m = run.data.metrics
        for rank in range(int(run.data.params["processes"])):
            allocated, reserved, nvml = (m.get(f"{name}_rank{rank}") for name in DEVICE_MEMORY)
            if allocated is None or reserved is None or nvml is None:
                yield f"rank {rank}: allocated {allocated} reserved {reserved} nvml {nvml}"
            elif not 0 < allocated <= reserved <= nvml + 1 and nvml <= reserved + CONTEXT_MB:
                yield f"rank {rank}: allocated {allocated:.0f} <= reserved {reserved:.0f} <= nvml {nvml:.0f} MiB fails"
    assert not failures(gpu_runs, check), "\n".join(failures(gpu_runs, check))


def test_the_manifest_names_the_gpu_its_driver_and_torch(sweep_store, gpu_runs, tmp_path):
    run = gpu_runs[("single", "", "fp32", 1)]
    manifest = json.loads(Path(sweep_store.client.download_artifacts(run.info.run_id, "manifest.json",
                                                                     str(tmp_path))).read_text())
    assert manifest["gpu_driver"] and manifest["torch_cuda"] and manifest["packages"]["torch"]
    assert manifest["ranks"][0]["device"] == torch.cuda.get_device_name(0)


def test_fp16_runs_count_the_steps_loss_scaling_skipped(gpu_runs):
    for k in [("single", "", "fp16", 1), ("ddp", "", "fp16", 1)]:
        skipped = gpu_runs[k].data.metrics["fp16_skipped_steps"]
        assert skipped == int(skipped) and 0 <= skipped < 6 + 2  # the scaler settles within the run's steps


def test_fp16_overflow_skips_the_step_and_is_counted():
    weight = torch.nn.Parameter(torch.ones(4, device="cuda"))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    precision = make_precision("fp16", torch.device("cuda"))
    with precision.autocast():
        loss = (weight * torch.tensor(6e4, device="cuda")).sum() * 1e30  # inf once scaled
    precision.backward(loss)
    precision.step(optimizer)
    assert precision.skipped_steps == 1
    assert torch.equal(weight.detach(), torch.ones(4, device="cuda"))  # the step was skipped


# cuDNN convolutions run in TF32 in fp32 (torch's default) and pick their algorithms per process: two runs of
# ResNet-18 part by about 1e-3 a step, and the drift grows over 14 steps. GPT-2's matmuls stay in fp32.
@pytest.mark.parametrize("same, as_, rel", [
    (("ddp", "", "fp32", 1), ("single", "", "fp32", 1), 2e-2),
    (("fsdp", "", "fp32", 1), ("zero", "1", "fp32", 1), 1e-4),
    (("megatron", "1", "fp32", 1), ("zero", "1", "fp32", 1), 1e-4),
    (("zero", "3", "fp32", 1), ("zero", "1", "fp32", 1), 1e-4),
])
def test_one_rank_strategies_train_alike_on_cuda(sweep_store, gpu_runs, same, as_, rel):
    """Same global batch, same seed, one NCCL rank: each strategy follows the same losses on the GPU."""
    a, b = (step_losses(sweep_store, gpu_runs[k]) for k in (same, as_))
    assert len(a) == len(b) > 0
    assert a == pytest.approx(b, rel=rel)


def step_losses(store: Store, run) -> list[float]:
    history = store.client.get_metric_history(run.info.run_id, "step_loss")
    return [m.value for m in sorted(history, key=lambda m: m.step)]
