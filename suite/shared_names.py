"""The suite's shared names, defined once: point statuses, the values of the cross-strategy choices, and the
metric names of the MLflow contract (docs/mlflow.md). Each choice is a `StrEnum`, so a member
compares equal to the string a config or a tag holds, and a misspelt member is an AttributeError."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """How a point ended (the `suite.status` tag)."""

    finished = "finished"
    oom = "oom"
    timeout = "timeout"
    failed = "failed"
    invalid = "invalid"
    diverged = "diverged"  # the training loss became non-finite (or fp16's loss scaling skipped every step)


class PrecisionName(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


HALF_PRECISIONS = (PrecisionName.bf16, PrecisionName.fp16)  # 2 bytes a value where the point computes in them


class Float8Recipe(StrEnum):
    """fp8 linear layers (`fp8=`): torchao's float8 training recipes, as torchtitan's float8 converter applies them
    under bf16 mixed precision (torchao.float8.Float8LinearRecipeName)."""

    none = "none"  # every linear layer in the point's precision
    tensorwise = "tensorwise"  # one dynamic scale per tensor (cuBLAS's fp8 GEMM): torchao's default, the fastest
    rowwise = "rowwise"  # one scale per row (CUTLASS's rowwise kernel), powers of two: more accurate


class AttentionKernel(StrEnum):
    """Which of torch's `scaled_dot_product_attention` kernels GPT-2 runs (torch.nn.attention.SDPBackend)."""

    auto = "auto"  # torch's choice: FlashAttention-2 where it can run (bf16/fp16, compute capability 8.0+), else
    # the memory-efficient kernel on a GPU, the CPU's flash kernel on CPU; on Hopper and later from torch 2.11 cuDNN's
    flash = "flash"  # FlashAttention-2 (a CPU implementation on CPU)
    efficient = "efficient"  # the memory-efficient kernel (xformers'), any CUDA GPU and dtype
    math = "math"  # two batched GEMMs around a materialised, masked softmax: attention before fused kernels


class OptimizerName(StrEnum):
    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"
    lamb = "lamb"


# Updates that are right on any shard of a parameter: LAMB's trust ratio needs the norm of the whole parameter
# (pytorch-optimizer's LAMB does not take it across DTensor shards).
ELEMENTWISE_OPTIMIZERS = (OptimizerName.sgd, OptimizerName.adam, OptimizerName.adamw)


class Family(StrEnum):
    """How a strategy divides a step, which is how the performance model prices it and what memory a rank keeps
    (suite.predict.step, suite.predict.memory): each strategy declares its own (`Strategy.family`)."""

    replicated = "replicated"  # every rank the whole model, gradients reduced (single, DDP, Horovod)
    sharded = "sharded"  # parameters, gradients and optimizer states split over the ranks (ZeRO, FSDP)
    tensor_parallel = "tensor_parallel"  # each layer's matrices split (Megatron)
    flushed_pipeline = "flushed_pipeline"  # stages, micro-batches, a flush every step (GPipe, 1F1B)
    async_pipeline = "async_pipeline"  # stages, no flush, weight stashing (PipeDream)


class GradCompression(StrEnum):
    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"
    powersgd = "powersgd"


class FaultKind(StrEnum):
    error = "error"
    oom = "oom"
    hang = "hang"
    exit = "exit"
    kill = "kill"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class MathDtype(StrEnum):
    """What a device's matrix units compute in, the key of a peak (`cluster.hardware.peak_tflops`, a calibration):
    a precision, or tf32 (fp32 tensors multiplied on tensor cores)."""

    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"


class PeakSource(StrEnum):
    """Where the peak that MFU divides by comes from (the `suite.peak_source` tag)."""

    calibration = "calibration"  # the dense matmul rate `make calibrate` measured (results/calibration/<cluster>.yaml)
    vendor = "vendor"  # the cluster config's `hardware.peak_tflops`, from the vendor's datasheet


class Collective(StrEnum):
    """The collectives `make calibrate` times."""

    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    broadcast = "broadcast"


# Per epoch (step = epoch number).
EPOCH_METRICS = ("epoch_time_s", "throughput_samples_s", "train_loss", "val_loss", "val_accuracy",
                 "val_perplexity", "train_time_s")
# What each rank holds, in MiB (largest over ranks, and per rank as <name>_rank<i>).
MEMORY_SPLIT = ("mem_params_mb", "mem_grads_mb", "mem_optim_mb", "mem_master_mb")
# On a GPU, beside `peak_memory_mb` (the larger of the last two): the CUDA caching allocator's peaks, and what NVML
# sees the rank's process hold at the end (the allocator's cache, the CUDA context, NCCL's buffers; the GPU's used
# memory where NVML cannot tell the process's own and the process is alone on the GPU: suite.runtime.metrics).
DEVICE_MEMORY = ("peak_cuda_allocated_mb", "peak_cuda_reserved_mb", "nvml_used_mb")
# FLOPs and utilisation (suite.runtime.metrics): `model_tflop_per_step` and `hardware_tflop_per_step` are the
# TFLOP of one global step (every replica; forward and backward, without and with recomputation);
# `achieved_tflops` is the model TFLOP/s of one device; `peak_tflops` that device's dense matmul peak for the
# point's math dtype; `mfu` and `hfu` their ratios (model and hardware FLOPs). No peak, no `peak_tflops`, `mfu`
# or `hfu`: the `suite.mfu_missing` tag says why.
UTILISATION_METRICS = ("model_tflop_per_step", "hardware_tflop_per_step", "achieved_tflops", "peak_tflops", "mfu",
                       "hfu")
# Mean per traced step, from each rank's profiler trace (suite.runtime.trace_breakdown): largest over ranks, and per
# rank as <name>_rank<i>.
TRACE_BREAKDOWN = ("time_comm_s", "time_comm_exposed_s", "time_compute_s", "time_idle_s", "comm_fraction")
# The performance model's prediction for the point, made before it ran (suite.predict), beside what it measured, and
# what its compute was priced from (a metric of 1): a GPU's datasheet, the cluster's calibration, a profile.
PRICED_FROM = ("datasheet", "calibrated", "profiled")
PREDICTED = ("predicted_epoch_time_s", "predicted_peak_memory_mb", "predicted_fits",
             *(f"predicted_from_{source}" for source in PRICED_FROM))
# Mean per step of the trainer's phases, timed one after the other (the communication done in a phase inside it).
PHASE_TIMES = ("time_data_s", "time_forward_s", "time_backward_s", "time_optimizer_s")
# Once per run; a summary entry not named here (nor a strategy metric) is an error when the run is recorded.
SUMMARY_METRICS = ("epoch_time_s_mean", "throughput_samples_s_mean", "peak_memory_mb", "time_to_target_s",
                   "epochs_to_target", *PHASE_TIMES, "samples_per_epoch", "train_set_samples", "steps_per_epoch",
                   *MEMORY_SPLIT, *DEVICE_MEMORY, "comm_mb_per_step", *UTILISATION_METRICS, *TRACE_BREAKDOWN,
                   "fp16_skipped_steps", *PREDICTED)
# Summary entries that are not single numbers: recorded in their own form (see suite.records.store); `run_tags`
# are tags the ranks add (where the peak came from, or why there is no MFU); `run_params` the settings the ranks
# ran with beyond the config (library defaults resolved, implementations chosen, environment), recorded as params
# `effective.<name>`.
SUMMARY_DETAILS = ("memory_by_rank", "breakdown_by_rank", "strategy_metrics", "step_losses", "run_tags", "run_params")
EFFECTIVE_PREFIX = "effective."

# `strategy.pp=auto`: PipeDream's planner chooses these when the point is planned; they are not its identity.
AUTO, AUTO_CHOOSES = "auto", ("strategy.replicas", "strategy.balance")
