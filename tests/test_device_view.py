"""The report's `device` view: per point throughput, step time, CUDA and NVML memory and MFU, `-` where a run did
not record a number (CPU runs have no CUDA memory), and the status of points that did not finish."""

import csv

from analysis.device import device_numbers, device_view
from analysis.runs import Row
from analysis.views import Context


def run(strategy: str, workers: int, status: str = "finished", repeat: int = 0, **metrics: float) -> Row:
    return Row(run_id=f"{strategy}-{workers}-{repeat}", dataset="tokens", network="gpt2_tiny", strategy=strategy,
               workers=workers, status=status, epoch_time_s=metrics.get("epoch_time_s_mean"), throughput=None,
               peak_memory_mb=None, val_metric=None, val_value=None, start_time=repeat, label=strategy,
               repeat=repeat, error="out of memory" if status == "oom" else None, metrics=metrics)


GPU_RUN = dict(throughput_samples_s_mean=90.0, epoch_time_s_mean=2.0, steps_per_epoch=10, mfu=0.25,
               achieved_tflops=123.0, peak_cuda_allocated_mb=1000.0, peak_cuda_reserved_mb=1200.0,
               nvml_used_mb=1700.0)


def test_device_numbers_are_means_over_finished_repeats_and_the_step_is_the_epoch_over_its_steps():
    repeats = [run("ddp", 1, repeat=0, **GPU_RUN),
               run("ddp", 1, repeat=1, **{**GPU_RUN, "throughput_samples_s_mean": 110.0, "epoch_time_s_mean": 3.0}),
               run("ddp", 1, status="failed", repeat=2, throughput_samples_s_mean=1.0)]
    numbers = device_numbers(repeats)
    assert numbers["throughput_samples_s_mean"] == 100.0
    assert numbers["step_ms"] == 250.0
    assert numbers["mfu"] == 0.25 and numbers["nvml_used_mb"] == 1700.0


def test_device_table_reads_dash_where_nothing_was_recorded_and_shows_unfinished_points(tmp_path):
    rows = [run("ddp", 1, **GPU_RUN),
            run("single", 1, throughput_samples_s_mean=50.0, epoch_time_s_mean=1.0, steps_per_epoch=4),
            run("zero", 2, status="oom")]
    section = device_view(Context("exp", rows, None, None, tmp_path))
    with open(tmp_path / "device.csv") as handle:
        table = {r["strategy"]: r for r in csv.DictReader(handle)}
    assert table["ddp"]["allocated MiB"] == "1000" and table["ddp"]["MFU pct"] == "25.0"
    assert table["ddp"]["step ms"] == "200"
    assert table["single"]["samples/s"] == "50" and table["single"]["allocated MiB"] == ""  # `-` on screen
    assert table["single"]["MFU pct"] == ""
    assert table["zero"]["status"] == "oom" and table["zero"]["samples/s"] == ""
    (single_line,) = [line for line in section.markdown.splitlines() if "| single |" in line]
    assert "| - |" in single_line  # what CSV leaves empty, the page shows as `-`
    assert {p.name for p in section.files} >= {"device.md", "device.csv", "device.tex"}
