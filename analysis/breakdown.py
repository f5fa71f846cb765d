"""Where a step's time goes, per point: compute, the communication not hidden behind it (exposed), idle time, and
how much of the step communication takes (`profile.steps`' trace breakdown), with the point's MFU. Points run
without `profile.steps` have no breakdown and read `-`; points without a known peak have no MFU (the run's
`suite.mfu_missing` tag says why)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from analysis.measure import cells, finished, status_of
from analysis.runs import Row
from analysis.tables import Table
from analysis.views import Context, Section, save_figure, table_section, view

SLICES = (("time_compute_s", "compute"), ("time_comm_exposed_s", "exposed communication"), ("time_idle_s", "idle"))
COLOURS = {"compute": "tab:blue", "exposed communication": "tab:red", "idle": "tab:gray"}


def metric_mean(rows: list[Row], metric: str) -> float | None:
    """The metric's mean over the rows that recorded it; None where none did."""
    values = [r.metrics[metric] for r in rows if metric in r.metrics]
    return sum(values) / len(values) if values else None


def fmt_number(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def percent(share: float | None, spec: str = ".1f") -> str:
    return fmt_number(None if share is None else 100 * share, spec)


def point_breakdown(repeats: list[Row]) -> dict[str, float | None]:
    """Means over the finished repeats: the slices, total communication, its shares, and the utilisation."""
    done = finished(repeats)
    values = {metric: metric_mean(done, metric) for metric in (*(m for m, _ in SLICES), "time_comm_s", "comm_fraction",
                                                         "achieved_tflops", "mfu", "hfu")}
    comm, exposed = values["time_comm_s"], values["time_comm_exposed_s"]
    values["exposed_share"] = exposed / comm if comm and exposed is not None else None
    return values


@view("breakdown")
def breakdown_view(ctx: Context) -> Section:
    """Table and figure: per point, one step's compute / exposed communication / idle time (stacked, the step's
    length), all communication beside it (overlapped or not), its share of the step and the exposed share of it,
    and MFU."""
    points = sorted(cells(ctx.rows).items())
    rows, bars = [], []
    for (dataset, network, label, workers), repeats in points:
        b = point_breakdown(repeats)
        status = status_of(repeats)
        rows.append([dataset, network, label, str(workers), *(fmt_number(b[m]) for m, _ in SLICES),
                     fmt_number(b["time_comm_s"]), percent(b["comm_fraction"]), percent(b["exposed_share"]),
                     fmt_number(b["achieved_tflops"], ".3g"), percent(b["mfu"], ".2f"), status.split(":")[0]])
        if b["time_compute_s"] is not None:
            bars.append((f"{network} {label} {workers}", b))
    table = Table("breakdown", f"{ctx.experiment}: where a step's time goes (s per step, largest over ranks)",
                  ["dataset", "network", "strategy", "workers", "compute", "exposed comm", "idle", "all comm",
                   "comm % of step", "exposed % of comm", "TFLOP/s per device", "MFU %", "status"], rows,
                  [*([] if bars else ["No point of this sweep was profiled: run it with `profile.steps=2` (e.g. "
                                      "`make sweep ARGS=profile.steps=2 FORCE=1`) to fill this table."]),
                   "From each rank's profiler trace (`profile.steps`); `-`: the point was not profiled. Compute + "
                   "exposed communication + idle is the step; communication overlapped by compute is in compute. "
                   "MFU against the peak the run names (`peak_tflops`, tag `suite.peak_source`)."])
    files = []
    if bars:
        fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(bars) + 2), 5))
        x = range(len(bars))
        bottom = [0.0] * len(bars)
        for metric, name in SLICES:
            heights = [b[metric] or 0.0 for _, b in bars]
            ax.bar(x, heights, width=0.4, bottom=bottom, label=name, align="edge", color=COLOURS[name])
            bottom = [a + h for a, h in zip(bottom, heights)]
        ax.bar([i - 0.4 for i in x], [b["time_comm_s"] or 0.0 for _, b in bars], width=0.4, align="edge",
               color="none", edgecolor="tab:red", hatch="//", label="all communication (overlapped or not)")
        for i, (_, b) in enumerate(bars):
            if b["mfu"] is not None:
                ax.text(i, bottom[i], f"MFU {100 * b['mfu']:.1f}%", ha="center", va="bottom", fontsize=7)
        ax.set_xticks([i for i in x], [name for name, _ in bars], rotation=60, ha="right", fontsize=7)
        ax.set(ylabel="seconds per step", title=f"{ctx.experiment}: step time breakdown from the traces")
        ax.legend(fontsize="x-small")
        files = save_figure(fig, ctx, "breakdown")
    section = table_section(table, ctx, files)
    if files:
        section.markdown += f"\n\n![step time breakdown]({files[0].name})"
    return section
