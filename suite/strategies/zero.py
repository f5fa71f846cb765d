"""DeepSpeed ZeRO stages 1-3, optionally offloading optimizer states (and, at stage 3, parameters) to the host.

DeepSpeed builds the optimizer from its JSON config; the engine it returns is both the model and,
through `engine.optimizer`, the optimizer the training loop sees. Adam and AdamW are torch's own
implementations (`torch_adam`), so a ZeRO point does the same arithmetic as `single` with the same
optimizer; DeepSpeed's fused or CPU Adam can be chosen with `ds_config: {optimizer: {params: {torch_adam: false}}}`.

ZeRO's communication runs as DeepSpeed recommends (`zero_optimization`, below): gradients reduced in buckets while
backward runs (`overlap_comm`, DeepSpeed's ZeRO-2 tutorial config) and buckets sized to the network as Hugging Face's
DeepSpeed integration sizes them ("auto"), not DeepSpeed's 5e8-element defaults, which no network here fills.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from suite.errors import BadValue, ConfigError
from suite.layout import Layout
from suite.models import build_model
from suite.runtime.metrics import tensor_mb
from suite.runtime.model_transforms import recomputed_under_forward_autocast, recomputes
from suite.runtime.numerics import optimizer_implementation
from suite.shared_names import Family
from suite.strategies.base import DataParallel, Library, RankContext, Sharding, Strategy, Supports, optimizer_state

DS_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}
# DeepSpeed's defaults (in elements) where the generated ds_config has no value (a network without a linear layer)
DEEPSPEED_ZERO_DEFAULTS = {"reduce_bucket_size": 5e8, "reduce_scatter": True, "stage3_param_persistence_threshold": 1e5,
                           "stage3_max_reuse_distance": 1e9}
CONFIG_FILE = "ds_config.json"
# What the engine resolved for these `zero_optimization` keys of the ds_config (DeepSpeed's defaults where the config
# is silent), recorded with the run as params `effective.deepspeed.zero_optimization.<key>`: ds_config key -> the
# field of DeepSpeed's DeepSpeedZeroConfig that holds it.
RESOLVED_ZERO_KEYS = {
    "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "reduce_scatter": "reduce_scatter",
    "reduce_bucket_size": "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce": "use_multi_rank_bucket_allreduce",  # stages 1 and 2
    "allgather_bucket_size": "allgather_bucket_size",  # stages 1 and 2 (and unused there, see `tuned_buckets`)
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
}


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, nested mappings key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def autocast_section(precision: str) -> dict[str, Any]:
    """Mixed precision as every other strategy runs it, torch AMP: fp32 parameters, the forward under autocast, and
    for fp16 a loss scaler (DeepSpeed's own GradScaler in this mode). DeepSpeed's `fp16`/`bf16` sections would
    instead cast the parameters to half and switch the caller's CUDA autocast off inside the engine: image inputs
    then meet half weights, BatchNorm half weights meet fp32 statistics, and LayerNorm and softmax run in half.
    No module is named lower-precision-safe, so gradients are reduced in fp32, as DDP and FSDP reduce them."""
    if precision == "fp32":
        return {}
    dtype = "bfloat16" if precision == "bf16" else "float16"
    return {"torch_autocast": {"enabled": True, "dtype": dtype, "lower_precision_safe_modules": []}}


def hidden_size(model: nn.Module) -> int | None:
    """The width the network's output layer reads, which is what Hugging Face's DeepSpeed integration calls the
    hidden size: GPT-2's n_embd (HF's `config.hidden_size`); a CNN's pooled features (HF's ResNets: the last and
    largest of `config.hidden_sizes`, whose maximum it takes: 512 for ResNet-18, 2048 for ResNet-50 and -152; 1280 for
    MobileNetV2; 4096 for VGG-16's classifier). None for a network without a linear layer."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return linears[-1].in_features if linears else None


def tuned_buckets(model: nn.Module, stage: int) -> dict[str, int]:
    """ZeRO's bucket sizes (in elements) for `model`, as Hugging Face's DeepSpeed integration fills its "auto" values
    (transformers, integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_finalize): with h the hidden
    size, reduce_bucket_size = h^2 and, at stage 3, stage3_prefetch_bucket_size = 0.9 h^2 and
    stage3_param_persistence_threshold = 10 h.

    Why not DeepSpeed's defaults: a gradient bucket is reduced when the next gradient would overflow it
    (stage_1_and_2.py `reduce_independent_p_g_buckets_and_remove_grads`, stage3.py likewise), so with the default
    5e8 elements, more than GPT-2 medium's 355 M parameters, no bucket ever fills and the whole reduction waits for
    the end of backward, exposed even with overlap_comm; each rank also allocates that bucket (two with overlap_comm),
    1.9 GiB each in fp32. h^2 is about a twelfth of a transformer block (12 h^2 parameters), so a block's gradients
    go out in about 12 reductions while backward runs on through the blocks below; a gradient larger than the bucket
    (GPT-2's tied embedding) is reduced on its own. The size is HF's, not DDP's 25 MiB: 1 M elements (4 MiB in fp32)
    for GPT-2 medium, 0.6 M for GPT-2 small, 4.2 M for ResNet-50, 16.8 M for VGG-16 (its ImageNet classifier).

    allgather_bucket_size is left at DeepSpeed's 5e8 (its ZeRO-2 tutorial's value): DeepSpeed 0.19.8 reads it only
    where torch.distributed lacks all_gather_into_tensor (runtime/utils.py `all_gather_dp_groups`); with every torch
    the suite runs on, stages 1 and 2 gather each parameter group's updated partitions in one all_gather_into_tensor,
    whatever its value, and stage 3 never reads it (its gathers follow stage3_prefetch_bucket_size)."""
    h = hidden_size(model)
    if h is None:
        return {}
    sizes = {"reduce_bucket_size": h * h}
    if stage == 3:
        sizes |= {"stage3_prefetch_bucket_size": int(0.9 * h * h), "stage3_param_persistence_threshold": 10 * h}
    return sizes


def meta_model(cfg) -> nn.Module:
    """The point's network on the meta device: its shapes, no memory and no numbers (nor random draws)."""
    with torch.device("meta"):
        return build_model(cfg.network, cfg.dataset)


def precision_implementation(engine, zero) -> str:
    """How the engine runs the point's precision: torch autocast inside the engine (`torch_autocast`, the suite's
    choice, with DeepSpeed's own torch GradScaler for fp16), or DeepSpeed's half-precision parameters (`fp16`/`bf16`
    sections, which a user's ds_config may enable)."""
    if engine.fp16_enabled():
        return "DeepSpeed fp16 (half parameters, DeepSpeed loss scaler)"
    if engine.bfloat16_enabled():
        return "DeepSpeed bf16 (half parameters)"
    if engine.torch_autocast_enabled():
        dtype = str(engine.torch_autocast_dtype()).removeprefix("torch.")
        scaler = " + DeepSpeed's GradScaler" if getattr(zero, "torch_autocast_gradscaler", None) else ""
        return f"DeepSpeed torch_autocast ({dtype}){scaler}"
    return "fp32"


class ZeroEngine(DataParallel):
    """The shared step with DeepSpeed's engine doing backward (loss scaling, gradient reduction or
    reduce-scatter into its partitions) and the step (skipped on overflow); `precision` only autocasts, and
    DeepSpeed autocasts again inside the engine (its `torch_autocast` section)."""

    @contextlib.contextmanager
    def gradient_sync(self, last: bool) -> Iterator[None]:
        """DeepSpeed counts micro-batches in its engine's step(): called after each but the last, it only counts,
        and backward reduces (stage 1) or reduces into the partitions every micro-batch (stages 2, 3) as the count
        says (`gradient_accumulation_steps`)."""
        yield
        if not last:
            self.model.step()

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss, scale_wrt_gas=False)  # the loss comes scaled by 1/micro-batches

    def step(self) -> None:
        self.model.step()
        zero = self.optimizer
        if zero.overflow:
            # inf/NaN in the reduced gradients' norm, agreed over the ranks: the engine skipped the step (and counted
            # it) without telling its torch GradScaler (fp16), whose scale then never backs off, and every later step
            # overflows at the same scale (DeepSpeed 0.19.8, ZeRO with torch_autocast).
            scaler = zero.torch_autocast_gradscaler
            if scaler is not None:
                scaler.update(scaler.get_scale() * scaler.get_backoff_factor())

    def skipped_steps(self) -> int:
        return self.model.skipped_steps

    def effective_settings(self) -> dict[str, Any]:
        """DeepSpeed's resolved `zero_optimization` (its defaults included), how it runs the precision, and the
        optimizer it steps: ZeRO's wrapper around a torch (or DeepSpeed) optimizer over its flat fp32 partitions,
        whose kernel is `optimizer.implementation`, and the dtypes its gradient buckets are reduced in."""
        engine, zero = self.model, self.optimizer
        inner = zero.optimizer
        resolved = engine._config.zero_config
        reduced_in = sorted(str(dtype).removeprefix("torch.") for dtype in getattr(zero, "ipg_buckets", {}))
        return {**super().effective_settings(),
                "optimizer.implementation": optimizer_implementation(inner),
                "deepspeed.optimizer": f"{type(zero).__name__} over {type(inner).__module__}.{type(inner).__name__}",
                "precision.implementation": precision_implementation(engine, zero),
                "deepspeed.gradient_reduction_dtype": ",".join(reduced_in) or str(
                    engine.communication_data_type).removeprefix("torch."),
                **{f"deepspeed.zero_optimization.{key}": getattr(resolved, field)
                   for key, field in RESOLVED_ZERO_KEYS.items()}}

    def held_parameters(self) -> list[torch.Tensor]:
        """Stage 3 keeps each parameter's partition in `ds_tensor` (the parameter itself is an empty placeholder).
        ZeRO's fp32 master partitions (the parameters its optimizer steps) are counted in neither figure."""
        return [getattr(p, "ds_tensor", p) for p in self.plain.parameters()]

    def held_gradients(self) -> None:
        """Not measured: DeepSpeed keeps gradients in its own flat buffers, whose lifetime differs per stage."""
        return None

    def held_optimizer_state(self) -> list[torch.Tensor]:
        return optimizer_state(self.optimizer.optimizer)  # the torch optimizer inside ZeRO's wrapper

    def memory_split(self) -> dict[str, float]:
        """Adds this rank's partition of ZeRO's fp32 master parameters, which its optimizer steps and copies
        back into the model's parameters (a copy even when those are fp32)."""
        masters = (getattr(self.optimizer, "single_partition_of_fp32_groups", None)  # stages 1 and 2
                   or self.optimizer.fp32_partitioned_groups_flat)  # stage 3
        return {**super().memory_split(), "mem_master_mb": tensor_mb(list(masters))}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Stage 3 gathers each partitioned parameter on every rank while the state dict is copied."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.plain.parameters())):
            return super().full_state_dict()


@dataclass(frozen=True)
class Zero(Strategy):
    name: str = "zero"
    family: ClassVar[Family] = Family.sharded
    label: ClassVar[str] = "ZeRO"
    base_memory_of: ClassVar[str] = "zero"  # its library's rank, not DDP's
    # Optimizers: those the generated ds_config names. ZeRO steps flat partitions that cut across parameters: no LAMB.
    supports: ClassVar[Supports] = Supports(counts_communication=True, optimizers=tuple(DS_OPTIMIZERS),
                                            grad_accum=True, operator_policy=False)
    requires: ClassVar[tuple[Library, ...]] = (Library("DeepSpeed", "deepspeed", "setup"),)
    # What the pinned DeepSpeed (0.19.8) calls: torch.autograd.graph._get_grad_fn_or_grad_acc in every backward (torch
    # 2.3; on 2.1 every stage fails there), and at stage 3 torch.get_autocast_dtype (torch 2.4; on 2.3.1 stages 1
    # and 2 train as `single` does, stage 3 fails).
    needs_torch: ClassVar[str] = "2.4"
    zero_stage: int = 1
    offload: Literal["none", "cpu", "params"] = "none"
    ds_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[f"strategy.zero_stage={stage}"] for stage in (1, 2, 3)]

    @classmethod
    def probes(cls) -> dict[str, list[str]]:
        return {cls.name: ["strategy.zero_stage=1"], "zero3": ["strategy.zero_stage=3"]}

    @property
    def overhead_key(self) -> str:
        """ZeRO-3 apart from stages 1-2, whose overhead it does not share (its parameter gathers hook every module:
        3-5x stages 1-2's per-step overhead on model_bench)."""
        return "zero3" if self.zero_stage == 3 else self.name

    def sharding(self, cfg) -> Sharding:
        """As DeepSpeed runs the point: the generated ds_config's `zero_optimization` (buckets sized to the network,
        the user's `ds_config` over them) over DeepSpeed's defaults (overlap_comm: on at stage 3 only). Stage 3 keeps
        a layer under `stage3_param_persistence_threshold` gathered, and gathers the rest again for backward (the root
        unit with the first) unless the network is under `stage3_max_reuse_distance` parameters."""
        zero = self.generated_config(cfg)["zero_optimization"]
        zero = {**DEEPSPEED_ZERO_DEFAULTS, "overlap_comm": zero["stage"] == 3, **zero}
        return Sharding(self.zero_stage, master_copy=True, regathers_root=True,
                        persistence_elements=zero["stage3_param_persistence_threshold"],
                        max_reuse_elements=zero["stage3_max_reuse_distance"],
                        bucket_elements=zero["reduce_bucket_size"], overlap_comm=zero["overlap_comm"],
                        reduce_scatter=zero["reduce_scatter"])

    def check(self, cfg) -> None:
        if self.zero_stage not in (1, 2, 3):
            raise BadValue(f"strategy zero: zero_stage must be 1, 2 or 3, got {self.zero_stage}")
        if self.offload == "params" and self.zero_stage != 3:
            raise ConfigError(f"strategy zero: offload=params needs zero_stage=3 (got {self.zero_stage}); "
                              "stages 1 and 2 keep parameters on every rank")
        for key, value in self.batch_config(cfg).items():  # DeepSpeed would refuse the contradiction only in the ranks
            if self.ds_config.get(key, value) != value:
                raise ConfigError(f"strategy zero: ds_config.{key}={self.ds_config[key]} contradicts the point's "
                                  f"{value}: the batch is set by batch_size, workers and grad_accum")

    def batch_config(self, cfg) -> dict[str, int]:
        """The ds_config's batch keys, which the point's batch_size, workers and grad_accum set."""
        return {"train_batch_size": self.layout(cfg).global_batch, "train_micro_batch_size_per_gpu": cfg.batch_size,
                "gradient_accumulation_steps": cfg.grad_accum}

    def generated_config(self, cfg, model: nn.Module | None = None) -> dict[str, Any]:
        """DeepSpeed's JSON config for this point (before launch, and again in each rank), its buckets sized to
        `model`, the point's network (built on the meta device where not given)."""
        opt = cfg.optimizer
        # DeepSpeed's ZeRO-2 tutorial config (docs/_tutorials/zero.md) turns overlap_comm on, which DeepSpeed 0.19.8
        # leaves off for stages 1 and 2 (zero/config.py `overlap_comm_valid`): without it stage 1 reduces every
        # gradient after backward, stage 2 reduces its buckets on the compute stream; with it they are reduced on a
        # stream of their own while backward goes on. contiguous_gradients and reduce_scatter as the tutorial has
        # them (DeepSpeed's defaults); bucket sizes as Hugging Face's "auto" (`tuned_buckets`).
        zero: dict[str, Any] = {"stage": self.zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                                "reduce_scatter": True,
                                **tuned_buckets(meta_model(cfg) if model is None else model, self.zero_stage)}
        if self.offload != "none":
            zero["offload_optimizer"] = {"device": "cpu"}
        if self.offload == "params":
            zero["offload_param"] = {"device": "cpu"}
        generated = {
            **self.batch_config(cfg),
            "gradient_clipping": 0.0,  # DeepSpeed's default clips at norm 1.0; the other strategies do not clip
            "optimizer": {"type": DS_OPTIMIZERS[opt.name],
                          "params": {"lr": opt.lr, "eps": opt.eps, "weight_decay": opt.weight_decay, "torch_adam": True,
                                     "adam_w_mode": opt.name == "adamw"}},
            **autocast_section(cfg.precision),
            "zero_optimization": zero,
            "zero_force_ds_cpu_optimizer": False,  # offload with torch's Adam needs no compiled CPU Adam
            "steps_per_print": 2**31 - 1,  # the training loop logs progress
        }
        return merged(generated, self.ds_config)

    def config_files(self, cfg) -> dict[str, dict[str, Any]]:
        return {CONFIG_FILE: self.generated_config(cfg)}

    def layout(self, cfg) -> Layout:
        return replace(super().layout(cfg), shard=cfg.workers)

    def setup(self, model: nn.Module, rank: RankContext) -> ZeroEngine:
        env = rank.env
        # DeepSpeed picks its accelerator once, at its first use: CUDA wherever one is visible, even for a point
        # that runs its ranks on the CPU (cluster.device=cpu on a GPU node), whose engine would then move the model
        # to a GPU while the batches and the process group stay on the host.
        os.environ["DS_ACCELERATOR"] = env.device.type
        import deepspeed

        # DeepSpeed asserts LOCAL_RANK (srun and jsrun do not set it) and takes it, here and there, for the number of
        # the rank's GPU: ranks sharing one (cluster.share_gpus) name theirs.
        os.environ["LOCAL_RANK"] = str(env.device.index if env.device.type == "cuda" else env.local_rank)
        if env.device.type == "cpu":
            # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (over a minute, once per machine)
            # that only its inference all-reduce uses; training communicates through the gloo process group.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        config = self.generated_config(rank.cfg, model)
        engine, _, _, _ = deepspeed.initialize(model=model.to(env.device), model_parameters=model.parameters(),
                                               config=config, dist_init_required=False)
        if recomputes(rank.cfg.activation_checkpointing):
            # Options such as cpu_checkpointing come from the ds_config's activation_checkpointing section.
            deepspeed.checkpointing.configure(None, deepspeed_config=config)
        return ZeroEngine(rank, engine, engine.optimizer, plain=engine.module)

    def checkpoint_fn(self) -> Callable:
        """DeepSpeed's activation checkpointing (configured in `setup`), recomputing under the forward's autocast."""
        import deepspeed

        return recomputed_under_forward_autocast(deepspeed.checkpointing.checkpoint)
