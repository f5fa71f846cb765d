"""The driver: `suite run [-m] [--sweep NAME] [--force] [--retry-failed] [--dry-run] [override ...]` (the same as
`python -m suite ...`; `suite --help` lists the other commands, the config groups and the sweeps).

Overrides are Hydra's (`dataset=cifar10 network=resnet18 strategy=ddp workers=2 epochs=2`); with
-m, comma lists sweep the cartesian product. `--sweep NAME` runs conf/sweep/NAME.yaml, with the
command-line overrides applied to each of its points. Every point is validated before any runs.
On a batch cluster (`cluster=slurm`, `lassen`, ...) the points are submitted as jobs and the
command returns; `--status` shows where each point is, `--collect` records jobs that ended unrecorded.
"""

from __future__ import annotations

import argparse
import sys

from suite.errors import ConfigError, OneLineParser, positive_int
from suite.shared_names import Status


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="suite run", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated override values")
    parser.add_argument("--sweep", help="run the points of conf/sweep/<SWEEP>.yaml")
    parser.add_argument("--force", action="store_true", help="re-run points that already have a finished run")
    parser.add_argument("--retry-failed", action="store_true", help="re-run points whose last run did not finish")
    parser.add_argument("--repeats", type=positive_int,
                        help="measure every point N times (default: the sweep file's, or 1)")
    parser.add_argument("--dry-run", action="store_true",
                        help="write the job scripts (batch clusters) or list the points (here); run nothing")
    parser.add_argument("--status", action="store_true", help="show each point's state and exit")
    parser.add_argument("--collect", action="store_true",
                        help="record every batch job that ended without recording its points, and exit")
    parser.add_argument("--cfg", choices=["job"],
                        help="`--cfg job`: print the composed config of each point and exit (as Hydra's), "
                             "nothing created")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. strategy=ddp workers=2")
    # Options may come between overrides (`strategy=ddp --dry-run workers=2`), as make's variables place them.
    return parser.parse_intermixed_args(argv)


def config_error(error: Exception) -> int:
    for line in str(error).splitlines():
        print(f"error: {line}", file=sys.stderr)
    return 2


def compose_jobs(args: argparse.Namespace) -> tuple[list[list[str]], list]:
    """Step 1: every point's overrides and composed config, before the rest of the suite is imported (torch, MLflow,
    the strategies): a misspelt name or key is answered in a second or two."""
    from suite.sweep.compose import compose_all
    from suite.sweep.sweep_files import expand, repeat_overrides, sweep_jobs

    if args.collect:
        jobs = []
    elif args.sweep:
        jobs = sweep_jobs(args.sweep, args.overrides, args.repeats)
    else:
        multirun = args.multirun or (args.repeats or 1) > 1
        jobs = expand(repeat_overrides(args.repeats or 1) + args.overrides, multirun)
    return jobs, compose_all(jobs)


def plan_points(args: argparse.Namespace, jobs: list[list[str]], composed: list) -> tuple[list, list]:
    """Step 2: the points that can run, and those of a grid that cannot (recorded where the sweep file says so, else
    skipped with a line each). A point asked for alone that cannot run, or a grid of none that can, is refused."""
    from suite.predict.pipedream_plan import resolve_auto
    from suite.sweep.compose import job_line, problem_line
    from suite.sweep.plan import plan
    from suite.sweep.sweep_files import sweep_file

    invalid = [] if len(jobs) > 1 else None
    points = plan(jobs, experiment=args.sweep, invalid=invalid, plan_auto=resolve_auto, composed=composed)
    if not points:  # none can: refused as a point asked for alone is, one line per distinct reason
        reasons: dict[str, list[str]] = {}
        for point in invalid:
            reasons.setdefault(point.error, []).append(job_line(point.overrides))
        raise ConfigError("\n".join(problem_line(error, where, len(jobs)) for error, where in reasons.items()))
    if invalid and not (args.sweep and sweep_file(args.sweep).get("invalid_points") == "record"):
        for point in invalid:
            print(f"skipped {point.label}: {point.error}", file=sys.stderr)
        print(f"skipped {len(invalid)} point(s) that cannot run; {len(points)} to run", file=sys.stderr, flush=True)
        invalid = []
    return points, invalid or []


def report(args: argparse.Namespace, store, expected: list, outcomes: list) -> tuple:
    """Step 4: each experiment's report of the runs this invocation recorded, with every point's speedup and its
    interval logged beside it; the report directory and the best speedup (or None)."""
    from analysis.report import write_report
    from analysis.speedup import best_speedup, point_speedups
    from analysis.views import NotRun

    submitted = [o for o in outcomes if o.status == "submitted"]
    by_experiment: dict[str, set[str]] = {}
    for o in expected + outcomes:
        if o.run_id and not args.dry_run:
            by_experiment.setdefault(o.point.cfg.tracking.experiment, set()).add(o.run_id)
    not_run = [NotRun(c.dataset.name, c.network.name, c.strategy.name, c.workers)
               for c in (o.point.cfg for o in submitted)]
    report_dir, best = None, None
    for experiment, run_ids in by_experiment.items():
        written = write_report(store, experiment, run_ids, sweep=args.sweep, not_run=not_run)
        print(f"\n## {experiment}\n\n{written.summary}\n")
        print(f"wrote {len(written.files)} file(s) to {written.directory}")
        report_dir = written.directory
        speedups = point_speedups(written.rows)
        store.log_point_metric(speedups, "speedup")
        for end, name in enumerate(("speedup_low", "speedup_high")):  # its point's interval, beside it in the UI
            store.log_point_metric({run: bounds[end] for run, bounds in written.speedup_bounds.items()}, name)
        best = best_speedup(written.rows, speedups) or best
    return report_dir, best


def finish(args: argparse.Namespace, store, parent: str | None, points: list, expected: list, outcomes: list,
           report_dir, best) -> int:
    """Step 5: the sweep invocation's run ended with its counts, and the exit code: 1 if a point did not finish."""
    submitted = [o for o in outcomes if o.status == "submitted"]
    failed = [o for o in outcomes if o.status not in (Status.finished, "submitted")]
    if parent:
        metrics = {"points_finished": sum(o.status == Status.finished for o in outcomes),
                   "points_failed": len(failed), "points_submitted": len(submitted), "points_invalid": len(expected)}
        params = {"sweep": args.sweep, "points": len(points), "overrides": " ".join(args.overrides) or "-"}
        if best:
            metrics["best_speedup"] = best[1]
            params["best_point"] = best[0].label + f" w{best[0].workers} ({best[0].network})"
        store.finish_sweep_run(parent, report_dir, "FAILED" if failed else "FINISHED", params, metrics)
    if failed:
        print(f"{len(failed)} of {len(outcomes)} point(s) did not finish: "
              + ", ".join(f"{o.point.label} ({o.status})" for o in failed), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        jobs, composed = compose_jobs(args)
    except ConfigError as e:
        return config_error(e)
    # Imported here so that `--help`, argument errors and configs that do not compose answer at once.
    from mlflow.exceptions import MlflowException
    from omegaconf import OmegaConf

    from launchers.batch import SchedulerError
    from suite.errors import Stopped, raise_on_sigterm
    from suite.paths import REPO_ROOT, git_sha
    from suite.point_dir import error_line
    from suite.predict.predictor import recorded_prediction
    from suite.records.store import Store, store_uri
    from suite.sweep.driver import check_installed, record_invalid, run_sweep
    from suite.sweep.jobs import batch_experiments, check_submittable, collect
    from suite.sweep.status import end_abandoned_sweep_runs, status_table

    parent = None  # the sweep invocation's run in the store
    try:
        if args.collect:
            waiting = collect(args.sweep)
            print(f"{len(waiting)} job point(s) still queued or running")
            return 0
        points, invalid = plan_points(args, jobs, composed)
        if not (args.status or args.cfg):
            check_submittable(points, args.dry_run)
            check_installed(points)
        if args.cfg:
            for point in points:
                print(f"# {point.label} ({point.config_hash})\n{OmegaConf.to_yaml(point.cfg)}")
            return 0
        # Checked as it opens (intact, reachable); only read here, a store that does not exist is not created.
        store = Store(store_uri(points[0].cfg), create=not (args.status or args.dry_run))
        if args.status:
            for experiment in batch_experiments(points):  # jobs leave their points to be recorded here
                collect(experiment)
            print(status_table(points, store))
            return 0
        # Step 3: run (or submit) the points
        print(f"{len(points)} point(s)" + (f", {len(invalid)} that cannot run here" if invalid else "")
              + f"; results in {store.uri}", flush=True)
        experiment = points[0].cfg.tracking.experiment
        if not args.dry_run:
            store.back_up()  # the copy a damaged store's message points to
            for line in end_abandoned_sweep_runs(store, {experiment}):  # left RUNNING by a sweep killed outright
                print(line, flush=True)
        parent = None if args.dry_run or not args.sweep else store.start_sweep_run(experiment, args.sweep,
                                                                                   " ".join(argv), git_sha(REPO_ROOT))
        raise_on_sigterm()  # a scheduler's SIGTERM stops the sweep like Ctrl-C, and the point as `timeout`
        expected = record_invalid(invalid, store, args.dry_run, parent)  # the sweep file expects them
        outcomes = run_sweep(points, store, force=args.force, retry_failed=args.retry_failed, dry_run=args.dry_run,
                             parent_run_id=parent, predict=recorded_prediction)
    except (ConfigError, SchedulerError) as e:
        return config_error(e)
    except MlflowException as e:
        print(f"error: the MLflow store: {error_line(e)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Stopped) as e:
        print(f"\ninterrupted: {e}" if str(e) else "\ninterrupted", file=sys.stderr)
        if parent:
            store.finish_sweep_run(parent, None, "KILLED")
        return 130
    if any(o.status == "submitted" for o in outcomes):
        print(f"\n{sum(o.status == 'submitted' for o in outcomes)} point(s) submitted or waiting in jobs: `make "
              "status` shows where they are, `make report` tables them once they ran")
    report_dir, best = report(args, store, expected, outcomes)
    return finish(args, store, parent, points, expected, outcomes, report_dir, best)


if __name__ == "__main__":
    from suite.cli import main as suite_command  # `python -m suite ...` is `suite ...`
    sys.exit(suite_command())
