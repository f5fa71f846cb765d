"""Whether a composed point can run: its values in range and among their choices, its hardware, device and
precision, its batches, the strategy's own knobs and the machine's placement. suite.sweep.plan asks `validate`."""

from __future__ import annotations

import functools
import json
import math

import torch
from omegaconf import DictConfig, OmegaConf
from packaging.version import Version

from launchers import SCHEDULERS
from suite.config import OptimizerConfig
from suite.data import check_dataset, train_samples
from suite.errors import BadValue, ConfigError
from suite.layout import Layout, will_use_cuda
from suite.models import DECODERS, check_network
from suite.models.gpt2 import flash_runs
from suite.paths import name_problem
from suite.runtime.gpu_query import first_gpu
from suite.runtime.model_transforms import (
    OPERATOR_POLICY_TORCH,
    SELECTIVE,
    SELECTIVE_OP,
    checkpoint_interval,
    recomputes,
)
from suite.shared_names import AttentionKernel, Float8Recipe, MathDtype, PrecisionName
from suite.strategies import Strategy, build_strategy, older_torch, strategy_class, strategy_names
from suite.sweep import hardware_catalog

TASK_METRICS = {"image": "val_accuracy", "tokens": "val_perplexity"}
NO_BF16_GPUS = ("V100", "P100", "T4", "TITAN RTX")  # before compute capability 8.0 (Lassen's V100, Study J's Titan RTX)
# fp8 tensor cores: torch._scaled_mm runs on CUDA compute capability 8.9 (Ada) or 9.0 and later (Hopper), its check in
# aten/src/ATen/native/cuda/Blas.cpp; torchao's float8 training calls it
FP8_CAPABILITY = 8.9


class OlderTorch(ConfigError):
    """A point whose strategy needs a newer torch than the environment that runs its ranks (this one: a batch job
    runs this interpreter too): refused before anything is launched or submitted, while the other points run."""


def _non_finite(tree, prefix: str = "") -> tuple[str, float] | None:
    """The first number of a config tree (resolved) that is nan or infinite, with its key."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, float) and not math.isfinite(value):
            return name, value
        found = _non_finite(value, name)
        if found:
            return found
    return None


def _check_ranges(cfg: DictConfig, tree: dict) -> None:
    # nan passes `value <= 0` and inf passes it too: every number of the point is finite first, whatever its knob
    non_finite = _non_finite(tree)
    if non_finite:
        raise BadValue(f"{non_finite[0]}={non_finite[1]} must be a finite number")
    positive = {"workers": cfg.workers, "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum,
                "epochs": cfg.epochs, "timeout_s": cfg.timeout_s, "log_every": cfg.log_every,
                "optimizer.lr": cfg.optimizer.lr, "grad_compression.rank": cfg.grad_compression.rank,
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
    # torch's optimizers refuse these below zero only when the ranks build them, after the launch
    at_least_zero = {"optimizer.momentum": cfg.optimizer.momentum, "optimizer.weight_decay": cfg.optimizer.weight_decay,
                     "optimizer.eps": cfg.optimizer.eps, "cluster.job.stop_margin_s": job.stop_margin_s}
    for key, value in at_least_zero.items():
        if value < 0:
            raise BadValue(f"{key} must be >= 0, got {value}")
    if job.mem_per_worker_gb is not None and job.mem_per_worker_gb <= 0:
        raise BadValue(f"cluster.job.mem_per_worker_gb must be positive (or null: the node's whole memory), got "
                       f"{job.mem_per_worker_gb}")
    if cfg.fault.kind is not None and (cfg.fault.step < 1 or cfg.fault.rank < 0):
        raise BadValue(f"fault.step must be >= 1 and fault.rank >= 0, got step {cfg.fault.step}, rank "
                       f"{cfg.fault.rank}")
    if cfg.grad_compression.start_iter < 2:  # PowerSGD's error feedback starts from the second step's state
        raise BadValue(f"grad_compression.start_iter must be >= 2, got {cfg.grad_compression.start_iter}")


def _check_names(cfg: DictConfig) -> None:
    """The names that become directories under the results directory stay one directory there."""
    for key, name in (("tracking.experiment", cfg.tracking.experiment), ("cluster.name", cfg.cluster.name)):
        problem = name_problem(str(name))
        if problem:
            raise BadValue(f"{key}={name!r} {problem}")


def _check_choices(cfg: DictConfig) -> None:
    # precision, optimizer.name, cluster.device and the other words of suite.shared_names are checked as the config
    # composes (suite.config types them); the schedulers are launchers'
    if cfg.cluster.scheduler not in SCHEDULERS:
        raise BadValue(f"cluster.scheduler={cfg.cluster.scheduler} is not one of {', '.join(SCHEDULERS)}")
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


POSITIVE_HARDWARE = ("nodes", "cores_per_node", "cpu_memory_gb", "device_memory_gb", "fp64_tflops", "fp8_tflops",
                     "device_memory_bandwidth_gbs", "sm_count", "compute_capability", "boost_clock_mhz",
                     "nvlink_generation", "nvlink_bandwidth_gbs", "pcie_generation", "nics_per_node",
                     "nic_bandwidth_gbs", "intra_node_bandwidth_gbs", "inter_node_bandwidth_gbs")


def _hardware_problem(cluster: DictConfig, key: str, problem: str) -> BadValue:
    """`<file>: <key> <problem>` where a catalog or cluster file holds the value, else `cluster.hardware.<key> ...`
    (a command-line override)."""
    path = hardware_catalog.source(cluster.name, key, OmegaConf.select(cluster.hardware, key))
    return BadValue(f"{hardware_catalog.shown(path)}: {key} {problem}" if path else f"cluster.hardware.{key} {problem}")


def _check_hardware(cluster: DictConfig) -> None:
    """A cluster's datasheet: counts, capacities, bandwidths, clocks and peaks positive where given, latencies >= 0,
    and each catalog entry it lists (a GPU type, a NIC) giving what such an entry must."""
    hardware = cluster.hardware
    positive = {key: hardware[key] for key in POSITIVE_HARDWARE}
    positive.update({f"peak_tflops.{dtype}": peak for dtype, peak in (hardware.peak_tflops or {}).items()})
    for key, value in positive.items():
        if value is not None and value <= 0:
            raise _hardware_problem(cluster, key, f"must be positive, got {value}")
    for key in ("intra_node_latency_us", "inter_node_latency_us"):
        if hardware[key] is not None and hardware[key] < 0:
            raise _hardware_problem(cluster, key, f"must be >= 0, got {hardware[key]}")
    for group, path in hardware_catalog.entries(cluster.name).items():
        for key in hardware_catalog.REQUIRED[group]:
            if not hardware[key]:
                raise BadValue(f"{hardware_catalog.shown(path)}: {key} is required of a {group} catalog entry, "
                               f"got {hardware[key]}")


def _gpu_without_bf16(cluster: DictConfig) -> str | None:
    """The cluster's GPU if it is known to lack bfloat16: this machine's, or one named in its hardware."""
    here = first_gpu() if cluster.scheduler == "local" else None
    if here:
        return None if here.capability >= (8, 0) else here.name
    gpu = cluster.hardware.gpu or ""
    return gpu if any(name in gpu for name in NO_BF16_GPUS) else None


def _check_device(cfg: DictConfig, runs_here: bool) -> None:
    """The device a point will run on; the GPUs themselves only for points this machine runs."""
    uses_cuda = will_use_cuda(cfg.cluster)
    if cfg.precision == "fp16" and not uses_cuda:
        raise ConfigError("precision=fp16 needs a GPU (loss scaling); use bf16 on CPU")
    old_gpu = _gpu_without_bf16(cfg.cluster) if cfg.precision == "bf16" and uses_cuda else None
    if old_gpu:
        raise ConfigError(f"precision=bf16 needs a GPU with bfloat16 (compute capability 8.0+), not {old_gpu}; "
                          "use fp16")
    _check_attention(cfg, uses_cuda)
    if runs_here and not cfg.framework.get("runnable", False):
        raise ConfigError(f"{cfg.framework.names[0]}'s implementation is priced, not run: a sweep runs the suite's own "
                          "(make predict ARGS='framework=...' prices what another framework would run)")
    if cfg.cluster.scheduler != "local" or not runs_here:
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


def _check_attention(cfg: DictConfig, uses_cuda: bool) -> None:
    """network.attention where torch has the kernel: FlashAttention-2 in bf16/fp16 on compute capability 8.0+ (and
    on CPU), the memory-efficient kernel on CUDA only."""
    attention = cfg.network.attention
    if attention == AttentionKernel.efficient and not uses_cuda:
        raise ConfigError("network.attention=efficient needs a GPU (torch's memory-efficient attention has no CPU "
                          "kernel); use auto, flash or math")
    if attention != AttentionKernel.flash or not uses_cuda:
        return
    _, capability = _gpu_capability(cfg)
    if not flash_runs(cfg.precision != "fp32", capability):
        lacking = "precision=fp32" if cfg.precision == "fp32" else f"compute capability {capability}"
        raise ConfigError("network.attention=flash needs bf16 or fp16 on a GPU of compute capability 8.0+ (torch's "
                          f"FlashAttention-2), not {lacking}; use auto, efficient or math")


def _gpu_capability(cfg: DictConfig) -> tuple[str, float | None]:
    """The GPU a GPU point runs on and its compute capability: this machine's first, where the local launcher runs
    the point; else its cluster's catalog entry's."""
    here = first_gpu() if cfg.cluster.scheduler == "local" else None
    if here:
        return here.name, here.capability[0] + here.capability[1] / 10
    return cfg.cluster.hardware.gpu, cfg.cluster.hardware.compute_capability


@functools.lru_cache(maxsize=1024)
def _strategy(knobs: str) -> Strategy:
    """The strategy of these knobs (a JSON object), built once for a grid's points that share them: it is frozen."""
    return build_strategy(OmegaConf.create({"strategy": json.loads(knobs)}))


def validate(cfg: DictConfig, torch_version: str, runs_here: bool = True,
             tree: dict | None = None) -> tuple[Strategy, Layout]:
    """Raise ConfigError for a point that cannot run on a torch of `torch_version` (on this machine, where a local
    launcher would run it and `runs_here`); return its strategy and layout. `tree`: the config as a resolved
    container, where the caller has it."""
    tree = OmegaConf.to_container(cfg, resolve=True) if tree is None else tree
    _check_ranges(cfg, tree)
    _check_names(cfg)
    _check_choices(cfg)
    _check_hardware(cfg.cluster)
    _check_device(cfg, runs_here)
    check_dataset(cfg.dataset)
    check_network(cfg.network, cfg.dataset)
    strategy = _strategy(json.dumps(tree["strategy"], sort_keys=True))
    too_old = older_torch(strategy, torch_version)
    if too_old:
        raise OlderTorch(too_old)
    strategy.check(cfg)
    _check_knobs(cfg, strategy, torch_version)
    layout = strategy.layout(cfg)
    _check_batches(cfg, layout)
    _check_placement(cfg)
    return strategy, layout


def _check_fp8(cfg: DictConfig, strategy: Strategy) -> None:
    """fp8 linear layers: under bf16 mixed precision, by a strategy that trains the converted model, on a GPU with
    fp8 tensor cores (compute capability 8.9: Ada, Hopper and later), priced from its fp8 peak."""
    if cfg.precision != PrecisionName.bf16:
        raise ConfigError(f"fp8={cfg.fp8} trains the linear layers in fp8 and the rest in bf16, as torchtitan's float8 "
                          f"converter does: set precision=bf16 (not {cfg.precision})")
    if not strategy.supports.fp8:
        raise ConfigError(f"strategy {strategy.name} does not train fp8 linear layers (fp8={cfg.fp8}); "
                          f"{_supporting('fp8')} do")
    if not will_use_cuda(cfg.cluster):
        raise ConfigError(f"fp8={cfg.fp8} needs a GPU with fp8 tensor cores (compute capability 8.9 or more: Ada, "
                          f"Hopper and later); cluster {cfg.cluster.name} computes on CPU")
    gpu, capability = _gpu_capability(cfg)
    if capability is not None and capability < FP8_CAPABILITY:
        raise ConfigError(f"fp8={cfg.fp8} needs a GPU with fp8 tensor cores (compute capability 8.9 or more), not "
                          f"{gpu} ({capability})")


def _check_compile(cfg: DictConfig, strategy: Strategy) -> None:
    """torch.compile of a decoder's blocks, by a strategy that runs the model's own blocks."""
    if cfg.network.arch not in DECODERS:
        raise ConfigError(f"compile=true compiles a decoder's blocks, as torchtitan does; network {cfg.network.name} "
                          f"({cfg.network.arch}) has none")
    if not strategy.supports.compile:
        raise ConfigError(f"strategy {strategy.name} does not run compiled blocks (compile=true); "
                          f"{_supporting('compile')} do")


def _supporting(knob: str) -> str:
    """The strategies whose `supports` has `knob`, as a sentence's list."""
    return ", ".join(name for name in strategy_names() if getattr(strategy_class(name).supports, knob))


def _check_operator_policy(cfg: DictConfig, strategy: Strategy, torch_version: str) -> None:
    """`selective_op` checkpoints a decoder's blocks under torch.utils.checkpoint's selective policy."""
    if cfg.network.arch not in DECODERS:
        raise ConfigError(f"activation_checkpointing=selective_op checkpoints a decoder's blocks; network "
                          f"{cfg.network.name} has none (use every or a block interval k)")
    if not strategy.supports.operator_policy:
        raise ConfigError(f"strategy {strategy.name} checkpoints with its library's own function, which runs no "
                          f"operator policy: activation_checkpointing=selective_op needs torch.utils.checkpoint "
                          f"(use every, a block interval k or selective)")
    if Version(torch_version).release < Version(OPERATOR_POLICY_TORCH).release:
        raise OlderTorch(f"activation_checkpointing=selective_op needs torch >= {OPERATOR_POLICY_TORCH} "
                         f"(torch.utils.checkpoint's selective policy), this environment has torch {torch_version}")


def _check_knobs(cfg: DictConfig, strategy: Strategy, torch_version: str) -> None:
    """The cross-strategy knobs (precision, optimizer, activation checkpointing, gradient accumulation, gradient
    compression) fit the strategy (and the torch of `torch_version` its ranks run on)."""
    supports = strategy.supports
    if cfg.precision not in supports.precisions:
        raise ConfigError(f"strategy {strategy.name} does not train in precision={cfg.precision} "
                          f"(use {', '.join(supports.precisions)})")
    if cfg.optimizer.name not in supports.optimizers:
        use = f"use {', '.join(supports.optimizers)}"
        if cfg.optimizer.name == OptimizerConfig.name:  # perhaps not chosen at all: say how to choose
            use = f"the default; set optimizer.name={' or '.join(supports.optimizers)} and an optimizer.lr for it"
        raise ConfigError(f"strategy {strategy.name} does not train with optimizer.name={cfg.optimizer.name} ({use})")
    if recomputes(cfg.activation_checkpointing) and not supports.activation_checkpointing:
        raise ConfigError(f"strategy {strategy.name} does not apply activation_checkpointing="
                          f"{cfg.activation_checkpointing}; leave it none")
    if cfg.activation_checkpointing == SELECTIVE and cfg.network.arch not in DECODERS:
        raise ConfigError(f"activation_checkpointing=selective recomputes a decoder's attention cores; network "
                          f"{cfg.network.name} has none (use every or a block interval k)")
    if cfg.activation_checkpointing == SELECTIVE_OP:
        _check_operator_policy(cfg, strategy, torch_version)
    if cfg.grad_accum > 1 and not supports.grad_accum:
        hint = strategy.accumulation_hint or f"leave it 1 ({_supporting('grad_accum')} accumulate)"
        raise ConfigError(f"strategy {strategy.name} does not accumulate gradients (grad_accum={cfg.grad_accum}); "
                          f"{hint}")
    if cfg.fp8 != Float8Recipe.none:
        _check_fp8(cfg, strategy)
    if cfg.compile:
        _check_compile(cfg, strategy)
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
