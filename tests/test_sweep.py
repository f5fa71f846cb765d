"""A sweep through the real driver, local launcher and MLflow store: the contract's names, resume, the report."""

import json

import pytest

from conftest import DIGITS, run_suite

pytestmark = pytest.mark.slow  # the driver `python -m suite` launches every point

CONTRACT_PARAMS = {"dataset", "network", "strategy", "workers", "nodes", "global_batch_size", "precision", "seed",
                   "bucket_cap_mb"}
EPOCH_METRICS = {"epoch_time_s", "throughput_samples_s", "train_loss", "val_loss", "val_accuracy"}
SUMMARY_METRICS = {"epoch_time_s_mean", "peak_memory_mb", "time_to_target_s", "epochs_to_target", "time_data_s",
                   "time_forward_s", "time_backward_s", "time_optimizer_s"}


def test_two_point_sweep_records_contract_and_resumes(results, store):
    # A target every run reaches at its first epoch on any CPU: two of the 64 validation digits right (a network that
    # predicts one class gets a tenth). 0.15, near chance after one epoch, was reached or not by the last bits of
    # the arithmetic (missed under ATEN_CPU_CAPABILITY=avx2 on an AMD EPYC).
    args = ["-m", *DIGITS, "strategy=ddp", "workers=1,2", "target.value=0.02"]
    first = run_suite(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[1/2 digits/resnet18/ddp/w1]" in first.stdout and "epoch 2/2" in first.stdout  # progress is shown

    runs = store.runs("adhoc")
    assert sorted(r.info.run_name for r in runs) == ["digits/resnet18/ddp/w1", "digits/resnet18/ddp/w2"]
    for run in runs:
        assert run.data.tags["suite.status"] == "finished"
        assert len(run.data.tags["suite.config_hash"]) == 16 and run.data.tags["suite.git_sha"]
        assert CONTRACT_PARAMS <= run.data.params.keys()
        assert EPOCH_METRICS | SUMMARY_METRICS <= run.data.metrics.keys()
        history = store.client.get_metric_history(run.info.run_id, "epoch_time_s")
        assert sorted(m.step for m in history) == [1, 2]
        metrics = run.data.metrics
        assert metrics["epochs_to_target"] == 1
        train_time = {m.step: m.value for m in store.client.get_metric_history(run.info.run_id, "train_time_s")}
        assert metrics["time_to_target_s"] == pytest.approx(train_time[1])
        assert metrics["throughput_samples_s_mean"] == pytest.approx(metrics["samples_per_epoch"]
                                                                     / metrics["epoch_time_s_mean"])
        assert metrics["samples_per_epoch"] == 256  # counted over all ranks, not assumed
        assert metrics["train_set_samples"] == 256  # dataset.samples: what Study J's epochs are scaled to
        ranks = [metrics[f"peak_memory_mb_rank{r}"] for r in range(int(run.data.params["workers"]))]
        assert metrics["peak_memory_mb"] == max(ranks) > 100
        workers = int(run.data.params["workers"])
        assert run.data.params["global_batch_size"] == str(16 * workers)
        artifacts = {a.path for a in store.client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "manifest.json", "logs", "launcher.log"} <= artifacts
        logs = {a.path for a in store.client.list_artifacts(run.info.run_id, "logs")}
        assert logs == {f"logs/rank{r}.log" for r in range(workers)}
        manifest = json.loads(store.client.download_artifacts(run.info.run_id, "manifest.json", str(results)) and
                              (results / "manifest.json").read_text())
        assert manifest["packages"]["torch"].startswith("2.14.1") and len(manifest["ranks"]) == workers

    assert "| speedup |" in first.stdout.replace("speedup | baseline", "speedup |")
    assert (results / "reports" / "adhoc" / "speedup.png").stat().st_size > 0
    assert (results / "reports" / "adhoc" / "convergence.png").stat().st_size > 0

    again = run_suite(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped: finished run") == 2
    assert len(store.runs("adhoc")) == 2  # nothing re-run, nothing overwritten


def test_speedup_column_is_the_throughput_ratio_to_the_single_baseline(store):
    result = run_suite("-m", *DIGITS, "epochs=1", "strategy=single,ddp", "workers=1", "precision=bf16")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {r.data.params["strategy"]: r for r in store.runs("adhoc")}
    assert runs["single"].data.params["precision"] == "bf16"
    header = next(line for line in result.stdout.splitlines() if line.startswith("| dataset"))
    column = [c.strip() for c in header.split("|")].index("speedup") - 1
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| digits")]
    speedup = {cells[2].strip(): float(cells[column].split()[0]) for cells in rows}
    throughput = {name: run.data.metrics["throughput_samples_s_mean"] for name, run in runs.items()}
    ratio = throughput["ddp"] / throughput["single"]
    assert speedup == {"single": 1.0, "ddp": pytest.approx(ratio, abs=0.006)}
