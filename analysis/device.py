"""What a point does with its device: samples/s, step time, the memory the CUDA allocator and NVML saw, and the
utilisation (model TFLOP/s per device, MFU), per point. On CPU the memory columns read `-` (the peak resident set
is `peak_memory_mb`, in the speedup table)."""

from __future__ import annotations

from analysis.breakdown import fmt_number, percent
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

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    numbers = {m: mean([r.metrics[m] for r in done if m in r.metrics])
               for m, _, _ in COLUMNS if m != "step_ms"}
    numbers["step_ms"] = mean([1e3 * r.metrics["epoch_time_s_mean"] / r.metrics["steps_per_epoch"] for r in done
                               if "steps_per_epoch" in r.metrics and "epoch_time_s_mean" in r.metrics])
    numbers["mfu"] = mean([r.metrics["mfu"] for r in done if "mfu" in r.metrics])
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
