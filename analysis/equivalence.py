"""Whether each point trained to the same losses as `single` on its workload, and its pipeline's bubble measured
beside the schedule's analytic value: the `same_losses` view (conf/sweep/layouts_3d.yaml). A point compares with
the `single` run of its dataset and network on the same global batch, step by step (the runs' `step_loss`
histories); the tolerance is the equivalence tests' (relative 1e-4)."""

from __future__ import annotations

from analysis.breakdown import fmt_number
from analysis.measure import finished
from analysis.runs import Row
from analysis.tables import Table
from analysis.views import Context, Section, table_section, view

RTOL = 1e-4


def layout(row: Row) -> str:
    axes = ("dp", "pp", "cp", "tp") if row.params.get("cp", "1") != "1" else ("dp", "pp", "tp")
    return " x ".join(f"{axis} {row.params.get(axis, '1')}" for axis in axes)


def loss_difference(ctx: Context, row: Row, reference: Row) -> tuple[str, str]:
    """(the largest relative difference of the two runs' step losses, the verdict)."""
    mine = [v for _, v in ctx.histories.get(row.run_id, "step_loss")]
    theirs = [v for _, v in ctx.histories.get(reference.run_id, "step_loss")]
    if not mine or len(mine) != len(theirs):
        return "-", f"not comparable ({len(mine)} steps against {len(theirs)})"
    worst = max(abs(a - b) / abs(b) for a, b in zip(mine, theirs))
    return f"{worst:.1e}", "same" if worst <= RTOL else "differs"


@view("same_losses")
def same_losses(ctx: Context) -> Section:
    done = finished(ctx.rows)
    references = {(r.dataset, r.network, r.params.get("global_batch_size")): r for r in done if r.strategy == "single"}
    rows = []
    for row in sorted(done, key=lambda r: (r.dataset, r.network, r.workers, r.label or r.strategy)):
        if row.strategy == "single":
            continue
        reference = references.get((row.dataset, row.network, row.params.get("global_batch_size")))
        difference, verdict = (loss_difference(ctx, row, reference) if reference
                               else ("-", "no single run on this global batch"))
        bubble = [fmt_number(row.metrics.get(m), ".3f") for m in ("bubble_fraction_measured", "bubble_fraction_ideal")]
        rows.append([row.network, row.label or row.strategy, str(row.workers), layout(row),
                     row.params.get("micro_batches", "-"), difference, verdict, *bubble])
    table = Table("same_losses", f"{ctx.experiment}: each layout's step losses against single's, and its bubble",
                  ["network", "strategy", "workers", "layout", "micro-batches", "max relative loss difference",
                   f"same losses (rtol {RTOL:g})", "bubble measured", "bubble ideal"], rows,
                  ["Each point against the `single` run of its network on the same global batch, over every step. "
                   "Bubble measured: the busiest device's idle share of the step; ideal: the schedule's "
                   "(p - 1) f / (m + (p - 1) f), f = 1 (GPipe, 1F1B) or 1/3 (zero bubble) over the chunks a device "
                   "holds."])
    return table_section(table, ctx)
