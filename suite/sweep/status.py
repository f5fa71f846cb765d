"""`make status`: one line per point of a sweep, from the scheduler (queued, running) and the MLflow store."""

from __future__ import annotations

from collections import Counter

from launchers.batch import ENDED
from suite.records.point_dir import PointDir
from suite.records.store import Store
from suite.sweep import jobs
from suite.sweep.plan import Point

COLUMNS = ("point", "status", "epochs", "job", "run / error")


def _epochs(point_dir: str | None, epochs: int) -> str:
    out = PointDir(point_dir) if point_dir else None
    return f"{len(out.epochs())}/{epochs}" if out and out.path.exists() else "-"


def status_rows(points: list[Point], store: Store) -> list[tuple[str, ...]]:
    pending = jobs.pending(points)
    rows = []
    for point in points:
        waiting = pending.get((point.cfg.tracking.experiment, point.config_hash))
        if waiting:
            job, state = waiting.job, waiting.state
            phase = state.phase if state else "forgotten by the scheduler"
            detail = state.detail if state and state.phase != ENDED else "ended unrecorded: `make collect` records it"
            rows.append((point.label, phase, _epochs(str(waiting.out.path), point.cfg.epochs),
                         f"{job['scheduler']} {job['job_id']}", detail))
            continue
        run = store.speaking_run(point.cfg.tracking.experiment, point.config_hash)
        if run is None:
            rows.append((point.label, "not run", "-", "-", ""))
            continue
        tags = run.data.tags
        rows.append((point.label, tags.get("suite.status", "?"), _epochs(tags.get("suite.point_dir"), point.cfg.epochs),
                     " ".join(filter(None, (tags.get("suite.scheduler"), tags.get("suite.job_id")))) or "-",
                     tags.get("suite.error") or f"run {run.info.run_id}"))
    return rows


def status_table(points: list[Point], store: Store, width: int = 70) -> str:
    rows = [(*row[:-1], row[-1] if len(row[-1]) <= width else row[-1][:width - 3] + "...")
            for row in status_rows(points, store)]
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [COLUMNS, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = Counter(row[1] for row in rows)
    lines.append(f"\n{len(rows)} point(s): " + ", ".join(f"{n} {status}" for status, n in counts.most_common()))
    return "\n".join(lines)
