"""`make status`: one line per point of a sweep, from the scheduler (queued, running) and the MLflow store."""

from __future__ import annotations

import time
from collections import Counter

from launchers.batch import ENDED
from suite.point_dir import PointDir
from suite.records.run_schema import INCOMPLETE, INCONSISTENT, run_status
from suite.records.store import Store
from suite.sweep import jobs
from suite.sweep.plan import Point

COLUMNS = ("point", "status", "epochs", "job", "run / error")


def _epochs(point_dir: str | None, epochs: int) -> str:
    point_dir = PointDir(point_dir) if point_dir else None
    return f"{len(point_dir.epochs())}/{epochs}" if point_dir and point_dir.path.exists() else "-"


def status_rows(points: list[Point], store: Store) -> list[tuple[str, ...]]:
    pending = jobs.pending(points)
    rows = []
    for point in points:
        waiting = pending.get((point.cfg.tracking.experiment, point.config_hash))
        if waiting:
            job, state = waiting.job, waiting.state
            phase = state.phase if state else "forgotten by the scheduler"
            detail = state.detail if state and state.phase != ENDED else "ended unrecorded: `make collect` records it"
            rows.append((point.label, phase, _epochs(str(waiting.point_dir.path), point.cfg.epochs),
                         f"{job['scheduler']} {job['job_id']}", detail))
            continue
        run = store.speaking_run(point.cfg.tracking.experiment, point.config_hash)
        if run is None:
            rows.append((point.label, "not run", "-", "-", ""))
            continue
        tags, status = run.data.tags, run_status(run)
        detail = tags.get("suite.error") or f"run {run.info.run_id}"
        if status == INCOMPLETE:
            detail = f"run {run.info.run_id}: recording stopped part-way"  # the next sweep runs the point again
        elif status == INCONSISTENT:
            detail = f"run {run.info.run_id}: its params were changed after it was recorded"  # run again, too
        rows.append((point.label, status, _epochs(tags.get("suite.point_dir"), point.cfg.epochs),
                     " ".join(filter(None, (tags.get("suite.scheduler"), tags.get("suite.job_id")))) or "-", detail))
    return rows


def end_abandoned_sweep_runs(store: Store, experiments: set[str]) -> list[str]:
    """End the sweep invocations' runs left RUNNING by drivers that are gone (Store.end_abandoned_sweep_runs);
    a line for each."""
    return [f"{run.info.run_name} (run {run.info.run_id}) was left running by a driver that is gone: "
            f"marked KILLED as of {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.info.end_time / 1000))}"
            for experiment in sorted(experiments) for run in store.end_abandoned_sweep_runs(experiment)]


def status_table(points: list[Point], store: Store, width: int = 70) -> str:
    """The points' states; and each sweep run of their experiments whose driver is gone, ended as KILLED."""
    ended = end_abandoned_sweep_runs(store, {point.cfg.tracking.experiment for point in points})
    rows = [(*row[:-1], row[-1] if len(row[-1]) <= width else row[-1][:width - 3] + "...")
            for row in status_rows(points, store)]
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [COLUMNS, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = Counter(row[1] for row in rows)
    lines.append(f"\n{len(rows)} point(s): " + ", ".join(f"{n} {status}" for status, n in counts.most_common()))
    return "\n".join([*lines, *ended])
