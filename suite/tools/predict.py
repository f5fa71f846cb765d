"""`make predict`: every point's predicted epoch time, step split and peak memory per rank, nothing launched.

    python -m suite.tools.predict [--variant suite|study_j|fitted] [--json] override ...

Overrides are the sweep's (`dataset=imagenet network=resnet50 cluster=lassen workers=4,8,16 strategy=ddp,gpipe`);
comma lists expand to every combination. Each point is planned as a sweep plans it: one that does not compose
(a misspelt name or key) or holds a value no point could run with (workers=0) is one line and exit 2, one that
composes but cannot run (gpipe beyond a node) is listed with the reason; nothing is submitted, so a cluster's account
is not asked for. `--variant fitted` needs the cluster's fitted correction, checked before anything is profiled.
Profiles are taken here, once per network, batch, precision, optimizer and thread count, and kept in
results/profiles/; a GPU cluster is priced from its datasheet where this machine has no GPU. `--json` (or `make
predict FORMAT=json`) prints one JSON object per point instead of the table (`cannot_run` where it cannot).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from analysis.tables import Table
from suite.errors import ConfigError, OneLineParser
from suite.predict import correction
from suite.predict.pipedream_plan import resolve_auto
from suite.predict.predictor import FITTED, PREDICTORS, Prediction, predict
from suite.profiling.profiles import MAX_STEPS, STEPS, WARMUP, WINDOW_S
from suite.sweep.plan import InvalidPoint, Point, plan
from suite.sweep.progress import duration
from suite.sweep.sweep_files import expand

NOTHING_SUBMITTED = ["cluster.job.account_required=false"]


def parse_args(argv: list[str], description: str) -> argparse.Namespace:
    parser = OneLineParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=PREDICTORS, default="suite",
                        help="the suite's model, Study J's equations (Eq. 5.1, Eqs. 6.1/6.2) where it has them, or "
                             "the suite's model with the correction `make bench-model` fitted")
    parser.add_argument("--json", action="store_true", help="one JSON object per point instead of the table")
    parser.add_argument("overrides", nargs="*")
    return parser.parse_intermixed_args(argv)


def plan_points(overrides: list[str], invalid: list[InvalidPoint] | None = None) -> list[Point]:
    return plan([job + NOTHING_SUBMITTED for job in expand(overrides, multirun=True)], experiment="predict",
                invalid=invalid, runs_here=False, plan_auto=resolve_auto)


def describe(point: Point) -> str:
    """The strategy and the knobs it was given other than their defaults, e.g. `zero zero_stage=3`."""
    strategy = point.strategy
    defaults = type(strategy)().knobs()
    return " ".join([strategy.name, *(f"{k}={v}" for k, v in strategy.knobs().items() if defaults.get(k) != v)])


def layout_text(point: Point) -> str:
    layout = point.layout
    if layout.stage_replicas:
        return f"stages {layout.replication} m{layout.micro_batches}x{layout.micro_batch_size}"
    text = (f"dp{layout.dp} pp{layout.pp}" + (f" cp{layout.cp}" if layout.cp > 1 else "") + f" tp{layout.tp}"
            + (f" shard{layout.shard}" if layout.shard > 1 else ""))
    return text + (f" m{layout.micro_batches}x{layout.micro_batch_size}" if layout.micro_batches > 1 else "")


def fits_text(prediction: Prediction) -> str:
    if prediction.fits is None:
        return "unknown"
    return "yes" if prediction.fits else f"no (> {prediction.capacity / 2**20:.0f} MB)"


def prediction_row(p: Prediction) -> list[str]:
    s = p.step
    return [p.point.label, describe(p.point), layout_text(p.point), str(p.point.global_batch_size), str(p.steps),
            f"{p.epoch_s:.3f}", f"{s.total:.4f}", f"{s.compute:.4f}", f"{s.comm:.4f}", f"{s.bubble:.4f}",
            f"{s.core_wait:.4f}", f"{s.optimizer:.4f}", f"{s.data:.4f}", f"{s.library:+.4f}", f"{s.fitted:+.4f}",
            f"{s.sent / 2**20:.2f}", f"{p.peak_mb:.0f}", fits_text(p)]


COLUMNS = ["point", "strategy", "layout", "global batch", "steps/epoch", "epoch (s)", "step (s)", "compute",
           "exposed comm", "bubble", "core wait", "optimizer", "data", "library", "fitted", "comm MiB/step",
           "peak MB/rank", "fits"]


def as_json(p: Prediction) -> dict:
    point, s = p.point, p.step
    tokens = point.cfg.dataset.seq_len if point.cfg.dataset.kind == "tokens" else None
    return {"point": point.label, "strategy": describe(point), "layout": layout_text(point),
            "workers": point.processes, "global_batch": point.global_batch_size, "step_s": s.total,
            "epoch_s": p.epoch_s, "steps_per_epoch": p.steps, "samples_per_s": p.samples_per_s,
            "tokens_per_s": p.samples_per_s * tokens if tokens else None,
            "model_tflops_per_gpu": p.model_tflops_per_device, "hardware_tflops_per_gpu": p.hardware_tflops_per_device,
            "peak_memory_gb_per_gpu": p.memory.peak / 2**30,
            "fits": p.fits, "priced_from": p.priced_from, "compute": p.profiled_on, "links": p.priced_by,
            "split_s": {"compute": s.compute, "exposed_comm": s.comm, "bubble": s.bubble, "optimizer": s.optimizer,
                        "data": s.data, "library": s.library, "fitted": s.fitted, "core_wait": s.core_wait}}


def notes(predictions: list[Prediction], variant: str) -> list[str]:
    profiled = sorted({p.profiled_on for p in predictions})
    priced = sorted({p.priced_by for p in predictions})
    corrected = sorted({p.corrected_by for p in predictions if p.corrected_by})
    library = sorted({p.library_by for p in predictions if p.library_by})
    library_note = (f" Library overhead measured on probe networks: {'; '.join(library)}." if library else
                    " No library overhead measured for this cluster (`make calibrate` measures it on probe networks)."
                    if variant != "study_j" else "")
    measured = [text for text in profiled if not text.startswith(("datasheet", "calibrated"))]
    counted = [text for text in profiled if text not in measured]
    taken = [p.profiled_at for p in predictions if p.profiled_at]
    ages = (f", {duration(time.time() - max(taken))} to {duration(time.time() - min(taken))} ago" if taken else "")
    windows = (" or ".join(f"{w:g}" for w in sorted({p.profiled_window_s for p in predictions if p.profiled_at}))
               or f"{WINDOW_S:g}")
    compute = ([f"Profiled on {'; '.join(measured)}: {WARMUP} warm-up steps, then the whole network's mean over "
                f"{windows} s of timed steps ({STEPS} to {MAX_STEPS}), each layer's median over {STEPS} "
                f"(results/profiles/{ages})."] if measured else [])
    compute += [f"Priced from {'; '.join(counted)} (suite.predict.roofline; nothing calibrated or profiled on a "
                "GPU)." if all(t.startswith("datasheet") for t in counted) else
                f"Priced from {'; '.join(counted)} (suite.predict.roofline)."] if counted else []
    implementations = sorted({p.point.cfg.framework.names[0] for p in predictions})
    return [f"Model: {variant}, as {' and '.join(implementations)} would run each point (framework=). "
            f"{' '.join(compute)} Links: {'; '.join(priced)}." + library_note
            + (f" Corrected by {'; '.join(corrected)}: the column fitted." if corrected else "")]


def main(argv: list[str]) -> int:
    args = parse_args(argv, __doc__)
    invalid: list[InvalidPoint] = []
    try:
        points = plan_points(args.overrides, invalid)
        if args.variant == FITTED:  # said before any point is profiled
            for cluster in sorted({p.cfg.cluster.name for p in points}):
                correction.required(cluster)
        predictions = []
        for k, point in enumerate(points, 1):
            print(f"[{k}/{len(points)} {point.label}] {describe(point)}", file=sys.stderr, flush=True)
            predictions.append(predict(point, args.variant))
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    if args.json:
        for p in predictions:
            print(json.dumps(as_json(p)))
        for i in invalid:
            print(json.dumps({"point": i.label, "cannot_run": i.error}))
        return 0
    links = sorted({p.point.cfg.cluster.name for p in predictions} | {i.cfg.cluster.name for i in invalid})
    cannot = [[i.label, f"cannot run: {i.error}", *[""] * (len(COLUMNS) - 2)] for i in invalid]
    table = Table("predict", f"Predicted epoch time and memory ({', '.join(links)})", COLUMNS,
                  [prediction_row(p) for p in predictions] + cannot,
                  notes(predictions, args.variant) if predictions else [])
    print(table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
