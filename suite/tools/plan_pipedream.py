"""`make plan-pipedream`: PipeDream's planner on a point, nothing launched.

    python -m suite.tools.plan_pipedream override ...     (suite plan-pipedream ...)

Overrides name the point (`dataset=imagenet network=vgg16 cluster=lassen workers=4 batch_size=64`); the strategy is
pipedream. The network is profiled (or priced from the cluster's datasheet) as `make predict` does, at one
mini-batch of `batch_size`; the planner (suite.predict.pipedream_plan) chooses the stages, their layers and their
replicas. Prints the chosen configuration as PipeDream writes it (`2-1-1`), its predicted time per mini-batch and
per sample, and the best configuration of every other stage count, each with the knobs that run it
(`strategy.replicas`, `strategy.balance`; `strategy.pp=auto` runs the choice).
"""

from __future__ import annotations

import argparse
import sys

from analysis.tables import Table
from suite.errors import ConfigError, OneLineParser
from suite.predict.pipedream_plan import Plan, point_planner
from suite.sweep.plan import Point
from suite.tools.predict import plan_points


def plan_table(point: Point, plans: list[Plan], batch: int) -> Table:
    """The planner's choice and the best configuration of every other stage count, with the knobs that run each."""
    rows = []
    for plan in plans:
        slowest = max(plan.stages, key=lambda stage: max(stage.time_s, stage.send_s))
        rows.append([plan.name, "chosen" if plan is plans[0] else "", str(len(plan.stages)),
                     "-".join(map(str, plan.balance)), f"{plan.time_s:.4g}", f"{plan.time_s / batch:.4g}",
                     f"{batch / plan.time_s:.1f}", f"stage {plan.stages.index(slowest)} ({slowest.layers} layers)",
                     plan.knobs()])
    cfg = point.cfg
    return Table("plan_pipedream", f"PipeDream's planner: {cfg.network.name} on {cfg.workers} workers of "
                 f"{cfg.cluster.name}, mini-batch {batch}",
                 ["configuration", "plan", "stages", "layers per stage", "s / mini-batch", "s / sample", "samples/s",
                  "slowest", "run it with"], rows,
                 ["configuration: replicas per stage, as PipeDream writes it. The planner's choice (what "
                  "strategy.pp=auto runs), then the best of each other stage count; `run it with`: the "
                  "strategy=pipedream knobs that run each."])


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
            plan, batch = point_planner(point)
            tables.append(plan_table(point, plan.plans(), batch))
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    print("\n\n".join(table.markdown() for table in tables))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
