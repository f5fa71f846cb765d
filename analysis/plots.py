"""PNG plots of a sweep: scaling (speedup vs workers) and statistical efficiency (validation metric vs time)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.get_cmap("tab20").colors)  # more variants than 10 colors

from analysis.runs import Row  # noqa: E402
from analysis.speedup import cell_speedups  # noqa: E402
from analysis.stats import Estimate  # noqa: E402
from analysis.tables import interval_note  # noqa: E402


def _legend(ax, rows: list[Row]) -> None:
    """Below the axes, so that many strategy variants do not hide the lines. Where nothing was drawn (a workload whose
    every point failed), the axes say why instead of standing empty: its points' statuses."""
    if not ax.get_legend_handles_labels()[0]:
        statuses = Counter(r.status.split(":")[0] for r in rows)
        ax.text(0.5, 0.5, f"nothing to draw: {', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))}\n"
                "(the report's status table has each point's error)", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, wrap=True)
        return
    ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)


def foot_note(fig, note: str | None) -> float:
    """`note` (what a figure's error bars span) printed along the figure's foot; the height it takes (a fraction of
    the figure's), for tight_layout to leave free."""
    if not note:
        return 0.0
    fig.text(0.5, 0.004, note, ha="center", va="bottom", fontsize=7, wrap=True)
    return 0.3 / fig.get_figheight()


def plot_speedup(rows: list[Row], histories, protocol: str, path: Path) -> tuple[Path, str | None]:
    """Speedup against workers per strategy variant, each point with its interval; and what the error bars span."""
    workloads = sorted({r.workload for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 6), squeeze=False)
    speedups = cell_speedups(rows, histories, protocol)
    for ax, workload in zip(axes[0], workloads):
        lines: dict[str, list[tuple[int, Estimate]]] = defaultdict(list)
        for (dataset, network, label, workers), value in speedups.items():
            if (dataset, network) == workload:
                lines[label].append((workers, value))
        top = max((w for pts in lines.values() for w, _ in pts), default=1)
        ax.plot([1, top], [1, top], "k:", label="linear")
        for strategy, points in sorted(lines.items()):
            points.sort(key=lambda point: point[0])
            ax.errorbar([w for w, _ in points], [s.value for _, s in points],
                        yerr=[[s.value - s.low for _, s in points], [s.high - s.value for _, s in points]],
                        marker="o", capsize=2, label=strategy)
        single = any(label == "single" and workers == 1 for label, pts in lines.items() for workers, _ in pts)
        ax.set(title="/".join(workload), xlabel="workers",
               ylabel="speedup vs single on 1 worker" if single else "speedup vs the strategy on its fewest workers")
        ax.set_xticks(sorted({w for pts in lines.values() for w, _ in pts} | {1}))
        _legend(ax, [r for r in rows if r.workload == workload])
    note = interval_note((s.spans() for s in speedups.values() if s.method), "Error bars", "point", len(speedups),
                         "the others are a baseline (1 exactly) or of one sample")
    fig.tight_layout(rect=(0, foot_note(fig, note), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path, note


def plot_convergence(rows: list[Row], client, path: Path) -> Path:
    """Validation metric against cumulative training time, the view Study N argues for."""
    workloads = sorted({r.workload for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 6), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for row in rows:
            if row.workload != workload or row.val_metric is None:
                continue
            times = {m.step: m.value for m in client.get_metric_history(row.run_id, "train_time_s")}
            values = sorted((m.step, m.value) for m in client.get_metric_history(row.run_id, row.val_metric))
            points = [(times[step], v) for step, v in values if step in times]
            if points:
                ax.plot(*zip(*points), "o-", label=f"{row.label}/w{row.workers}")
            ax.set(ylabel=row.val_metric, yscale="log" if row.val_metric == "val_perplexity" else "linear")
        ax.set(title="/".join(workload), xlabel="training time (s)")
        _legend(ax, [r for r in rows if r.workload == workload])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
