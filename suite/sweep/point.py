"""A planned point's directory, and what became of the point in a sweep."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from suite.errors import ConfigError
from suite.layout import for_ranks
from suite.paths import REPO_ROOT, results_dir
from suite.point_dir import PointDir, error_line
from suite.records.run_schema import run_params
from suite.runtime.manifest import git_sha
from suite.sweep.plan import Point

# What a sweep records with a point's run beside what it measures: a prediction's metrics. The sweep does not price
# points itself (the predictor plans points, so it imports the sweep's planning): whoever runs the sweep hands it
# the model's (suite.predict.predictor.recorded_prediction), or nothing is predicted.
Predict = Callable[[Point], dict[str, float]]


def no_prediction(point: Point) -> dict[str, float]:
    return {}


def prediction_for(predict: Predict, point: Point, where: str, said: set[str]) -> dict[str, float]:
    """`predict(point)`, which never stops a sweep: where it fails the point runs without a prediction, and why is
    said once per sweep (`said`: the reasons said so far)."""
    try:
        return predict(point)
    except Exception as exc:  # a damaged calibration file (DamagedRecord), or the model's own failure
        reason = str(exc) if isinstance(exc, ConfigError) else f"the performance model failed: {error_line(exc)}"
        if reason not in said:
            said.add(reason)
            print(f"warning: [{where} {point.label}] recorded without a prediction: {reason} (said once per sweep)",
                  file=sys.stderr, flush=True)
        return {}


@dataclass(frozen=True)
class Outcome:
    point: Point
    status: str
    error: str | None
    run_id: str | None
    point_dir: PointDir | None = None  # None when skipped


def point_dir_path(point: Point) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{stamp}-{point.label.replace('/', '_')}-{point.config_hash[:8]}"
    return results_dir() / "points" / point.cfg.tracking.experiment / name


def new_point_dir(point: Point, parent_run_id: str | None = None,
                  predictions: dict[str, float] | None = None) -> PointDir:
    """A fresh directory with the resolved config and what its MLflow run will carry (point.json): its run
    is recorded as a child of `parent_run_id`, the sweep invocation's run, when given, with the performance
    model's `predictions` for it."""
    first = point_dir_path(point)
    for attempt in range(1000):  # never reuse a directory: earlier results stay untouched
        path = first if attempt == 0 else first.with_name(f"{first.name}.{attempt}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        point_dir = PointDir(path)
        OmegaConf.save(for_ranks(point.cfg), point_dir.config, resolve=True)
        point_dir.write_point({"label": point.label, "run_name": point.run_name or point.label,
                         "config_hash": point.config_hash, "experiment": point.cfg.tracking.experiment,
                         "overrides": list(point.overrides), "git_sha": git_sha(REPO_ROOT),
                         "params": run_params(point.cfg, point.strategy.knobs(), point.layout.params()),
                         "predictions": predictions or {}, "parent_run_id": parent_run_id})
        for name, content in point.config_files.items():
            point_dir.write_config_file(name, content)
        return point_dir
    raise RuntimeError(f"cannot create a point directory under {first.parent}")


