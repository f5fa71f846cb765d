"""Benchmark: how close each pipeline schedule comes to its analytic step time (`make bench-pipeline`).

Runs `gpipe` (torchgpipe), `gpipe_dist` and `1f1b` on the same model, batch and micro-batches, one
point each through the suite's own driver (so the numbers are what a sweep records), one thread per
stage. Each point times its stages' compute as it runs; the bound is Study J's GPipe model
T_seq(mb) x (p + m - 1) / p with T_seq(mb) the summed per-stage compute of one micro-batch. It prints
the measured step time, the bound, their ratio (target <= 1.10 for gpipe_dist and 1f1b) and the
measured and ideal bubble fractions. torchgpipe runs every CPU stage on one thread, so on CPU its
ratio is about p: its stages cannot overlap there.

    python -m suite.tools.benchmarks.pipeline [override ...]   # overrides change every point (epochs=1: a smoke run)
"""

from __future__ import annotations

import sys

from suite.records.store import Store
from suite.shared_names import Status
from suite.sweep.driver import run_sweep
from suite.sweep.plan import plan

STRATEGIES = ("gpipe", "gpipe_dist", "1f1b")
POINT = ["dataset=tokens", "network=gpt2_tiny", "network.n_layer=6", "network.n_embd=256", "network.n_head=4",
         "dataset.vocab_size=512", "dataset.seq_len=64", "dataset.samples=2048", "dataset.val_samples=32",
         "batch_size=32", "strategy.micro_batches=8", "workers=2", "epochs=2", "steps_per_epoch=8",
         "warmup_steps=2", "eval_batches=1", "log_every=1000", "cluster.threads_per_worker=1",
         "strategy.balance=[4,4]"]
EXPERIMENT = "bench-pipeline"
COLUMNS = ("pipeline_step_s", "pipeline_bound_s", "pipeline_bound_ratio", "bubble_fraction_measured",
           "bubble_fraction_ideal")


def main(overrides: list[str]) -> int:
    points = plan([[f"strategy={s}", *POINT, *overrides] for s in STRATEGIES], experiment=EXPERIMENT)
    store = Store()
    outcomes = run_sweep(points, store, force=True)
    print("\n| strategy | step (s) | bound T_seq(mb)(p+m-1)/p (s) | ratio | bubble measured | bubble ideal |")
    print("|---|---:|---:|---:|---:|---:|")
    for outcome in outcomes:
        if outcome.status != Status.finished:
            print(f"| {outcome.point.cfg.strategy.name} | {outcome.status}: {outcome.error} |||||")
            continue
        metrics = store.client.get_run(outcome.run_id).data.metrics
        values = " | ".join(f"{metrics[c]:.3f}" for c in COLUMNS)
        print(f"| {outcome.point.cfg.strategy.name} | {values} |")
    c = points[0].cfg
    print(f"\ntarget: ratio <= 1.10 for gpipe_dist and 1f1b ({c.workers} stages, {c.strategy.micro_batches} "
          f"micro-batches, GPT-2 {c.network.n_layer}x{c.network.n_embd}, {c.cluster.threads_per_worker} thread(s) "
          "per stage)")
    return 0 if all(o.status == Status.finished for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
