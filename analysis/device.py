"""What a point does with its device: samples/s, step time, the memory the CUDA allocator and NVML saw, and the
utilisation (model TFLOP/s per device, MFU), per point. On CPU the memory columns read `-` (the peak resident set
is `peak_memory_mb`, in the speedup table)."""

from __future__ import annotations

from analysis.breakdown import fmt_number, metric_mean, percent
from analysis.measure import cells, finished, status_of
from analysis.runs import Row
from analysis.tables import Table
from analysis.views import Context, Section, table_section, view

COLUMNS = (("throughput_samples_s_mean", "samples/s", ".4g"), ("step_ms", "step ms", ".4g"),
           ("peak_cuda_allocated_mb", "allocated MiB", ".0f"), ("peak_cuda_reserved_mb", "reserved MiB", ".0f"),
           ("nvml_used_mb", "NVML MiB", ".0f"), ("achieved_tflops", "TFLOP/s per device", ".3g"))


def device_numbers(repeats: list[Row]) -> dict[str, float | None]:
    """Means over the finished repeats; the step time is the epoch's over its steps."""
    done = finished(repeats)
    numbers = {m: metric_mean(done, m) for m, _, _ in COLUMNS if m != "step_ms"}
    epoch_s, steps = metric_mean(done, "epoch_time_s_mean"), metric_mean(done, "steps_per_epoch")
    numbers["step_ms"] = 1e3 * epoch_s / steps if epoch_s is not None and steps else None
    numbers["mfu"] = metric_mean(done, "mfu")
    return numbers


@view("device")
def device_view(ctx: Context) -> Section:
    rows = []
    for (dataset, network, label, workers), repeats in sorted(cells(ctx.rows).items()):
        n = device_numbers(repeats)
        rows.append([dataset, network, label, str(workers), *(fmt_number(n[m], spec) for m, _, spec in COLUMNS),
                     percent(n["mfu"], ".1f"), status_of(repeats).split(":")[0]])
    table = Table("device", f"{ctx.experiment}: throughput, memory and utilisation per device",
                  ["dataset", "network", "strategy", "workers", *(title for _, title, _ in COLUMNS), "MFU %",
                   "status"], rows,
                  ["allocated / reserved: the CUDA caching allocator's peaks (largest over ranks); NVML: what the "
                   "process held on its GPU at the end (the allocator's cache, the CUDA context, NCCL). MFU: model "
                   "FLOPs per second over the device's dense peak for the point's math dtype (`-`: no peak known; "
                   "the run's `suite.mfu_missing` tag says why)."])
    return table_section(table, ctx)
