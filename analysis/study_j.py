"""Study J's tables and figures (study_j.md, "What a suite must output"): the s/epoch table, Figure 3.1 (speedup
at the single-node GPU count, one panel per strategy, bars grouped by dataset), Figure 3.2 (ImageNet speedup
against GPUs) and Table 6.1 (GPipe configurations A-E with Eq. 6.1's factor).

The baseline of every speedup is `single` on one worker for the same dataset and network. The single-node GPU
count is the most common worker count of the sweep's distributed points (4 in study_j, 2 in study_j_mini).
Points that did not finish stay in every table and figure with their status.
"""

from __future__ import annotations

from collections import Counter

import matplotlib.pyplot as plt

from analysis.measure import PROTOCOLS, cell_ratio, cells, epoch_time, finished, speedup, status_of
from analysis.runs import Row
from analysis.sanity import flag_cell
from analysis.stats import Estimate
from analysis.tables import Table, interval_cell, interval_note
from analysis.views import Context, Section, save_figure, table_section, view
from suite.shared_names import AUTO

STRATEGIES = ("horovod", "gpipe", "pipedream")  # the thesis' distribution models beside PyTorch on 1 GPU
DATASETS = ("mnist", "cifar10", "imagenet", "highres")
NETWORKS = ("resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenet_v2")
# Table 6.1: the GPipe configurations by (micro-batch size, micro-batches) at 4 GPUs on ImageNet.
GPIPE_CONFIGS = {"A": (24, 12), "B": (32, 12), "C": (32, 20), "D": (12, 28), "E": (16, 30)}


def _order(values, known) -> list:
    return sorted(values, key=lambda v: (known.index(v) if v in known else len(known), v))


def single_node_workers(rows: list[Row]) -> int:
    counts = Counter(r.workers for r in rows if r.strategy != "single")
    return counts.most_common(1)[0][0] if counts else 1


def gpipe_config(row: Row, rows: list[Row]) -> str | None:
    """A-E of a gpipe point among the configurations of its cell: by micro-batch count (A and B share 12: A is
    the smaller micro-batch), so that a miniature's scaled-down micro-batches keep their names."""
    count, size = int(row.params.get("micro_batches", 0)), int(row.params.get("micro_batch_size", 0))
    same_count = sorted({int(r.params.get("micro_batch_size", 0)) for r in rows if r.strategy == "gpipe"
                         and r.workload == row.workload and r.workers == row.workers
                         and int(r.params.get("micro_batches", 0)) == count})
    for name, (_, published_count) in GPIPE_CONFIGS.items():
        if published_count != count:
            continue
        if count != 12 or len(same_count) == 1 or (name == "A") == (size == same_count[0]):
            return name
    return None


def study_dataset(rows: list[Row]) -> str | None:
    """ImageNet, the dataset of Figure 3.2 and Table 6.1, when the rows have it; else the dataset with the most
    points among `rows` (a user's own sweep)."""
    counts = Counter(r.dataset for r in rows)
    return "imagenet" if "imagenet" in counts else (counts.most_common(1)[0][0] if counts else None)


def repeats_of(ctx: Context, dataset: str, network: str, strategy: str, workers: int) -> list[Row]:
    """The repeats of the study's point: for gpipe on a cell with several configurations, configuration A
    (what §6.4 says the other experiments used)."""
    rows = [r for r in ctx.rows if (r.dataset, r.network, r.strategy, r.workers) == (dataset, network, strategy,
                                                                                       workers)]
    if strategy == "gpipe" and len({r.label for r in rows}) > 1:
        rows = [r for r in rows if gpipe_config(r, ctx.rows) == "A"]
    if strategy == "pipedream" and len({r.label for r in rows}) > 1:
        rows = [r for r in rows if planned(r)] or rows  # the study ran its planner's choice
    return rows


def planned(row: Row) -> bool:
    """A pipedream point whose configuration PipeDream's planner chose (strategy.pp=auto)."""
    return row.strategy == "pipedream" and row.settings.get("pp") == AUTO


def configuration(row: Row) -> str:
    """A pipedream point's configuration as PipeDream writes it, replicas per stage (`2-1-1`), with its layers per
    stage (`2-1-1 (9+6+6)`); `?` for a run recorded without them."""
    replication = row.params.get("stage_replicas")
    if replication is None and "dp" in row.params:  # the grid: pp stages (1 unrecorded), each on the dp replicas
        replication = "-".join([row.params["dp"]] * int(row.params.get("pipeline_stages", 1)))
    layers = row.params.get("effective.pipeline.stage_layers")
    return (replication or "?") + (f" ({layers.replace(',', '+')})" if layers else "")


def _strategies(ctx: Context) -> list[str]:
    present = {r.strategy for r in ctx.rows if r.strategy != "single"}
    return _order(present, [*STRATEGIES, *ctx.extension])


def _cv(e: Estimate | None) -> str:
    return "-" if e is None or e.cv is None else f"{100 * e.cv:.1f}%"


def _batch(row: Row) -> tuple[str, str, str]:
    mb, count = row.params.get("micro_batch_size", "-"), row.params.get("micro_batches", "-")
    return row.params.get("global_batch_size", "-"), mb, count


@view("j_epoch_table")
def epoch_table(ctx: Context) -> Section:
    """s/epoch per dataset x network x strategy (PyTorch on 1 GPU, the rest at the single-node count), with batch,
    micro-batch size and count, speedup, interval and coefficient of variation."""
    gpus = single_node_workers(ctx.rows)
    rows = []
    for dataset in _order({r.dataset for r in ctx.rows}, DATASETS):
        for network in _order({r.network for r in ctx.rows if r.dataset == dataset}, NETWORKS):
            base = repeats_of(ctx, dataset, network, "single", 1)
            for strategy in ["single", *_strategies(ctx)]:
                repeats = repeats_of(ctx, dataset, network, strategy, 1 if strategy == "single" else gpus)
                if not repeats:
                    continue
                t = epoch_time(repeats, ctx.histories, ctx.protocol)
                s = speedup(repeats, base, ctx.histories, ctx.protocol) if base else None
                rows.append([dataset, network, strategy + (" (extension)" if strategy in ctx.extension else ""),
                             str(repeats[0].workers), *_batch(repeats[0]), interval_cell(t), _cv(t), interval_cell(s),
                             str(len(repeats)), status_of(repeats), flag_cell(ctx, repeats)])
    table = Table("j_epoch_time", f"{ctx.experiment}: seconds per epoch ({PROTOCOLS[ctx.protocol]})",
                  ["dataset", "network", "strategy", "GPUs", "batch", "micro-batch", "micro-batches",
                   "s/epoch [95% CI]", "CV", "speedup vs single [95% CI]", "repeats", "status", "flags"], rows,
                  ["GPipe on ImageNet: configuration A (24 x 12 = 288 at 4 GPUs; study_j.md §1.6).",
                   "Under the Study J protocol, s/epoch is each epoch's time x training samples / samples it trained. "
                   "The suite drops an epoch's last partial batch (every data-parallel rank and every micro-batch of "
                   "a pipeline needs the same count), DDLBench did not: unscaled, GPipe's 3072 (MNIST) and 2048 "
                   "(CIFAR-10) would time 2.6% and 1.5% fewer samples than Horovod. Speedup is the throughput ratio."])
    return table_section(table, ctx)


def _bar_panel(ax, ctx: Context, strategy: str, gpus: int) -> list[str]:
    """Bars of one strategy's speedups, networks grouped by dataset; a point that did not finish is an empty
    slot labelled with its status. What each bar's error bar spans."""
    x, ticks, labels, spans = 0.0, [], [], []
    for dataset in _order({r.dataset for r in ctx.rows}, DATASETS):
        start = x
        for network in _order({r.network for r in ctx.rows if r.dataset == dataset}, NETWORKS):
            repeats = repeats_of(ctx, dataset, network, strategy, gpus)
            base = repeats_of(ctx, dataset, network, "single", 1)
            if not repeats:
                continue
            s = speedup(repeats, base, ctx.histories, ctx.protocol) if base and finished(repeats) else None
            if s is not None:
                ax.bar(x, s.value, yerr=[[s.value - s.low], [s.high - s.value]], color="C0", capsize=2)
                spans.append(s.spans() if s.method else "")
            else:
                reason = status_of(repeats).split(":")[0] if not finished(repeats) else "no baseline"
                ax.bar(x, 0, color="none")
                ax.text(x, 0.02, reason, rotation=90, ha="center", va="bottom", fontsize=7, color="C3",
                        transform=ax.get_xaxis_transform())
            ticks.append(x)
            labels.append(network)
            x += 1
        if x > start:
            ax.text((start + x - 1) / 2, -0.32, dataset, ha="center", transform=ax.get_xaxis_transform(),
                    fontweight="bold")
            x += 0.8
    ax.axhline(1, color="k", linestyle=":", linewidth=1)
    ax.set_xlim(-1, max(x - 0.8, 1))  # a panel of few bars keeps them narrow
    ax.set_xticks(ticks, labels, rotation=60, fontsize=7)
    ax.set(title=strategy + (" (extension)" if strategy in ctx.extension else "") + f", {gpus} GPUs",
           ylabel="speedup vs single, 1 GPU")
    return spans


@view("j_speedup_4gpu")
def speedup_single_node(ctx: Context) -> Section:
    """Figure 3.1: speedup over PyTorch on 1 GPU at the single-node GPU count, one panel per strategy."""
    gpus = single_node_workers(ctx.rows)
    strategies = _strategies(ctx)
    fig, axes = plt.subplots(len(strategies), 1, figsize=(11, 3.6 * len(strategies)), squeeze=False)
    spans = [span for ax, strategy in zip(axes[:, 0], strategies) for span in _bar_panel(ax, ctx, strategy, gpus)]
    fig.suptitle(f"{ctx.experiment}: speedup at {gpus} GPUs (Figure 3.1; {ctx.protocol} timing)")
    note = interval_note(spans, "Error bars", "bar")
    files = save_figure(fig, ctx, "j_fig3_1_speedup", note)
    return Section("Figure 3.1: speedup over one GPU", f"![Figure 3.1]({files[0].name})" + (f"\n\n{note}" if note
                                                                                             else ""), files)


@view("j_speedup_gpus")
def speedup_gpus(ctx: Context) -> Section:
    """Figure 3.2 and its table: ImageNet speedup against GPUs, per network and strategy."""
    dataset = study_dataset([r for r in ctx.rows if r.strategy != "single"])
    grouped = cells([r for r in ctx.rows if r.dataset == dataset and r.strategy != "single"])
    series: dict[tuple[str, str], list[tuple[int, list[Row]]]] = {}
    for (_, network, _, workers), repeats in grouped.items():
        if repeats[0].strategy == "gpipe" and gpipe_config(repeats[0], ctx.rows) not in (None, "A"):
            continue
        series.setdefault((network, repeats[0].strategy), []).append((workers, repeats))
    series = {k: sorted(v, key=lambda p: p[0]) for k, v in series.items() if len(v) > 1}  # scaled points only
    rows, spans = [], []
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for (network, strategy), points in sorted(series.items()):
        base = repeats_of(ctx, dataset, network, "single", 1)
        xs, ys, errs = [], [], [[], []]
        for workers, repeats in points:
            t = epoch_time(repeats, ctx.histories, ctx.protocol)
            s = speedup(repeats, base, ctx.histories, ctx.protocol) if base else None
            rows.append([network, strategy, str(workers), interval_cell(t), interval_cell(s), status_of(repeats)])
            if s is not None:
                spans.append(s.spans() if s.method else "")
                xs.append(workers)
                ys.append(s.value)
                errs[0].append(s.value - s.low)
                errs[1].append(s.high - s.value)
            else:
                ax.annotate(status_of(repeats).split(":")[0], (workers, 0), fontsize=7, color="C3")
        ext = " (extension)" if strategy in ctx.extension else ""
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=2, linestyle="--" if ext else "-",
                    label=f"{network} {strategy}{ext}")
    top = max((w for v in series.values() for w, _ in v), default=1)
    ax.plot([1, top], [1, top], "k:", label="linear")
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="speedup vs single, 1 GPU",
           title=f"{ctx.experiment}: {dataset} speedup against GPUs (Figure 3.2)")
    ax.set_xticks(sorted({w for v in series.values() for w, _ in v}), [str(w) for w in sorted(
        {w for v in series.values() for w, _ in v})])
    ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    note = interval_note(spans, "Error bars", "point")
    files = save_figure(fig, ctx, "j_fig3_2_speedup_gpus", note)
    table = Table("j_speedup_gpus", f"{ctx.experiment}: {dataset} s/epoch and speedup against GPUs",
                  ["network", "strategy", "GPUs", "s/epoch [95% CI]", "speedup [95% CI]", "status"], rows)
    section = table_section(table, ctx, files)
    section.markdown += f"\n\n![Figure 3.2]({files[0].name})" + (f"\n\n{note}" if note else "")
    return section


def eq_6_1(workers: int, micro_batches: int) -> float:
    """Thesis Eq. 6.1's factor: T_comp = T_seq x (W + #mb - 1) / (W x #mb)."""
    return (workers + micro_batches - 1) / (workers * micro_batches)


@view("j_gpipe_configs")
def gpipe_configs(ctx: Context) -> Section:
    """Table 6.1: GPipe configurations A-E on ImageNet, s/epoch per network, with mb, #mb, b and Eq. 6.1."""
    dataset = study_dataset([r for r in ctx.rows if r.strategy == "gpipe"])
    gpipe = [r for r in ctx.rows if r.strategy == "gpipe" and r.dataset == dataset]
    found = {}  # config -> (mb, #mb, batch, workers)
    by_cell: dict[tuple[str, str], list[Row]] = {}
    for row in gpipe:
        name = gpipe_config(row, ctx.rows)
        if name:
            found.setdefault(name, (row.params.get("micro_batch_size"), int(row.params.get("micro_batches", 0)),
                                    row.params.get("global_batch_size"), row.workers))
            by_cell.setdefault((row.network, name), []).append(row)
    configs = sorted(found)
    header = [["mb", *(str(found[c][0]) for c in configs)], ["#mb", *(str(found[c][1]) for c in configs)],
              ["b", *(str(found[c][2]) for c in configs)],
              ["Equation 6.1", *(f"{eq_6_1(found[c][3], found[c][1]):.2f}" for c in configs)]]
    body = []
    for network in _order({n for n, _ in by_cell}, NETWORKS):
        cells_ = []
        for c in configs:
            repeats = by_cell.get((network, c))
            t = epoch_time(repeats, ctx.histories, ctx.protocol) if repeats else None
            cells_.append(interval_cell(t, ".4g") if t else (status_of(repeats).split(":")[0] if repeats else "-"))
        body.append([f"{network} (s/epoch)", *cells_])
    table = Table("j_table6_1_gpipe_configs", f"{ctx.experiment}: GPipe configurations, {dataset} (Table 6.1; "
                  f"{PROTOCOLS[ctx.protocol]})", ["", *(f"Config {c}" for c in configs)], header + body,
                  ["Configurations named by micro-batch count (A and B share 12; A has the smaller micro-batch)."])
    return table_section(table, ctx)


@view("j_pipedream_plan")
def pipedream_plan(ctx: Context) -> Section:
    """PipeDream's planner against measurement: per cell with a planned point (strategy.pp=auto) and other pipedream
    configurations, the planner's choice, the measured best, and the choice's epoch time over the best's."""
    body = []
    for (dataset, network, _, workers), repeats in sorted(cells([r for r in ctx.rows if planned(r)]).items()):
        others = cells([r for r in ctx.rows if r.strategy == "pipedream" and not planned(r)
                        and (r.dataset, r.network, r.workers) == (dataset, network, workers)])
        measured = [(reps, epoch_time(reps, ctx.histories, ctx.protocol)) for reps in [repeats, *others.values()]]
        timed = [(reps, t) for reps, t in measured if t is not None]
        best, best_t = min(timed, key=lambda entry: entry[1].value, default=(None, None))
        chosen_t = measured[0][1]
        gap = cell_ratio(repeats, best, ctx.histories, ctx.protocol) if best and chosen_t else None
        body.append([dataset, network, str(workers), configuration(repeats[0]), interval_cell(chosen_t, ".4g"),
                     configuration(best[0]) if best else "-", interval_cell(best_t, ".4g"), interval_cell(gap),
                     "; ".join(f"{configuration(reps[0])}: "
                               f"{interval_cell(t, '.4g') if t else status_of(reps).split(':')[0]}"
                               for reps, t in measured),
                     status_of(repeats)])
    table = Table("j_pipedream_plan", f"{ctx.experiment}: PipeDream's planner against the measured configurations "
                  f"({PROTOCOLS[ctx.protocol]})",
                  ["dataset", "network", "GPUs", "planner's choice", "its s/epoch [95% CI]", "measured best",
                   "best s/epoch [95% CI]", "choice / best [95% CI]", "configurations measured", "status"], body,
                  ["A configuration is replicas per stage as PipeDream writes it, with its layers per stage. The "
                   "planner's choice is the strategy.pp=auto point (PipeDream's dynamic program over the profile and "
                   "the cluster's links, suite.predict.pipedream_plan); the others are the cell's other pipedream "
                   "points, cut by their own balance. choice / best: 1 where the planner chose the fastest measured."])
    return table_section(table, ctx)
