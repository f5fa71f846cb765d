"""The CUDA paths on one real GPU (`make test-gpu`; `make test` does not collect these; skipped where torch sees
none): the `gpu_checks` sweep through the real driver and every point's record, fp16 loss scaling (ZeRO's by
DeepSpeed), the reserved peak after sharding, NVML's view of a process found by its GPU's UUID, and gpipe's partitions
computing in the point's precision on torchgpipe's threads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_suite
from suite.paths import REPO_ROOT
from suite.records.store import Store
from suite.runtime.metrics import peak_memory
from suite.runtime.numerics import make_precision
from suite.shared_names import DEVICE_MEMORY
from suite.sweep.plan import plan
from suite.sweep.sweep_files import expand, sweep_lines

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.slow]

CONTRACT = {"epoch_time_s_mean", "throughput_samples_s_mean", "peak_memory_mb", "time_forward_s", "time_backward_s",
            "time_optimizer_s", "samples_per_epoch", "peak_cuda_allocated_mb", "peak_cuda_reserved_mb",
            "achieved_tflops"}
# What NVML sees a process hold beyond the allocator's cache: the CUDA context, cuBLAS/cuDNN workspaces, NCCL.
CONTEXT_MB = 3072


def run_sweep(name: str, results: Path) -> Store:
    """The store of the sweep conf/sweep/<name>.yaml, run through the real driver into `results`."""
    env = {**os.environ, "SUITE_RESULTS_DIR": str(results)}
    env.pop("MLFLOW_TRACKING_URI", None)
    sweep = subprocess.run([sys.executable, "-m", "suite", "--sweep", name], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=3600)
    print(sweep.stdout[-6000:], sweep.stderr[-6000:])
    assert (results / "mlflow.db").exists(), sweep.stderr[-2000:]
    return Store(f"sqlite:///{results / 'mlflow.db'}")


def planned_points(name: str) -> list:
    """The points of conf/sweep/<name>.yaml as this machine plans them."""
    return plan([job for line in sweep_lines(name) for job in expand(line, multirun=True)], experiment=name)


def failures(runs: dict, check) -> list[str]:
    """`check(run)` over every finished run: the messages of those it finds wrong."""
    found = []
    for k, run in sorted(runs.items()):
        if run.data.tags["suite.status"] == "finished":
            found += [f"{k}: {message}" for message in check(run)]
    return found


def step_losses(store: Store, run) -> list[float]:
    history = store.client.get_metric_history(run.info.run_id, "step_loss")
    return [m.value for m in sorted(history, key=lambda m: m.step)]


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory) -> Store:
    """The store of one `gpu_checks` sweep, run through the real driver."""
    return run_sweep("gpu_checks", tmp_path_factory.mktemp("results"))


def key(run) -> tuple[str, str, str, str, int]:
    """A point of `gpu_checks`: (network, strategy, zero stage or tp, precision, workers)."""
    p = run.data.params
    variant = p.get("strategy.zero_stage") or p.get("strategy.tp") or ""
    return p["network"], p["strategy"], variant, p["precision"], int(p["workers"])


@pytest.fixture(scope="module")
def gpu_runs(sweep_store) -> dict:
    """Every point's run, by `key`."""
    return {key(r): r for r in sweep_store.runs("gpu_checks") if "suite.sweep" not in r.data.tags}


def assert_every_point_finished(runs: dict, sweep: str) -> None:
    """Each planned point of `sweep` has its run in `runs` (none keyed alike), finished."""
    failed = [f"{k}: {r.data.tags['suite.status']}: {r.data.tags.get('suite.error', '')}"
              for k, r in sorted(runs.items()) if r.data.tags["suite.status"] != "finished"]
    assert not failed, "\n".join(failed)
    assert len(runs) == len(planned_points(sweep))


def test_every_point_finishes_on_cuda(gpu_runs):
    assert_every_point_finished(gpu_runs, "gpu_checks")


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


def test_allocator_and_nvml_peaks_recorded_and_consistent_on_every_rank(gpu_runs):
    """NVML finds each rank's process on its GPU by the GPU's UUID, the ranks sharing the GPU included."""
    def check(run):
        m = run.data.metrics
        for rank in range(int(run.data.params["processes"])):
            allocated, reserved, nvml = (m.get(f"{name}_rank{rank}") for name in DEVICE_MEMORY)
            if allocated is None or reserved is None or nvml is None:
                yield f"rank {rank}: allocated {allocated} reserved {reserved} nvml {nvml}"
            elif not 0 < allocated <= reserved <= nvml + 1 and nvml <= reserved + CONTEXT_MB:
                yield f"rank {rank}: allocated {allocated:.0f} <= reserved {reserved:.0f} <= nvml {nvml:.0f} MiB fails"
    assert not failures(gpu_runs, check), "\n".join(failures(gpu_runs, check))
    assert any(run.data.params["cluster.share_gpus"] == "True" and int(run.data.params["processes"]) == 2
               for run in gpu_runs.values())


def test_nvml_finds_this_process_by_its_gpus_uuid():
    """torch names cuda:0's UUID without NVML's "GPU-" prefix; the suite adds it and asks NVML for that GPU, whose
    processes include this one, holding at least what its allocator reserved."""
    held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    numbers = peak_memory(torch.device("cuda", 0))
    del held
    assert "nvml_used_mb" in numbers, numbers
    assert numbers["nvml_used_mb"] >= numbers["peak_cuda_reserved_mb"] >= 256


def test_the_manifest_names_the_gpu_its_driver_and_torch(sweep_store, gpu_runs, tmp_path):
    run = gpu_runs[("resnet18", "single", "", "fp32", 1)]
    manifest = json.loads(Path(sweep_store.client.download_artifacts(run.info.run_id, "manifest.json",
                                                                     str(tmp_path))).read_text())
    assert manifest["gpu_driver"] and manifest["torch_cuda"] and manifest["packages"]["torch"]
    assert manifest["ranks"][0]["device"] == torch.cuda.get_device_name(0)


def test_fp16_runs_count_the_steps_loss_scaling_skipped(gpu_runs):
    fp16 = {k: run for k, run in gpu_runs.items() if k[3] == "fp16"}
    assert {k[1] for k in fp16} == {"single", "ddp", "zero", "fsdp", "megatron"}
    for k, run in sorted(fp16.items()):
        skipped = run.data.metrics.get("fp16_skipped_steps")
        # The scaler settles within the run's 14 steps.
        assert skipped is not None and skipped == int(skipped) and 0 <= skipped < 8, f"{k}: {skipped}"


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


# Adam's first step moves every weight by about lr: from then on the fp16 activations overflow and the loss is nan.
DIVERGING = ["dataset=tokens", "network=gpt2_tiny", "dataset.seq_len=128", "dataset.samples=64",
             "dataset.val_samples=8", "batch_size=8", "optimizer.name=adam", "optimizer.lr=10000", "precision=fp16",
             "workers=1", "cluster.device=cuda", "epochs=1", "warmup_steps=1", "steps_per_epoch=4", "eval_batches=1",
             "tracking.experiment=fp16_overflow"]


def test_an_overflowing_fp16_point_is_recorded_diverged_under_each_loss_scaler(results, store):
    """The suite's scaler under `single`, DeepSpeed's inside ZeRO 1 and 3 (where the suite's never runs): once the
    loss is nan the point ends `diverged` at the same step under each, never `finished` with its steps skipped
    (hostile inputs 3, case 1). That ZeRO counts the steps DeepSpeed's scaler skipped is checked on the gpu_checks
    sweep's fp16 points (test_fp16_runs_count_the_steps_loss_scaling_skipped)."""
    for strategy in (["strategy=single"], ["strategy=zero", "strategy.zero_stage=1,3"]):
        done = run_suite("-m", *DIVERGING, *strategy)
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    tags = [r.data.tags for r in store.runs("fp16_overflow")]
    assert [t["suite.status"] for t in tags] == ["diverged"] * 3
    assert len({t["suite.error"] for t in tags}) == 1, [t["suite.error"] for t in tags]
    assert tags[0]["suite.error"].startswith("rank 0: Diverged: loss ")


def test_sharding_leaves_no_unsharded_copy_in_the_reserved_peak(gpu_runs):
    """FSDP2 and ZeRO 3 move the whole fp32 model to the GPU, then shard it. Unless the allocator's cache is emptied
    before the peaks restart (review gpu-paths, W7), that copy, freed, stays reserved: ZeRO's flat partitions and
    buffers cannot reuse its per-parameter blocks, so the reserved peak would exceed the allocated peak by about the
    model. What the allocator reserves beyond its allocated peak is compared with what it reserves beyond it under
    `single`, which makes no such copy, on the same network and batch: within half the unsharded model (GPT-2 small,
    472 MiB in fp32), more than the allocator's own slack on this small batch and less than the copy."""
    def slack(run) -> float:
        return run.data.metrics["peak_cuda_reserved_mb"] - run.data.metrics["peak_cuda_allocated_mb"]

    single = gpu_runs[("gpt2_small", "single", "", "fp32", 1)]
    model_mb = single.data.metrics["mem_params_mb"]
    for k in [("gpt2_small", "fsdp", "", "fp32", 1), ("gpt2_small", "zero", "3", "fp32", 1)]:
        assert slack(gpu_runs[k]) <= slack(single) + model_mb / 2, (
            f"{k}: reserved {gpu_runs[k].data.metrics['peak_cuda_reserved_mb']:.0f} MiB, allocated "
            f"{gpu_runs[k].data.metrics['peak_cuda_allocated_mb']:.0f} MiB; single's slack {slack(single):.0f} MiB, "
            f"model {model_mb:.0f} MiB")


# cuDNN convolutions run in TF32 in fp32 (torch's default) and pick their algorithms per process: two runs of
# ResNet-18 part by about 1e-3 a step, and the drift grows over 14 steps. GPT-2's matmuls stay in fp32. In bf16 and
# fp16 every strategy runs torch AMP on fp32 weights (ZeRO too, review gpu-paths W5), one rank reducing nothing.
@pytest.mark.parametrize("same, as_, rel", [
    (("resnet18", "ddp", "", "fp32", 1), ("resnet18", "single", "", "fp32", 1), 2e-2),
    (("gpt2_tiny", "fsdp", "", "fp32", 1), ("gpt2_tiny", "zero", "1", "fp32", 1), 1e-4),
    (("gpt2_tiny", "megatron", "1", "fp32", 1), ("gpt2_tiny", "zero", "1", "fp32", 1), 1e-4),
    (("gpt2_tiny", "zero", "3", "fp32", 1), ("gpt2_tiny", "zero", "1", "fp32", 1), 1e-4),
    (("gpt2_tiny", "zero", "1", "bf16", 1), ("gpt2_tiny", "fsdp", "", "bf16", 1), 1e-3),
    (("gpt2_tiny", "megatron", "1", "bf16", 1), ("gpt2_tiny", "fsdp", "", "bf16", 1), 1e-3),
    (("gpt2_tiny", "zero", "3", "fp16", 1), ("gpt2_tiny", "fsdp", "", "fp16", 1), 1e-3),
    (("gpt2_tiny", "megatron", "1", "fp16", 1), ("gpt2_tiny", "fsdp", "", "fp16", 1), 1e-3),
])
def test_one_rank_strategies_train_alike_on_cuda(sweep_store, gpu_runs, same, as_, rel):
    """Same global batch, same seed, one NCCL rank: each strategy follows the same losses on the GPU."""
    a, b = (step_losses(sweep_store, gpu_runs[k]) for k in (same, as_))
    assert len(a) == len(b) > 0
    assert a == pytest.approx(b, rel=rel)

