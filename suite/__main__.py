"""The driver: `python -m suite [-m] [--sweep NAME] [--force] [override ...]`.

Overrides are Hydra's (`dataset=cifar10 network=resnet18 strategy=ddp workers=2 epochs=2`); with
-m, comma lists sweep the cartesian product. `--sweep NAME` runs conf/sweep/NAME.yaml, with the
command-line overrides applied to each of its points. Every point is validated before any runs.
"""

from __future__ import annotations

import argparse
import signal
import sys

from suite.errors import ConfigError


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated override values")
    parser.add_argument("--sweep", help="run the points of conf/sweep/<SWEEP>.yaml")
    parser.add_argument("--force", action="store_true", help="re-run points that already have a finished run")
    parser.add_argument("--cfg", action="store_true", help="print the composed config of each point and exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. strategy=ddp workers=2")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Imported here so that `--help` and argument errors answer at once.
    from omegaconf import OmegaConf

    from analysis.report import write_report
    from suite.driver import run_sweep
    from suite.plan import expand, plan, sweep_lines
    from suite.tracking import Store

    try:
        lines = sweep_lines(args.sweep) if args.sweep else [[]]
        jobs = [job for line in lines for job in expand(line + args.overrides, args.multirun or bool(args.sweep))]
        points = plan(jobs, experiment=args.sweep)
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    if args.cfg:
        for point in points:
            print(f"# {point.label} ({point.config_hash})\n{OmegaConf.to_yaml(point.cfg)}")
        return 0
    store = Store(points[0].cfg.tracking.uri)
    print(f"{len(points)} point(s); results in {store.uri}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a scheduler's SIGTERM stops like Ctrl-C
    try:
        outcomes = run_sweep(points, store, force=args.force)
    except KeyboardInterrupt as e:
        print(f"\ninterrupted: {e}" if str(e) else "\ninterrupted", file=sys.stderr)
        return 130
    by_experiment: dict[str, set[str]] = {}
    for o in outcomes:
        by_experiment.setdefault(o.point.cfg.tracking.experiment, set()).add(o.run_id)
    for experiment, run_ids in by_experiment.items():
        table, files = write_report(store, experiment, run_ids)
        print(f"\n## {experiment}\n\n{table}\n")
        for path in files:
            print(f"wrote {path}")
    failed = [o for o in outcomes if o.status != "finished"]
    if failed:
        print(f"{len(failed)} of {len(outcomes)} point(s) did not finish: "
              + ", ".join(f"{o.point.label} ({o.status})" for o in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
