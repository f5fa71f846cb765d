"""From command-line overrides or a sweep file to a list of validated points, before anything runs.

Every point of a sweep is composed (suite.sweep.compose) and checked first, so a mistake never surfaces hours
into a run. A point that does not compose (a misspelt key or name) or holds a value no point could run with
(`BadValue`: workers=0, a negative device memory) rejects the sweep, one line per problem. A point that composes
but that the strategy or machine cannot run (single on 2 workers, torchgpipe beyond one node, more pipeline stages
than layers) is an `InvalidPoint` where the caller asks for them (the driver leaves them out of a grid with a line
each, or records them where the sweep file says `invalid_points: record`), else it rejects the sweep too.

A point that runs gets a fresh directory (`new_point_dir`), and the sweep says what became of it (`Outcome`)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from suite.errors import BadValue, ConfigError
from suite.layout import Layout, for_ranks, loader_workers
from suite.models import resolve_network
from suite.paths import REPO_ROOT, git_sha, results_dir
from suite.point_dir import PointDir, error_line
from suite.records.run_schema import run_params
from suite.shared_names import AUTO, AUTO_CHOOSES
from suite.strategies import Strategy
from suite.sweep.checks import OlderTorch, validate
from suite.sweep.compose import PlanningProgress, compose_all, job_line, problem_line

# Settings that change how a point is run or reported, not what it measures (dotted: one key of a group).
# network.family and .size: what the network was chosen by; its name, architecture and dimensions say what is built.
NOT_IDENTITY = ("tracking", "timeout_s", "log_every", "save_final_weights", "record_prediction", "cluster.job",
                "cluster.hardware", "cluster.tracking_uri", "cluster.systems", "network.family", "network.size",
                "framework")
# Under those, what does change the measurement, where set: the memory a CPU rank is held to (suite.runtime.metrics).
MEASURED_HARDWARE = ("cluster.hardware.device_memory_gb",)
# Settings added after points were recorded (dotted: one key of a group): at these defaults they are left out of a
# point's identity, so that its hash is what it was before they existed (tests/test_plan.py pins two such hashes).
IDENTITY_DEFAULTS = {"repeat": 0, "profile.steps": 0, "cluster.share_gpus": False, "cluster.gpu_order": None,
                     "math.tf32": None, "math.cudnn_benchmark": False, "grad_accum": 1, "network.attention": "auto",
                     # Llama 3's dimensions, 0 in the other families' points (recorded before there was a Llama)
                     "network.n_kv_head": 0, "network.ffn_dim_multiplier": 0, "network.multiple_of": 0,
                     "fp8": "none", "compile": False}
PlanAuto = Callable[[DictConfig], None]  # writes the planner's choice into a pp=auto point's config


class ComposedPoint:
    """What a composed point is known by: its label, and its config hash (its identity across sweeps), taken once
    (a point's config is not changed once it is planned)."""

    @property
    def label(self) -> str:
        return point_label(self.cfg)

    @cached_property
    def config_hash(self) -> str:
        return config_hash(self.cfg)


@dataclass(frozen=True)
class Point(ComposedPoint):
    overrides: tuple[str, ...]
    cfg: DictConfig
    strategy: Strategy
    layout: Layout
    # The label and the overrides in which the point differs from the other points of its label in its sweep
    # (`name_apart`), e.g. `tokens/gpt2_tiny/ddp/w2 optimizer.name=adam`: its run's name in the MLflow UI.
    run_name: str = ""

    @property
    def global_batch_size(self) -> int:
        return self.layout.global_batch

    @property
    def processes(self) -> int:
        """Started by the launcher; fewer than workers when one process drives several devices."""
        return self.layout.processes

    @property
    def rank_launcher(self) -> str | None:
        return self.strategy.rank_launcher(self.cfg)

    @property
    def config_files(self) -> dict:
        """Generated library configs (see Strategy.config_files)."""
        return self.strategy.config_files(self.cfg)


@dataclass(frozen=True)
class InvalidPoint(ComposedPoint):
    """A point that composes but cannot run here: recorded as `invalid` with `error`, never launched."""

    overrides: tuple[str, ...]
    cfg: DictConfig
    error: str


class Unrunnable(ConfigError):
    """A composed point that fails validation."""

    def __init__(self, message: str, cfg: DictConfig) -> None:
        super().__init__(message)
        self.cfg = cfg


def point_label(cfg: DictConfig) -> str:
    label = f"{cfg.dataset.name}/{cfg.network.name}/{cfg.strategy.name}/w{cfg.workers}"
    return label + (f"/r{cfg.repeat}" if cfg.repeat else "")


def _lookup(tree: dict, dotted: str) -> object:
    for name in dotted.split("."):
        if not isinstance(tree, dict) or name not in tree:
            return None
        tree = tree[name]
    return tree


def _drop(tree: dict, dotted: str) -> None:
    """Remove a dotted key, and its group when nothing else is left in it."""
    group, _, name = dotted.rpartition(".")
    parent = _lookup(tree, group) if group else tree
    if isinstance(parent, dict):
        parent.pop(name, None)
        if group and not parent:
            _drop(tree, group)


def config_hash(cfg: DictConfig) -> str:
    return identity_hash(OmegaConf.to_container(cfg, resolve=True))


def identity_hash(identity: dict) -> str:
    """`config_hash` of the config as a resolved container, which it changes."""
    if _lookup(identity, "strategy.pp") == AUTO:  # who the point is: the planner's choice, recorded, is not
        for key in AUTO_CHOOSES:
            _drop(identity, key)
    for key, default in IDENTITY_DEFAULTS.items():
        if _lookup(identity, key) == default:
            _drop(identity, key)
    kept = {key: _lookup(identity, key) for key in MEASURED_HARDWARE}
    for key in NOT_IDENTITY:
        _drop(identity, key)
    identity.update({key: value for key, value in kept.items() if value is not None})
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def make_point(overrides: list[str], cfg: DictConfig, experiment: str | None, torch_version: str,
               runs_here: bool = True, plan_auto: PlanAuto | None = None) -> Point:
    """The point of `overrides` from its composed config (suite.sweep.compose), its strategy and layout validated."""
    resolve_network(cfg.network)  # the name it is recorded by is what is built, before its identity is taken
    if experiment and not any(o.startswith("tracking.experiment=") for o in overrides):
        cfg.tracking.experiment = experiment
    if cfg.nodes is None:
        cfg.nodes = math.ceil(cfg.workers / cfg.cluster.workers_per_node)
    cfg.dataset.loader_workers = loader_workers(cfg)
    try:
        if OmegaConf.select(cfg, "strategy.pp") == AUTO and plan_auto is not None:
            print(f"[{point_label(cfg)}] strategy.pp=auto: PipeDream's planner profiles and plans", file=sys.stderr,
                  flush=True)
            plan_auto(cfg)
            print(f"[{point_label(cfg)}] the planner chose {'-'.join(map(str, cfg.strategy.replicas))}, layers "
                  f"{'+'.join(map(str, cfg.strategy.balance))}", file=sys.stderr, flush=True)
        tree = OmegaConf.to_container(cfg, resolve=True)
        strategy, layout = validate(cfg, torch_version, runs_here, tree)
    except (BadValue, OlderTorch):
        raise
    except ConfigError as e:
        raise Unrunnable(str(e), cfg) from e
    point = Point(tuple(overrides), cfg, strategy, layout)
    point.__dict__["config_hash"] = identity_hash(tree)  # the container the checks read: taken once
    return point


def plan(jobs: list[list[str]], experiment: str | None = None, invalid: list[InvalidPoint] | None = None,
         torch_version: str | None = None, runs_here: bool = True, plan_auto: PlanAuto | None = None,
         composed: list[DictConfig] | None = None) -> list[Point]:
    """Compose (unless `composed` holds the jobs' configs, suite.sweep.compose's) and validate every job; raise
    ConfigError listing all bad ones. With an `invalid` list, the
    points that compose but cannot run are appended to it instead (once per config hash). Points whose strategy
    needs a newer torch than `torch_version` (default: this environment's) are left out, one line on stderr per
    strategy; if that leaves none, those lines are the ConfigError. `runs_here=False` plans points only to price
    them: a one-machine cluster's (the local launcher's) GPUs are not asked of this machine. `plan_auto` chooses a
    `strategy.pp=auto` point's configuration (suite.predict.pipedream_plan.resolve_auto: the planner prices through
    the predictor, which plans points, so whoever plans hands it in); without it such a point is rejected."""
    configs = compose_all(jobs) if composed is None else composed
    points, unrunnable = [], {}
    problems: dict[str, list[str]] = {}  # message -> the points it rejects, as their override lines
    refused: dict[str, list[str]] = {}  # the same, for points this torch cannot run
    progress = PlanningProgress(len(jobs), "checked")
    for done, (overrides, cfg) in enumerate(zip(jobs, configs, strict=True)):
        progress.show(done)
        try:
            points.append(make_point(overrides, cfg, experiment, torch_version or torch.__version__, runs_here,
                                     plan_auto))
        except OlderTorch as e:
            refused.setdefault(str(e), []).append(job_line(overrides))
        except ConfigError as e:
            if isinstance(e, Unrunnable) and invalid is not None:
                found = InvalidPoint(tuple(overrides), e.cfg, str(e))
                unrunnable.setdefault(found.config_hash, found)
            else:
                problems.setdefault(str(e), []).append(job_line(overrides))
    if problems:
        raise ConfigError("\n".join(problem_line(message, where, len(jobs)) for message, where in problems.items()))
    refusals = [problem_line(message, where, len(jobs)) for message, where in refused.items()]
    if refusals and not points:
        raise ConfigError("\n".join(refusals))
    for line in refusals:
        print(f"refused: {line}", file=sys.stderr, flush=True)
    if invalid is not None:
        invalid += unrunnable.values()
    unique = {p.config_hash: p for p in points}
    return name_apart(list(unique.values()))


def _assignments(overrides: tuple[str, ...]) -> dict[str, str]:
    return dict(o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)


def name_apart(points: list[Point]) -> list[Point]:
    """Each point with its `run_name`: its label, and where other points share the label (a strategy's knobs, an
    optimizer set apart), the overrides in which they differ, as the report names its rows."""
    labels = [p.label for p in points]
    assigned = [_assignments(p.overrides) for p in points]
    same: dict[str, list[dict[str, str]]] = {}
    for label, mine in zip(labels, assigned):
        same.setdefault(label, []).append(mine)
    differ = {label: sorted(k for k in {k for a in peers for k in a} if len({a.get(k) for a in peers}) > 1)
              for label, peers in same.items()}
    named = []
    for p, label, mine in zip(points, labels, assigned):
        apart = replace(p, run_name=" ".join([label, *(f"{k}={mine[k]}" for k in differ[label] if k in mine)]))
        apart.__dict__["config_hash"] = p.config_hash  # taken once (`ComposedPoint.config_hash`), not for the copy
        named.append(apart)
    return named


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


