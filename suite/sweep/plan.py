"""From command-line overrides or a sweep file to a list of validated points, before anything runs.

Every point of a sweep is composed and checked first; one bad point rejects the whole sweep with
one line per problem, so a mistake never surfaces hours into a run. A sweep file that reproduces a
study may say `invalid_points: record`: then a point that composes but that the strategy or machine
cannot run (torchgpipe beyond one node, more pipeline stages than layers) is kept as an
`InvalidPoint`, recorded with its reason as the study's own failures were, while a point that does
not compose (a misspelt key or name) or holds a value no point could run with (`BadValue`: workers=0, a
negative device memory) still rejects the sweep.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import dataclass

import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf

from launchers import SCHEDULERS
from suite.config import OptimizerConfig, register_schema
from suite.data import check_dataset, train_samples
from suite.errors import BadValue, ConfigError, yaml_error_line
from suite.layout import Layout
from suite.models import check_network
from suite.paths import CONF_DIR
from suite.placement import will_use_cuda
from suite.runtime.activation_checkpointing import checkpoint_interval
from suite.runtime.gpu_query import first_gpu
from suite.strategies import Strategy, build_strategy, older_torch
from suite.vocabulary import Device, FaultKind, GradCompression, MathDtype, OptimizerName, PrecisionName

# Settings that change how a point is run or reported, not what it measures (dotted: one key of a group).
NOT_IDENTITY = ("tracking", "timeout_s", "log_every", "save_final_weights", "record_prediction", "cluster.job",
                "cluster.hardware", "cluster.tracking_uri")
# Under those, what does change the measurement, where set: the memory a CPU rank is held to (suite.runtime.memory).
MEASURED_HARDWARE = ("cluster.hardware.device_memory_gb",)
# Settings added after points were recorded (dotted: one key of a group): at these defaults they are left out of a
# point's identity, so that its hash is what it was before they existed (tests/test_plan.py pins two such hashes).
IDENTITY_DEFAULTS = {"repeat": 0, "profile.steps": 0, "cluster.share_gpus": False, "cluster.gpu_order": None}
TASK_METRICS = {"image": "val_accuracy", "tokens": "val_perplexity"}
NO_BF16_GPUS = ("V100", "P100", "T4")  # before compute capability 8.0 (Lassen's V100)


@dataclass(frozen=True)
class Point:
    overrides: tuple[str, ...]
    cfg: DictConfig
    strategy: Strategy
    layout: Layout

    @property
    def global_batch_size(self) -> int:
        return self.layout.global_batch

    @property
    def processes(self) -> int:
        """Started by the launcher; fewer than workers when one process drives several devices."""
        return self.layout.processes

    @property
    def rank_launcher(self) -> str | None:
        return self.strategy.supports.rank_launcher

    @property
    def config_files(self) -> dict:
        """Generated library configs (see Strategy.config_files)."""
        return self.strategy.config_files(self.cfg)

    @property
    def label(self) -> str:
        return point_label(self.cfg)

    @property
    def config_hash(self) -> str:
        return config_hash(self.cfg)


@dataclass(frozen=True)
class InvalidPoint:
    """A point that composes but cannot run here: recorded as `invalid` with `error`, never launched."""

    overrides: tuple[str, ...]
    cfg: DictConfig
    error: str

    @property
    def label(self) -> str:
        return point_label(self.cfg)

    @property
    def config_hash(self) -> str:
        return config_hash(self.cfg)


class Unrunnable(ConfigError):
    """A composed point that fails validation."""

    def __init__(self, message: str, cfg: DictConfig) -> None:
        super().__init__(message)
        self.cfg = cfg


class OlderTorch(ConfigError):
    """A point whose strategy needs a newer torch than the environment that runs its ranks (this one: a batch job
    runs this interpreter too): refused before anything is launched or submitted, while the other points run."""


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
    identity = OmegaConf.to_container(cfg, resolve=True)
    for key, default in IDENTITY_DEFAULTS.items():
        if _lookup(identity, key) == default:
            _drop(identity, key)
    kept = {key: _lookup(identity, key) for key in MEASURED_HARDWARE}
    for key in NOT_IDENTITY:
        _drop(identity, key)
    identity.update({key: value for key, value in kept.items() if value is not None})
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def parse_overrides(overrides: list[str]) -> list[Override]:
    """Hydra's parse of the overrides; ConfigError naming the first that is not one."""
    without_value = [o for o in overrides if "=" not in o and not o.startswith("~")]  # `~key` deletes a key
    if without_value:
        raise ConfigError(f"{without_value[0]!r} is not an override: give key=value, e.g. strategy=ddp")
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:  # its message's last line links Hydra's grammar
        problem = " ".join(line.strip() for line in e.message.splitlines()[:-1])
        raise ConfigError(f"override {e.override!r} does not parse: {problem}") from e


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Hydra's own sweep syntax: `strategy=single,ddp workers=1,2` is the cartesian product."""
    parsed = parse_overrides(overrides)
    if not multirun:
        sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
        if sweeps:
            raise ConfigError(f"{sweeps[0]!r} is a sweep: add -m (--multirun) to run every value")
        return [overrides]
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


SWEEP_KEYS = ("common", "points", "repeats", "invalid_points", "report")


def sweep_file(name: str) -> DictConfig:
    """conf/sweep/<name>.yaml: `common` overrides, `points` (one override line each), optional `repeats` (each
    point measured that many times, `repeat=0..N-1`), `invalid_points` (reject | record) and `report` (the
    tables and figures of its report, see analysis.views)."""
    path = CONF_DIR / "sweep" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ConfigError(f"no sweep {name!r} in conf/sweep (known: {known})")
    try:
        sweep = OmegaConf.load(path)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error_line(e) or f"{path}: {' '.join(str(e).split())}") from e
    unknown = sorted(set(sweep.keys()) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"sweep {name}: unknown key(s) {', '.join(unknown)} (known: {', '.join(SWEEP_KEYS)})")
    if sweep.get("invalid_points", "reject") not in ("reject", "record"):
        raise ConfigError(f"sweep {name}: invalid_points={sweep.invalid_points} is not reject or record")
    repeats = sweep.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"sweep {name}: repeats={repeats} is not a positive integer")
    return sweep


def repeat_overrides(repeats: int) -> list[str]:
    """Each point measured `repeats` times: the repeat index is part of its identity (config hash), so that
    resuming skips the repeats that finished and no run is overwritten."""
    if repeats < 1:
        raise ConfigError(f"repeats must be positive, got {repeats}")
    return [f"repeat=range(0,{repeats})"] if repeats > 1 else []


def sweep_lines(name: str, repeats: int | None = None) -> list[list[str]]:
    """The override lines of a sweep file, `common` first, each repeated `repeats` times (default: the file's)."""
    sweep = sweep_file(name)
    common = list(sweep.get("common", []))
    repeat = repeat_overrides(repeats or sweep.get("repeats", 1))
    return [common + line.split() + repeat for line in sweep.points]


def _compose(overrides: list[str]) -> DictConfig:
    try:
        return compose(config_name="config", overrides=overrides)
    except Exception as e:  # Hydra's and OmegaConf's errors already say which key or option is wrong
        raise ConfigError(yaml_error_line(e) or " ".join(str(e).split())) from e


def _check_ranges(cfg: DictConfig) -> None:
    positive = {"workers": cfg.workers, "batch_size": cfg.batch_size, "epochs": cfg.epochs,
                "timeout_s": cfg.timeout_s, "log_every": cfg.log_every, "optimizer.lr": cfg.optimizer.lr,
                "grad_compression.rank": cfg.grad_compression.rank,
                "cluster.workers_per_node": cfg.cluster.workers_per_node}
    job = cfg.cluster.job
    positive.update({"cluster.job.time_limit_min": job.time_limit_min,
                     "cluster.job.points_per_job": job.points_per_job})
    optional = {"steps_per_epoch": cfg.steps_per_epoch, "eval_batches": cfg.eval_batches, "nodes": cfg.nodes,
                "cluster.threads_per_worker": cfg.cluster.threads_per_worker,
                "cluster.job.cores_per_worker": job.cores_per_worker}
    for key, value in {**positive, **{k: v for k, v in optional.items() if v is not None}}.items():
        if value <= 0:
            raise BadValue(f"{key} must be positive, got {value}")
    if cfg.warmup_steps < 0:
        raise BadValue(f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    if cfg.repeat < 0:
        raise BadValue(f"repeat must be >= 0, got {cfg.repeat}")
    if cfg.profile.steps < 0:
        raise BadValue(f"profile.steps must be >= 0, got {cfg.profile.steps}")
    if cfg.grad_compression.start_iter < 2:  # PowerSGD's error feedback starts from the second step's state
        raise BadValue(f"grad_compression.start_iter must be >= 2, got {cfg.grad_compression.start_iter}")


def _check_choices(cfg: DictConfig) -> None:
    choices = {"precision": (cfg.precision, tuple(PrecisionName)),
               "optimizer.name": (cfg.optimizer.name, tuple(OptimizerName)),
               "grad_compression.name": (cfg.grad_compression.name, tuple(GradCompression)),
               "cluster.device": (cfg.cluster.device, tuple(Device)),
               "cluster.scheduler": (cfg.cluster.scheduler, SCHEDULERS)}
    if cfg.fault.kind is not None:
        choices["fault.kind"] = (cfg.fault.kind, tuple(FaultKind))
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise BadValue(f"{key}={value} is not one of {', '.join(allowed)}")
    metric = TASK_METRICS.get(cfg.dataset.kind)
    if cfg.target.metric is not None and cfg.target.metric != metric:  # a value of another point's dataset
        raise ConfigError(f"target.metric={cfg.target.metric} does not fit {cfg.dataset.kind} data (use {metric})")
    target = cfg.target.value
    if target is not None and not (0 < target <= 1 if metric == "val_accuracy" else target >= 1):
        raise BadValue(f"target.value={target} is not a reachable {metric} "
                          + ("(a fraction in (0, 1])" if metric == "val_accuracy" else "(a perplexity >= 1)"))
    checkpoint_interval(cfg.activation_checkpointing)
    for dtype in cfg.cluster.hardware.peak_tflops or {}:
        if dtype not in tuple(MathDtype):
            raise BadValue(f"cluster.hardware.peak_tflops.{dtype} is not one of {', '.join(MathDtype)}")
    if not 0 <= cfg.fault.rank < cfg.workers:  # a rank of another point's workers
        raise ConfigError(f"fault.rank={cfg.fault.rank} is not a rank of {cfg.workers} workers")


def _check_hardware(hardware: DictConfig) -> None:
    """A cluster's datasheet: counts, capacities, bandwidths and peaks positive where given, latencies >= 0."""
    positive = {key: hardware[key] for key in ("nodes", "cores_per_node", "cpu_memory_gb", "device_memory_gb",
                                               "fp64_tflops", "intra_node_bandwidth_gbs", "inter_node_bandwidth_gbs")}
    positive.update({f"peak_tflops.{dtype}": peak for dtype, peak in (hardware.peak_tflops or {}).items()})
    for key, value in positive.items():
        if value is not None and value <= 0:
            raise BadValue(f"cluster.hardware.{key} must be positive, got {value}")
    for key in ("intra_node_latency_us", "inter_node_latency_us"):
        if hardware[key] is not None and hardware[key] < 0:
            raise BadValue(f"cluster.hardware.{key} must be >= 0, got {hardware[key]}")


def _gpu_without_bf16(cluster: DictConfig) -> str | None:
    """The cluster's GPU if it is known to lack bfloat16: this machine's, or one named in its hardware."""
    here = first_gpu() if cluster.scheduler == "local" else None
    if here:
        return None if here.capability >= (8, 0) else here.name
    gpu = cluster.hardware.gpu or ""
    return gpu if any(name in gpu for name in NO_BF16_GPUS) else None


def _check_device(cfg: DictConfig) -> None:
    """The device a point will run on; the GPUs themselves only for points this machine runs."""
    uses_cuda = will_use_cuda(cfg.cluster)
    if cfg.precision == "fp16" and not uses_cuda:
        raise ConfigError("precision=fp16 needs a GPU (loss scaling); use bf16 on CPU")
    old_gpu = _gpu_without_bf16(cfg.cluster) if cfg.precision == "bf16" and uses_cuda else None
    if old_gpu:
        raise ConfigError(f"precision=bf16 needs a GPU with bfloat16 (compute capability 8.0+), not {old_gpu}; "
                          "use fp16")
    if cfg.cluster.scheduler != "local":
        return
    if cfg.cluster.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("cluster.device=cuda but this machine has no CUDA device")
    if uses_cuda and cfg.workers > torch.cuda.device_count() and not cfg.cluster.share_gpus:
        raise ConfigError(f"workers={cfg.workers} but this machine has {torch.cuda.device_count()} GPUs "
                          "(cluster.share_gpus=true runs the ranks on shared GPUs over gloo)")


def _check_batches(cfg: DictConfig, layout: Layout) -> None:
    """The data must give every shard at least one batch, `steps_per_epoch` batches when set, and the first epoch
    the steps `profile.steps` traces."""
    global_batch = layout.global_batch
    samples = train_samples(cfg.dataset)
    if samples is None:  # real data: its size is checked by the workers once it is read
        return
    batches = (samples // layout.dp) // layout.mini_batch
    if batches < 1:
        raise ConfigError(f"{samples} training samples are fewer than one global batch of {global_batch}")
    if cfg.steps_per_epoch is not None and cfg.steps_per_epoch > batches:
        raise ConfigError(f"steps_per_epoch={cfg.steps_per_epoch} but {samples} samples give {batches} batches "
                          f"of {global_batch}: raise dataset.samples or lower the batch")
    epoch_steps = cfg.steps_per_epoch or batches
    if cfg.profile.steps > epoch_steps:
        raise ConfigError(f"profile.steps={cfg.profile.steps} but an epoch has {epoch_steps} steps")


def validate(cfg: DictConfig, torch_version: str) -> tuple[Strategy, Layout]:
    """Raise ConfigError for a point that cannot run on a torch of `torch_version`; return its strategy and layout."""
    _check_ranges(cfg)
    _check_choices(cfg)
    _check_hardware(cfg.cluster.hardware)
    _check_device(cfg)
    check_dataset(cfg.dataset)
    check_network(cfg.network, cfg.dataset)
    strategy = build_strategy(cfg)
    too_old = older_torch(strategy, torch_version)
    if too_old:
        raise OlderTorch(too_old)
    strategy.check(cfg)
    _check_knobs(cfg, strategy)
    layout = strategy.layout(cfg)
    _check_batches(cfg, layout)
    _check_placement(cfg)
    return strategy, layout


def _check_knobs(cfg: DictConfig, strategy: Strategy) -> None:
    """The cross-strategy knobs (precision, optimizer, activation checkpointing, gradient compression) fit the
    strategy."""
    supports = strategy.supports
    if cfg.precision not in supports.precisions:
        raise ConfigError(f"strategy {strategy.name} does not train in precision={cfg.precision} "
                          f"(use {', '.join(supports.precisions)})")
    if cfg.optimizer.name not in supports.optimizers:
        use = f"use {', '.join(supports.optimizers)}"
        if cfg.optimizer.name == OptimizerConfig.name:  # perhaps not chosen at all: say how to choose
            use = f"the default; set optimizer.name={' or '.join(supports.optimizers)} and an optimizer.lr for it"
        raise ConfigError(f"strategy {strategy.name} does not train with optimizer.name={cfg.optimizer.name} ({use})")
    if checkpoint_interval(cfg.activation_checkpointing) and not supports.activation_checkpointing:
        raise ConfigError(f"strategy {strategy.name} does not apply activation_checkpointing="
                          f"{cfg.activation_checkpointing}; leave it none")
    compression = cfg.grad_compression.name
    if compression not in supports.grad_compressions:
        raise ConfigError(f"strategy {strategy.name} does not compress gradients (grad_compression.name="
                          f"{compression}); ddp does, through its communication hooks")


def _check_placement(cfg: DictConfig) -> None:
    """The point's ranks fit the nodes it asks for, the nodes fit the cluster, the scheduler gets what it needs."""
    cluster = cfg.cluster
    per_node = math.ceil(cfg.workers / cfg.nodes)
    if cfg.nodes > cfg.workers:
        raise ConfigError(f"nodes={cfg.nodes} but only workers={cfg.workers} ranks to place on them")
    if per_node > cluster.workers_per_node:
        raise ConfigError(f"workers={cfg.workers} on nodes={cfg.nodes} is {per_node} per node, but cluster "
                          f"{cluster.name} has {cluster.workers_per_node} per node")
    if cluster.scheduler == "local" and cfg.nodes != 1:
        raise ConfigError(f"cluster local is one node, but the point needs {cfg.nodes} "
                          f"(workers={cfg.workers}, {cluster.workers_per_node} per node)")
    if cluster.hardware.nodes is not None and cfg.nodes > cluster.hardware.nodes:
        raise ConfigError(f"the point needs {cfg.nodes} nodes (workers={cfg.workers}, {per_node} per node), "
                          f"but cluster {cluster.name} has {cluster.hardware.nodes}")
    if cluster.job.account_required and not cluster.job.account:
        raise ConfigError(f"cluster {cluster.name} needs an account to charge: add ACCOUNT=<name> "
                          "(or cluster.job.account=<name>)")


def make_point(overrides: list[str], experiment: str | None, torch_version: str) -> Point:
    cfg = _compose(overrides)
    if experiment and not any(o.startswith("tracking.experiment=") for o in overrides):
        cfg.tracking.experiment = experiment
    if cfg.nodes is None:
        cfg.nodes = math.ceil(cfg.workers / cfg.cluster.workers_per_node)
    try:
        strategy, layout = validate(cfg, torch_version)
    except (BadValue, OlderTorch):
        raise
    except ConfigError as e:
        raise Unrunnable(str(e), cfg) from e
    return Point(tuple(overrides), cfg, strategy, layout)


def problem_line(message: str, where: list[str], total: int) -> str:
    """One line per distinct problem: a problem of one point names it, one shared by several counts them."""
    if total == 1:
        return message
    if len(where) == 1:
        return f"{where[0]}: {message}"
    if len(where) == total:
        return f"{message} (all {total} points)"
    return f"{message} ({len(where)} of {total} points, e.g. {where[0]})"


def plan(jobs: list[list[str]], experiment: str | None = None,
         invalid: list[InvalidPoint] | None = None, torch_version: str | None = None) -> list[Point]:
    """Compose and validate every job; raise ConfigError listing all bad ones. With an `invalid` list, the
    points that compose but cannot run are appended to it instead (once per config hash). Points whose strategy
    needs a newer torch than `torch_version` (default: this environment's) are left out, one line on stderr per
    strategy; if that leaves none, those lines are the ConfigError."""
    register_schema()
    GlobalHydra.instance().clear()
    points, unrunnable = [], {}
    problems: dict[str, list[str]] = {}  # message -> the points it rejects, as their override lines
    refused: dict[str, list[str]] = {}  # the same, for points this torch cannot run
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for overrides in jobs:
            try:
                points.append(make_point(overrides, experiment, torch_version or torch.__version__))
            except OlderTorch as e:
                refused.setdefault(str(e), []).append(" ".join(overrides) or "(defaults)")
            except ConfigError as e:
                if isinstance(e, Unrunnable) and invalid is not None:
                    found = InvalidPoint(tuple(overrides), e.cfg, str(e))
                    unrunnable.setdefault(found.config_hash, found)
                else:
                    problems.setdefault(str(e), []).append(" ".join(overrides) or "(defaults)")
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
    return list(unique.values())
