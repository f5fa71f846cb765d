"""Study N's tables and figures (study_n.md, "What a suite must output"): epoch time against GPUs per framework
(Figures 6/7), 1-GPU time with the 4-GPU self-speedup (Figure 4), the per-iteration breakdown (Figure 5), the
validation metric against time and epochs with a time-to-target table (Figure 8), peak memory against GPUs with
the ZeRO/DDP ratio and the pipelines' reduction (Figure 9), and Tables 2 and 3 from the runs' own metadata.

Frameworks are named as in the paper: `megatron tp=1` is Megatron-data, `megatron` with tp > 1 Megatron-intra
(on one GPU the two are the same point), `gpipe` TorchGPipe, `zero` ZeRO-<stage>. `ddp` with Adam, ZeRO's
optimizer, is DDP+Adam: not a framework of the paper but the control that parts its ZeRO-vs-DDP ratios into the
optimizer's effect (DDP+Adam over DDP) and the sharding's (ZeRO over DDP+Adam).
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt

from analysis.breakdown import COLOURS, SLICES, fmt_number, percent, point_breakdown
from analysis.measure import PROTOCOLS, cell_ratio, epoch_time, finished, speedup, status_of
from analysis.runs import Row
from analysis.sanity import TIMER_RESOLUTION_S, flag_cell
from analysis.stats import Estimate
from analysis.tables import Table, interval_cell
from analysis.views import Context, Section, save_figure, table_section, view
from suite.shared_names import PHASE_TIMES, Status

PIPELINES = ("gpipe", "pipedream", "1f1b", "gpipe_dist")
PHASE_COLOURS = {"time_data_s": "tab:olive", "time_forward_s": "tab:orange", "time_backward_s": "tab:green",
                 "time_optimizer_s": "tab:purple"}  # apart from the traced slices' (analysis.breakdown.COLOURS)
DDP_ADAM = "DDP+Adam"  # DDP with ZeRO's optimizer, where the study's DDP runs SGD (VGG-16) or LAMB (GPT-2)


def frameworks(row: Row, ctx: Context) -> list[str]:
    """The paper's name(s) of a point's framework; extension strategies are marked."""
    if row.strategy == "megatron":
        tp = int(row.params.get("strategy.tp", row.params.get("tp", 1)))
        names = ["Megatron-data"] if tp == 1 else ["Megatron-intra"]
        return names + (["Megatron-intra"] if tp == 1 and row.workers == 1 else [])
    if row.strategy == "ddp" and row.params.get("optimizer.name") == "adam":
        return [DDP_ADAM]
    if row.strategy == "zero":
        name = f"ZeRO-{row.params.get('strategy.zero_stage', row.params.get('zero_stage', '?'))}"
    else:
        from suite.strategies import label  # only here: the strategy's spec imports torch

        name = label(row.strategy)
    return [name + (" (ext)" if row.strategy in ctx.extension else "")]


def series(ctx: Context, network: str) -> dict[str, dict[int, list[Row]]]:
    """framework -> workers -> repeats, for one network."""
    found: dict[str, dict[int, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in ctx.rows:
        if row.network == network:
            for name in frameworks(row, ctx):
                found[name][row.workers].append(row)
    return {name: dict(sorted(points.items())) for name, points in sorted(found.items())}


def colours(ctx: Context) -> dict[str, tuple]:
    """One colour per framework, the same in every panel and figure."""
    names = sorted({name for r in ctx.rows for name in frameworks(r, ctx)})
    return {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(names)}


def networks(ctx: Context) -> list[str]:
    return sorted({r.network for r in ctx.rows})


def _ratio(ctx: Context, a: list[Row] | None, b: list[Row] | None) -> Estimate | None:
    return cell_ratio(a, b, ctx.histories, ctx.protocol) if a and b else None


@view("n_epoch_time")
def epoch_time_vs_gpus(ctx: Context) -> Section:
    """Figures 6/7: s/epoch against GPUs (log 2), one line per framework, one panel per network; the table adds
    speedup over the framework's own 1 GPU and the ratio to DDP. Points that did not finish are marked x."""
    nets = networks(ctx)
    fig, axes = plt.subplots(1, len(nets), figsize=(7 * len(nets), 5.5), squeeze=False)
    rows = []
    for ax, network in zip(axes[0], nets):
        lines = series(ctx, network)
        ddp = lines.get("DDP", {})
        for name, points in lines.items():
            xs, ys, failed = [], [], []
            for workers, repeats in points.items():
                t = epoch_time(repeats, ctx.histories, ctx.protocol)
                own = speedup(repeats, points[1], ctx.histories, ctx.protocol) if 1 in points else None
                to_ddp = _ratio(ctx, repeats, ddp.get(workers))
                rows.append([network, name, str(workers), interval_cell(t), interval_cell(own), interval_cell(to_ddp),
                             status_of(repeats), flag_cell(ctx, repeats)])
                if t is None:
                    failed.append((workers, status_of(repeats).split(":")[0]))
                else:
                    xs.append(workers)
                    ys.append(t.value)
            (line,) = ax.plot(xs, ys, "o-", label=name, color=colours(ctx)[name])
            for workers, status in failed:
                ax.plot([workers], [min(ys) if ys else 1], "x", color=line.get_color(), markersize=9)
                ax.annotate(status, (workers, min(ys) if ys else 1), fontsize=6, color=line.get_color(),
                            textcoords="offset points", xytext=(3, -10))
        ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel=f"seconds per epoch ({ctx.protocol} timing)",
               title=f"{network}")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    fig.suptitle(f"{ctx.experiment}: epoch time against GPUs (Figures 6/7); x: did not finish")
    files = save_figure(fig, ctx, "n_fig6_epoch_time")
    table = Table("n_epoch_time", f"{ctx.experiment}: epoch time against GPUs ({PROTOCOLS[ctx.protocol]})",
                  ["network", "framework", "GPUs", "s/epoch [95% CI]", "speedup vs own 1 GPU", "time / DDP's",
                   "status", "flags"], rows, ["flags: see the report's first section (analysis/sanity.py)."])
    section = table_section(table, ctx, files)
    section.markdown += f"\n\n![Figures 6/7]({files[0].name})"
    return section


def speedup_gpus(points: dict[int, list[Row]]) -> int | None:
    """The GPU count of Figure 4's labels: 4, else the largest count below it that ran."""
    counts = [w for w, repeats in points.items() if 1 < w <= 4 and finished(repeats)]
    return max(counts) if counts else None


@view("n_single_gpu")
def single_gpu(ctx: Context) -> Section:
    """Figure 4: 1-GPU epoch time per framework, each bar labelled with its 4-GPU speedup over itself."""
    nets = networks(ctx)
    fig, axes = plt.subplots(1, len(nets), figsize=(7 * len(nets), 5), squeeze=False)
    rows = []
    for ax, network in zip(axes[0], nets):
        names, values, labels = [], [], []
        for name, points in series(ctx, network).items():
            if 1 not in points:
                continue
            t = epoch_time(points[1], ctx.histories, ctx.protocol)
            gpus = speedup_gpus(points)
            s = speedup(points[gpus], points[1], ctx.histories, ctx.protocol) if gpus else None
            rows.append([network, name, interval_cell(t), f"x{gpus}: {interval_cell(s)}" if s else "-",
                         status_of(points[1])])
            names.append(name)
            values.append(t.value if t else 0)
            labels.append(f"{s.value:.2f}x on {gpus}" if s else status_of(points[1]).split(":")[0]
                          if not t else "-")
        bars = ax.bar(range(len(names)), values, color=[colours(ctx)[name] for name in names])
        ax.bar_label(bars, labels, fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set(title=network, ylabel=f"1-GPU seconds per epoch ({ctx.protocol} timing)")
    fig.suptitle(f"{ctx.experiment}: 1 GPU, labels: speedup over own 1 GPU (Figure 4)")
    files = save_figure(fig, ctx, "n_fig4_single_gpu")
    table = Table("n_single_gpu", f"{ctx.experiment}: 1-GPU epoch time and self-speedup (Figure 4)",
                  ["network", "framework", "1-GPU s/epoch", "self-speedup", "status"], rows)
    section = table_section(table, ctx, files)
    section.markdown += f"\n\n![Figure 4]({files[0].name})"
    return section


@view("n_breakdown")
def breakdown(ctx: Context) -> Section:
    """Figure 5: per framework and GPU count, for the language model (the paper's GPT-2 medium), else every
    network, two stacks of disjoint parts that each sum to a step: the timed phases (data, forward, backward,
    optimizer; the communication done in a phase is inside it), and beside them, where the traces (`profile.steps`)
    have it, the traced step split into compute, exposed communication and idle time (a pipeline's bubble, the
    framework between operators). A phase below the timer's resolution ran inside another (torchgpipe's backward,
    in forward's autograd graph) and is labelled so, not drawn as a number."""
    language = [n for n in networks(ctx) if any(r.network == n and r.dataset in ("tokens", "wikitext103")
                                                 for r in ctx.rows)]
    nets = language or networks(ctx)
    phases = [p for p in PHASE_TIMES if any(p in r.metrics for r in ctx.rows)]
    fig, axes = plt.subplots(len(nets), 1, figsize=(12, 4.5 * len(nets)), squeeze=False)
    rows = []
    for ax, network in zip(axes[:, 0], nets):
        bars = []
        for name, points in series(ctx, network).items():
            for workers, repeats in points.items():
                done = finished(repeats)
                values = [sum(r.metrics.get(p, 0.0) for r in done) / len(done) if done else 0.0 for p in phases]
                comm = point_breakdown(repeats)
                bars.append((f"{name} {workers}", values, comm, status_of(repeats)))
                rows.append([network, name, str(workers),
                             *("inside forward" if 0 < v < TIMER_RESOLUTION_S else f"{v:.4g}" for v in values),
                             *(fmt_number(comm[k]) for k in ("time_comm_s", "time_comm_exposed_s")),
                             percent(comm["comm_fraction"]),
                             status_of(repeats)])
        bottom = [0.0] * len(bars)
        for i, phase in enumerate(phases):
            heights = [b[1][i] for b in bars]
            ax.bar([x - 0.2 for x in range(len(bars))], heights, width=0.4, bottom=bottom,
                   label=phase.removeprefix("time_").removesuffix("_s"), color=PHASE_COLOURS[phase])
            for x, height in enumerate(heights):
                if 0 < height < TIMER_RESOLUTION_S:
                    ax.text(x - 0.2, bottom[x], f"{phase.removeprefix('time_').removesuffix('_s')} inside forward",
                            rotation=90, fontsize=6, ha="center", va="bottom")
            bottom = [a + h for a, h in zip(bottom, heights)]
        bottom = [0.0] * len(bars)
        for key, name in SLICES:
            heights = [b[2][key] or 0.0 for b in bars]
            ax.bar([x + 0.2 for x in range(len(bars))], heights, width=0.4, bottom=bottom, label=f"traced: {name}",
                   color=COLOURS[name], hatch="//", edgecolor="white")
            bottom = [a + h for a, h in zip(bottom, heights)]
        for x, (_, _, _, status) in enumerate(bars):
            if status != Status.finished:
                ax.text(x, 0, status.split(":")[0], rotation=90, fontsize=6, color="C3", ha="center", va="bottom")
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=70, fontsize=6)
        ax.set(title=network, ylabel="seconds per step")
        ax.legend(fontsize="x-small")
    fig.suptitle(f"{ctx.experiment}: per-iteration breakdown (Figure 5)")
    files = save_figure(fig, ctx, "n_fig5_breakdown")
    table = Table("n_breakdown", f"{ctx.experiment}: per-step time breakdown (s, max over ranks)",
                  ["network", "framework", "GPUs", *phases, "comm", "exposed comm", "comm % of step", "status"], rows,
                  ["The phases hold the communication done in them (DDP's all-reduce in backward, ZeRO's in the "
                   "optimizer step); comm and exposed comm come from the profiler traces (`profile.steps`; `-`: "
                   "not profiled), which the figure stacks apart: compute, exposed communication and idle time sum "
                   "to the traced step. A pipeline's phases are its stage's compute. A phase below "
                   f"{TIMER_RESOLUTION_S:g} s ran inside another (torchgpipe's backward, inside forward's graph)."])
    section = table_section(table, ctx, files)
    section.markdown += f"\n\n![Figure 5]({files[0].name})"
    return section


def fastest(ctx: Context, points: dict[int, list[Row]]) -> tuple[int, list[Row]] | None:
    timed = [(epoch_time(r, ctx.histories, ctx.protocol), w, r) for w, r in points.items()]
    timed = [(t.value, w, r) for t, w, r in timed if t is not None]
    return min(timed)[1:] if timed else None


def _curve(ctx: Context, row: Row) -> list[tuple[int, float, float]]:
    """(epoch, training time, validation metric) of one run."""
    times = dict(ctx.histories.get(row.run_id, "train_time_s"))
    return [(step, times[step], value) for step, value in ctx.histories.get(row.run_id, row.val_metric)
            if step in times]


@view("n_convergence")
def convergence(ctx: Context) -> Section:
    """Figure 8: validation metric against training time and against epochs, each framework at its fastest GPU
    count (epoch numbers as labels), and the time to the target that every framework reached."""
    nets = networks(ctx)
    fig, axes = plt.subplots(2, len(nets), figsize=(7 * len(nets), 10), squeeze=False)
    rows = []
    for col, network in enumerate(nets):
        curves = {}
        for name, points in series(ctx, network).items():
            best = fastest(ctx, points)
            if best is None:
                continue
            workers, repeats = best
            run = max(finished(repeats), key=lambda r: r.start_time)
            if run.val_metric and _curve(ctx, run):
                curves[name] = (workers, run, _curve(ctx, run))
        if not curves:
            continue
        metric = next(iter(curves.values()))[1].val_metric
        higher = metric == "val_accuracy"
        reached = [max(v for *_, v in c) if higher else min(v for *_, v in c) for _, _, c in curves.values()]
        target = min(reached) if higher else max(reached)
        for name, (workers, _, curve) in curves.items():
            epochs, times, values = zip(*curve)
            for ax, xs in ((axes[0, col], times), (axes[1, col], epochs)):
                ax.plot(xs, values, "o-", label=f"{name} ({workers} GPUs)", color=colours(ctx)[name])
            for e, t, v in curve:
                axes[0, col].annotate(str(e), (t, v), fontsize=6, textcoords="offset points", xytext=(2, 2))
            hit = next(((e, t) for e, t, v in curve if (v >= target if higher else v <= target)), None)
            rows.append([network, name, str(workers), metric, f"{target:.4g}",
                         f"{hit[1]:.4g}" if hit else "not reached", str(hit[0]) if hit else "-"])
        for ax, xlabel in ((axes[0, col], "training time (s)"), (axes[1, col], "epoch")):
            ax.axhline(target, color="k", linestyle=":", linewidth=1)
            ax.set(title=network, xlabel=xlabel, ylabel=metric,
                   yscale="log" if metric == "val_perplexity" else "linear")
            ax.legend(fontsize="x-small")
    fig.suptitle(f"{ctx.experiment}: validation metric at each framework's fastest GPU count (Figure 8)")
    files = save_figure(fig, ctx, "n_fig8_convergence")
    table = Table("n_time_to_target", f"{ctx.experiment}: time to target at each framework's fastest GPU count",
                  ["network", "framework", "GPUs", "metric", "target", "time to target (s)", "epochs"], rows,
                  ["Target: the weakest best value among the frameworks, so that every one reaches it."])
    section = table_section(table, ctx, files)
    section.markdown += f"\n\n![Figure 8]({files[0].name})"
    return section


def memory_ratio(ctx: Context, network: str, numerator: str, denominator: str) -> dict[int, float]:
    """Peak memory of one framework over another's, per GPU count where both finished."""
    lines = series(ctx, network)
    a, b = lines.get(numerator, {}), lines.get(denominator, {})
    out = {}
    for workers in sorted(set(a) & set(b)):
        ma = [r.peak_memory_mb for r in finished(a[workers]) if r.peak_memory_mb]
        mb = [r.peak_memory_mb for r in finished(b[workers]) if r.peak_memory_mb]
        if ma and mb:
            out[workers] = (sum(ma) / len(ma)) / (sum(mb) / len(mb))
    return out


def memory_reduction(points: dict[int, list[Row]]) -> float | None:
    """Peak memory on 1 GPU over the smallest peak at any GPU count."""
    peaks = {w: min(r.peak_memory_mb for r in finished(rs) if r.peak_memory_mb) for w, rs in points.items()
             if any(r.peak_memory_mb for r in finished(rs))}
    if 1 not in peaks or len(peaks) < 2:
        return None
    return peaks[1] / min(v for w, v in peaks.items() if w > 1)


@view("n_memory")
def memory(ctx: Context) -> Section:
    """Figure 9: peak memory per GPU against GPUs per framework, with the ZeRO/DDP ratio per GPU count and the
    pipelines' reduction factor (1 GPU over the best larger count)."""
    nets = networks(ctx)
    fig, axes = plt.subplots(1, len(nets), figsize=(7 * len(nets), 5.5), squeeze=False)
    ratios, reductions = [], []
    for ax, network in zip(axes[0], nets):
        lines = series(ctx, network)
        for name, points in lines.items():
            xs = [w for w, rs in points.items() if any(r.peak_memory_mb for r in finished(rs))]
            ys = [max(r.peak_memory_mb for r in finished(points[w]) if r.peak_memory_mb) for w in xs]
            ax.plot(xs, ys, "o-", label=name, color=colours(ctx)[name])
            if any(s in name for s in ("TorchGPipe", "PipeDream", "1F1B", "GPipe-dist")):
                factor = memory_reduction(points)
                reductions.append([network, name, f"{factor:.3g}" if factor else "-"])
        for name in [n for n in lines if n.startswith("ZeRO") or n == DDP_ADAM]:
            to_control = memory_ratio(ctx, network, name, DDP_ADAM) if name != DDP_ADAM else {}
            for workers, value in memory_ratio(ctx, network, name, "DDP").items():
                ratios.append([network, name, str(workers), f"{value:.3f}",
                               f"{to_control[workers]:.3f}" if workers in to_control else "-"])
        ax.set(xscale="log", xlabel="GPUs", ylabel="peak memory per GPU (MB)", title=network)
        ax.set_xscale("log", base=2)
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    method = "CUDA allocator peak / NVML on GPU, peak resident set of the process on CPU"
    fig.suptitle(f"{ctx.experiment}: peak memory per GPU (Figure 9)")
    files = save_figure(fig, ctx, "n_fig9_memory")
    ratio_table = Table("n_zero_ddp_memory", f"{ctx.experiment}: ZeRO memory over DDP's per GPU count",
                        ["network", "framework", "GPUs", "peak memory / DDP's", f"peak memory / {DDP_ADAM}'s"],
                        ratios, [f"Peak memory: {method}. Published: 0.42-0.66 (GPT-2 medium, ThetaGPU).",
                                 f"{DDP_ADAM}: DDP with ZeRO's optimizer, a control the study did not run. Its "
                                 f"ratio to DDP's is the optimizer's effect, ZeRO's ratio to {DDP_ADAM}'s the "
                                 f"sharding's (see the claims' parted ratios)."])
    reduction_table = Table("n_pipeline_memory_reduction",
                            f"{ctx.experiment}: pipeline memory reduction (1 GPU over the best larger count)",
                            ["network", "framework", "reduction"], reductions, ["Published: more than 2x."])
    section = table_section(ratio_table, ctx, files + reduction_table.write(ctx.directory))
    section.markdown += "\n\n" + reduction_table.markdown() + f"\n\n![Figure 9]({files[0].name})"
    return section


# Table 2's columns the cluster's catalog entry states (run params); the rest come from the runs' manifests.
CATALOG = (("cluster.hardware.cpu_memory_gb", "CPU mem/node (GB)"), ("cluster.hardware.device_memory_gb",
                                                                       "device mem (GB)"),
           ("cluster.hardware.fp64_tflops", "FP64 peak (TFlop/s)"))


def _stated(value: str | None) -> str:
    return "-" if value in (None, "", "None", "null") else value


def _manifest(ctx: Context, row: Row) -> dict:
    """The environment manifest a run recorded (suite.runtime.manifest); {} where it has none."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return json.loads(Path(ctx.client.download_artifacts(row.run_id, "manifest.json", tmp)).read_text())
        except Exception:  # a run recorded without one (it failed before starting), or a store without artifacts
            return {}


def system_row(ctx: Context, rows: list[Row]) -> list[str]:
    """One system of Table 2: what its runs ran on, from the largest run's manifest (hosts, the ranks' devices, the
    cores each host has) and the catalog entry's figures."""
    run = max(rows, key=lambda r: (r.status == Status.finished, r.workers))
    manifest = _manifest(ctx, run)
    ranks = manifest.get("ranks", [])
    hosts = manifest.get("hosts", [])
    devices = sorted({r["device"] for r in ranks})
    per_host = max((sum(r["host"] == h for r in ranks) for h in hosts), default=0)
    gpu = _stated(run.params.get("cluster.hardware.gpu"))
    return [run.params.get("cluster.name", "-"), str(len(hosts) or "-"), ", ".join(devices) or "-",
            "GPU" if gpu != "-" else "CPU", str(per_host or "-"), str(manifest.get("cpu_count", "-")),
            *(_stated(run.params.get(k)) for k, _ in CATALOG)]


@view("n_setup")
def setup_tables(ctx: Context) -> Section:
    """Tables 2 and 3 from the runs' own records: the systems (their manifests: hosts, devices, cores; the catalog's
    figures), and the data, hyper-parameters and batch rules (their params)."""
    by_system = defaultdict(list)
    for r in ctx.rows:
        by_system[r.params.get("cluster.name", "-")].append(r)
    table2 = Table("n_table2_systems", f"{ctx.experiment}: systems (Table 2, from the runs)",
                   ["system", "hosts used", "device", "device kind", "ranks/host (largest run)", "cores/host",
                    *(h for _, h in CATALOG)], [system_row(ctx, rows) for _, rows in sorted(by_system.items())],
                   ["Hosts, devices and cores: the environment manifest of the system's largest run. Memory and "
                    "peak: the cluster's catalog entry (`-`: not stated there)."])
    hyper = defaultdict(set)
    for r in ctx.rows:
        p = r.params
        key = (r.dataset, p.get("dataset.samples", "-"), p.get("dataset.val_samples", "-"), r.network,
               frameworks(r, ctx)[0], p.get("batch_size", "-"), p.get("optimizer.name", "-"),
               p.get("optimizer.lr", "-"), p.get("epochs", "-"), p.get("optimizer.weight_decay", "-"),
               p.get("precision", "-"))
        hyper[key].add((r.workers, p.get("global_batch_size", "-")))
    rows = [[*key[:5], key[5], *key[6:], ", ".join(f"{w}:{b}" for w, b in sorted(rule))]
            for key, rule in sorted(hyper.items())]
    table3 = Table("n_table3_hyperparameters", f"{ctx.experiment}: data, hyper-parameters, batch rules (Table 3)",
                   ["dataset", "train samples", "val samples", "network", "framework", "batch_size",
                    "optimizer", "lr", "epochs", "weight decay", "precision", "GPUs:global batch"], rows,
                   ["Samples '-' or None: the published size. GPUs:global batch is each framework's batch rule."])
    section = table_section(table2, ctx, table3.write(ctx.directory))
    section.markdown += "\n\n" + table3.markdown()
    return section
