"""`make plan-pipedream`: PipeDream's planner on a point, nothing launched.

    python -m suite.tools.plan_pipedream override ...     (suite plan-pipedream ...)

Overrides name the point (`dataset=imagenet network=vgg16 cluster=lassen workers=4 batch_size=64`); the strategy is
pipedream. The network is profiled (or priced from the cluster's datasheet) as `make predict` does, at one
mini-batch of `batch_size`; the planner (suite.predict.pipedream_plan) chooses the stages, their layers and their
replicas. Prints the chosen configuration as PipeDream writes it (`2-1-1`), its predicted time per mini-batch and
per sample, the best configuration of every other stage count, and the best of those strategy=pipedream runs today
(every stage alike replicated) with the knobs that run it.
"""

from __future__ import annotations

import argparse
import functools
import sys

from analysis.tables import Table
from suite.errors import ConfigError, OneLineParser
from suite.placement import will_use_cuda
from suite.predict.links import LinkModel, link_model
from suite.predict.memory import capacity_bytes
from suite.predict.pipedream_plan import Costs, Plan, Planner
from suite.predict.predictor import processes_per_node, workload
from suite.sweep.plan import Point
from suite.tools.predict import plan_points


def planner(point: Point) -> tuple[Planner, int]:
    """The planner of a point's network, cluster and workers; and its mini-batch (samples)."""
    w, _, _ = workload(point)
    cluster = point.cfg.cluster

    @functools.cache
    def among(ranks: int, nodes: int) -> LinkModel:
        return link_model(cluster, nodes, ranks)
    device = "cuda" if will_use_cuda(cluster) else "cpu"
    capacity = capacity_bytes(point.cfg, device, processes_per_node(point))
    costs = Costs.from_profile(w.profile, among, cluster.workers_per_node, capacity)
    return Planner(costs, point.cfg.workers), w.profile.batch


def plan_table(point: Point, plans: list[Plan], runnable: list[Plan], batch: int) -> Table:
    """The planner's choice and the best of every other stage count; then the best configuration of each kind
    strategy=pipedream runs (every stage alike replicated), with the knobs that run it."""
    rows = []
    shown = [*plans, *(p for p in runnable if p not in plans)]
    best_here = min((p for p in shown if p.uniform), key=lambda p: p.time_s, default=None)
    for plan in shown:
        note = ", ".join(text for text, holds in (("chosen", plan is plans[0]), ("best that runs here",
                                                                                 plan is best_here)) if holds)
        slowest = max(plan.stages, key=lambda stage: max(stage.time_s, stage.send_s))
        runs = plan.knobs() if plan.uniform else "needs stage replication (not yet)"
        rows.append([plan.name, note, str(len(plan.stages)), "-".join(map(str, plan.balance)), f"{plan.time_s:.4g}",
                     f"{plan.time_s / batch:.4g}", f"{batch / plan.time_s:.1f}",
                     f"stage {plan.stages.index(slowest)} ({slowest.layers} layers)", runs])
    cfg = point.cfg
    return Table("plan_pipedream", f"PipeDream's planner: {cfg.network.name} on {cfg.workers} workers of "
                 f"{cfg.cluster.name}, mini-batch {batch}",
                 ["configuration", "plan", "stages", "layers per stage", "s / mini-batch", "s / sample", "samples/s",
                  "slowest", "run it with"], rows,
                 ["configuration: replicas per stage, as PipeDream writes it. The planner's choice, then the best of "
                  "each other stage count, then the best of each stage count with every stage alike replicated where "
                  "not listed already: what strategy=pipedream runs today (workers / pp pipelines, `run it with`). "
                  "Stages replicated unlike (2-1-1) do not run yet."])


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="suite plan-pipedream", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="the point, e.g. dataset=imagenet network=vgg16 workers=4")
    args = parser.parse_args(argv)
    try:
        # Priced as one stage on every worker: a point of any worker count, whatever its layers (the plan cuts them).
        points = plan_points([*args.overrides, "strategy=pipedream", "strategy.pp=1"])
        tables = []
        for point in points:
            print(f"[{point.label}] profiling and planning", file=sys.stderr, flush=True)
            plan, batch = planner(point)
            tables.append(plan_table(point, plan.plans(), plan.uniform_plans(), batch))
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    print("\n\n".join(table.markdown() for table in tables))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
