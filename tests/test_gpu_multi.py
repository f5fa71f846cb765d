"""The CUDA paths that need two GPUs or more (`make test-gpu-multi`, and `make test-gpu` beside the one-GPU checks;
`make test` does not collect these; skipped, with the reason, on fewer GPUs): the `gpu_multi_checks` sweep through the
real driver (pipelines sending megabytes over NCCL, torchgpipe across GPUs, the data- and tensor-parallel strategies
as NCCL ranks), Horovod's NCCL all-reduce against its host path, and NVML finding a rank that sees its GPU under
another number."""

import json

import pytest
import torch
from test_gpu import assert_every_point_finished, failures, run_sweep, step_losses

from conftest import run_suite
from suite.shared_names import DEVICE_MEMORY

GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.gpu_multi, pytest.mark.slow]

PIPELINES = [("pipedream", ""), ("1f1b", "1"), ("1f1b", "2"), ("gpipe_dist", "")]
MESSAGE_MB = 6  # GPT-2 small's activations between stages: 4 sequences of 512 tokens x 768 fp32 (the sweep's)


def key(run) -> tuple[str, str, str]:
    """A point of `gpu_multi_checks`: (strategy, zero stage or 1F1B's virtual stages, precision)."""
    p = run.data.params
    variant = {"zero": "strategy.zero_stage", "1f1b": "strategy.virtual_stages"}.get(p["strategy"])
    return p["strategy"], p[variant] if variant else "", p["precision"]


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory):
    """The store of one `gpu_multi_checks` sweep, run through the real driver."""
    return run_sweep("gpu_multi_checks", tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def multi_runs(sweep_store) -> dict:
    return {key(r): r for r in sweep_store.runs("gpu_multi_checks") if "suite.sweep" not in r.data.tags}


def test_every_point_finishes_on_two_gpus(multi_runs):
    """A pipeline whose sends and receives wait on each other on one NCCL stream hangs: it is recorded `timeout`."""
    assert_every_point_finished(multi_runs, "gpu_multi_checks")


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: "-".join(filter(None, p)))
def test_pipelines_send_megabytes_between_gpus_over_nccl(multi_runs, pipeline):
    """Each stage sends at least one activation or gradient of MESSAGE_MB a step, to the other GPU."""
    run = multi_runs[(*pipeline, "fp32")]
    assert run.data.tags["suite.status"] == "finished", run.data.tags.get("suite.error")
    assert run.data.params["cluster.device"] == "cuda" and run.data.params["processes"] == "2"
    sent = run.data.metrics.get("comm_mb_per_step")  # recorded from torch 2.14 on (docs/clusters.md)
    assert sent is None or sent >= MESSAGE_MB


def test_every_rank_records_its_own_gpus_memory(multi_runs):
    """Each NCCL rank on a GPU of its own: the allocator's peaks, and NVML's, which finds the rank's process on the
    GPU named by its UUID."""
    def check(run):
        m = run.data.metrics
        for rank in range(int(run.data.params["processes"])):
            missing = [name for name in DEVICE_MEMORY if f"{name}_rank{rank}" not in m]
            if missing:
                yield f"rank {rank}: no {missing}"
    assert not failures(multi_runs, check), "\n".join(failures(multi_runs, check))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpipe_reports_the_peak_of_each_gpu_it_drives(multi_runs, precision):
    """One process, one partition on each of cuda:0 and cuda:1 (11 of GPT-2 small's 12 blocks and the head on the
    second): each stage's peak is its own GPU's, and the point's is the larger, not cuda:0's alone."""
    m = multi_runs[("gpipe", "", precision)].data.metrics
    first, second = m["peak_memory_mb_stage0"], m["peak_memory_mb_stage1"]
    assert 0 < first < second
    assert m["peak_memory_mb"] == pytest.approx(second)


@pytest.mark.parametrize("strategy", [("fsdp", ""), ("zero", "1"), ("zero", "3"), ("megatron", "")])
def test_nccl_ranks_train_as_ddp_does(sweep_store, multi_runs, strategy):
    """Same global batch and seed: every data- or tensor-parallel strategy follows DDP's losses over NCCL (GPT-2's
    matmuls in fp32)."""
    a, b = (step_losses(sweep_store, multi_runs[k]) for k in ((*strategy, "fp32"), ("ddp", "", "fp32")))
    assert len(a) == len(b) > 0
    assert a == pytest.approx(b, rel=1e-4)


GPT2_TINY = ["dataset=tokens", "network=gpt2_tiny", "dataset.seq_len=128", "dataset.samples=256",
             "dataset.val_samples=32", "batch_size=8", "optimizer.name=adam", "optimizer.lr=0.001", "epochs=2",
             "warmup_steps=2", "steps_per_epoch=4", "eval_batches=1"]


def test_horovods_nccl_allreduce_trains_as_its_host_path(results, store, monkeypatch):
    """Horovod on 2 GPUs reduces the gradients with NCCL (the timeline names its NCCL all-reduces; review gpu-paths
    W3: a Horovod built without NCCL copies them to host memory): the same losses as DDP over NCCL and, to what CPU
    and GPU kernels round apart, as the same point on 2 CPU ranks, which gloo reduces in host memory."""
    hvd = pytest.importorskip("horovod.torch", reason="Horovod is not installed: `make horovod` builds it")
    assert hvd.nccl_built()
    timeline = results.parent / "horovod_timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(timeline))  # written by rank 0
    on_gpus = run_suite(*GPT2_TINY, "workers=2", "strategy=horovod", "cluster.device=cuda",
                        "tracking.experiment=horovod_nccl")
    assert on_gpus.returncode == 0, on_gpus.stdout[-3000:] + on_gpus.stderr[-3000:]
    monkeypatch.delenv("HOROVOD_TIMELINE")
    assert "NCCL_ALLREDUCE" in timeline.read_text()
    for other in (["strategy=horovod", "cluster.device=cpu"], ["strategy=ddp", "cluster.device=cuda"]):
        done = run_suite(*GPT2_TINY, "workers=2", *other, "tracking.experiment=horovod_nccl")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    losses = {(r.data.params["strategy"], r.data.params["cluster.device"]): step_losses(store, r)
              for r in store.runs("horovod_nccl")}
    nccl = losses[("horovod", "cuda")]
    assert len(nccl) > 0
    assert nccl == pytest.approx(losses[("ddp", "cuda")], rel=1e-4)
    assert nccl == pytest.approx(losses[("horovod", "cpu")], rel=1e-3)


def test_a_rank_that_sees_another_gpu_as_cuda0_finds_itself_in_nvml(results, store, monkeypatch):
    """A scheduler that binds one GPU to each rank (jsrun, srun --gpus-per-task) shows it as cuda:0, whatever its
    number in NVML, which ignores CUDA_VISIBLE_DEVICES: NVML is asked for the GPU by its UUID (review gpu-paths, B3),
    and finds this rank's process there, holding at least what its allocator reserved."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(GPUS - 1))
    done = run_suite(*GPT2_TINY, "workers=1", "strategy=single", "cluster.device=cuda",
                     "tracking.experiment=nvml_by_uuid")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = store.runs("nvml_by_uuid")
    m = run.data.metrics
    assert m["nvml_used_mb_rank0"] >= m["peak_cuda_reserved_mb_rank0"] > 0, json.dumps(
        {k: v for k, v in m.items() if k.endswith("_rank0")})
