"""The analytical GPU compute model: a profile of a network on a GPU that is not here, priced from its datasheet.

What one training step of the network launches is counted on the meta device (suite.profiling.counted); each
kernel is priced by a roofline on the GPU of the point's cluster (`cluster.hardware`, conf/cluster/gpu/):

    seconds = max(FLOPs / (peak of its math dtype x GEMM_EFFICIENCY x wave efficiency),
                  bytes / (HBM bandwidth x MEMORY_EFFICIENCY, or ROW_REDUCTION_EFFICIENCY for norms and softmax),
                  KERNEL_FLOOR_S)

the roofline itself (Williams, Waterman and Patterson 2009, "Roofline: an insightful visual performance model for
multicore architectures", CACM 52(4)): a kernel is bound by its compute or by its memory traffic, whichever takes
longer, the other hidden under it. (Until December 2026 the two terms were added, a choice made by looking at seven
llm-foundry rows while their attention was priced at another kernel's rates; with the kernel they ran priced at
its own, the sum left every source too slow, and it was reverted to the roofline: docs/measurements.md, ablation.)

Fused attention on a GPU runs at the share of the peak its kernel's published benchmarks reach
(suite.predict.attention); with `network.attention=math` it is the GEMMs and softmax it decomposes into.
Matrix multiplies and convolutions (and a CPU's fused attention) run at the dense peak of the point's math dtype
(bf16 and fp16 on the tensor cores; fp32 on TF32 tensor cores where `math.tf32` asks for it, as torch does for
convolutions by default, else on the FP32 units; fp8 linear layers' GEMMs, `fp8=`, at the fp8 peak, reaching a
little less of it than bf16's reach of theirs: FP8_RELATIVE_SHARE), every other kernel at the memory bandwidth
(LayerNorm and softmax, which reduce each row before writing it, at the lower share ATen's kernels reach of it). A
GEMM's output is cut into 128 x 128 tiles, one per streaming multiprocessor at a time: a last wave that fills few of
them wastes the rest (wave quantisation), which is how small GEMMs fall below the peak; one with a dimension that is
not a multiple of 8 runs on cuBLAS's slow unaligned kernels (UNALIGNED_GEMM_SHARE of the rate). The optimizer step
streams every parameter's state once per operation of torch's foreach kernels (AdamW: 80 bytes per fp32
parameter; SGD with momentum 32). The constants are few, named below with where they come from; `make
validate-published` scores them against published GPU measurements.

The profile it returns is the measured profile's (suite.profiling.profiles), so every strategy's step and memory
model prices it unchanged; what a rank holds before its model is `GPU_RANK_BASE_BYTES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from omegaconf import OmegaConf

from suite.errors import ConfigError
from suite.predict.attention import AttentionKernelCost, attention_kernel
from suite.predict.links import matmul_tflops
from suite.profiling.counted import (
    ATTENTION,
    CONV,
    FP8_MATMUL,
    MEMORY,
    CountedNetwork,
    Kernel,
    count_network,
    framework_attention,
    half_activations,
)
from suite.profiling.profiles import LayerProfile, Profile
from suite.shared_names import Float8Recipe

# The constants are round figures, fitted to no published record: `make validate-published` scores them.
# Of the dense datasheet peak, what cuBLAS and cuDNN reach on large GEMMs and convolutions (NCCL, for comparison,
# prices NVLink at 80% of its datasheet rate: suite.predict.fabric).
GEMM_EFFICIENCY = 0.8
# Of the datasheet HBM bandwidth, what streaming kernels (elementwise, normalisation, optimizer) reach.
MEMORY_EFFICIENCY = 0.85
# Of the datasheet HBM bandwidth, what ATen's LayerNorm and softmax kernels reach, forward and backward
# (counted.ROW_REDUCTIONS): on an H200, 16M to 256M elements in bf16 and fp32, rows of 1024 and 4096, the median of 48
# runs is 0.46 (0.23-0.90; docs/measurements.md, "The model against the H200 lease's kernels"), where copies, adds and
# activations reach 0.71-0.86.
ROW_REDUCTION_EFFICIENCY = 0.46
# The least time one kernel takes in eager PyTorch: the host's dispatch and launch of a kernel, which a GPU
# finishing tiny kernels faster waits on. 5 us: the order of a CUDA launch plus PyTorch's dispatcher.
KERNEL_FLOOR_S = 5e-6
# Of an aligned GEMM's rate, what one with a dimension not a multiple of 8 (counted.ALIGNMENT) reaches on the tensor
# cores: on an H200, GPT-2 medium's head over the 50257-token vocabulary at batch 8 x 1024 tokens in bf16 ran its
# three GEMMs at 95, 139 and 147 TFLOP/s where aligned ones reach about 790 (0.12 to 0.19; docs/measurements.md, "The
# H200 machine"): padding the vocabulary to 50304 took the step from 82.6 to 65.1 ms.
UNALIGNED_GEMM_SHARE = 0.15
# Of an fp8 GEMM's peak, the share it reaches relative to the share a bf16 GEMM of the same shape reaches of its own
# (GEMM_EFFICIENCY, or the calibrated rate): fp8's measured speedup over bf16 divided by their peaks' ratio, 2 on
# Hopper. On the H200 lease, torch._scaled_mm against torch.mm at six shapes from 4096 cubed to 16384 x 128256 x 4096
# (docs/measurements/h200-2026-11-28/micro.json, `fp8_gemms` against `gemms`; docs/measurements.md): median speedups
# 1.81 with one scale a tensor (cuBLAS's kernel; 1.31-2.11) and 1.75 with a scale a row (CUTLASS's; 1.29-1.82).
FP8_RELATIVE_SHARE = {Float8Recipe.tensorwise: 0.906, Float8Recipe.rowwise: 0.873}
TILE = 128  # rows and columns of a GEMM output tile of one SM (cuBLAS's common 128 x 128 tiles)
# What a GPU rank holds before its model: the CUDA context and torch's kernels (lazily loaded), NCCL's
# communicator buffers, the caching allocator's first blocks. 1 GiB, to be replaced by `make calibrate`'s
# measured base on a GPU of the cluster.
GPU_RANK_BASE_BYTES = 2**30
# Bytes per fp32 parameter that the optimizer step streams on a GPU: torch's foreach (multi-tensor) kernels, which
# every strategy steps with there (ZeRO's flat partitions too), one pass over the state per operation
# (torch/optim/adam.py, _multi_tensor_adam): m lerped toward g (12: read m, g; write m), v scaled (8), g*g added
# to v (12), sqrt(v) into a temporary (8), divided by the bias correction (8), eps added (8), p moved by m over it
# (16: read p, m, it; write p): 72. AdamW's decay scales p (8); Adam's adds p to the gradient (12). On an H200
# GPT-2 medium's AdamW step took 7.8 ms, these 80 bytes at the HBM rate give 7.0 (one fused pass, 28 bytes: 2.4).
ADAM_BYTES = 72
ADAM_DECAY_BYTES = {"adam": 12, "adamw": 8}
LAMB_BYTES = 28  # pytorch_optimizer's Lamb: one pass counted (read p, g, m, v; write p, m, v)
# torch's foreach SGD (_multi_tensor_sgd): buf scaled by the momentum (8), g added to it (12), p moved by it (12);
# without momentum p moved by g (12); weight decay adds p to the gradient first (12).
SGD_BYTES = {True: 32, False: 12}
SGD_DECAY_BYTES = 12


@dataclass(frozen=True)
class Gpu:
    name: str
    matmul_tflops: float  # what a large GEMM of the point's math dtype reaches
    conv_tflops: float  # what its convolutions reach (TF32 by default in torch where fp32)
    bandwidth_gbs: float  # what streaming kernels reach
    sm_count: int
    priced_from: str
    tensor_core_matmuls: bool = True  # bf16, fp16 or TF32; FP32 units load one element at a time anyway
    attention: AttentionKernelCost | None = None  # the fused attention kernel's published share of the peak
    attention_peak_tflops: float = 0.0  # the datasheet peak that share is of (the dtype attention runs in)
    fp8_tflops: float = 0.0  # what a large GEMM of fp8 operands reaches (`fp8=`); 0: none is priced
    row_reduction_bandwidth_gbs: float = 0.0  # what normalisation and softmax kernels reach; 0: bandwidth_gbs

    def seconds(self, kernel: Kernel) -> float:
        bandwidth = (self.row_reduction_bandwidth_gbs or self.bandwidth_gbs) if kernel.row_reduction else \
            self.bandwidth_gbs
        memory = kernel.bytes / (bandwidth * 1e9)
        if kernel.kind == ATTENTION and self.attention is not None:
            compute = kernel.flops / (self.attention_peak_tflops * 1e12 * self.attention.share(kernel))
        elif kernel.kind != MEMORY and kernel.flops:
            rate = {CONV: self.conv_tflops, FP8_MATMUL: self.fp8_tflops}.get(kernel.kind, self.matmul_tflops)
            if not kernel.aligned and self.tensor_core_matmuls:
                rate *= UNALIGNED_GEMM_SHARE
            compute = kernel.flops / (rate * 1e12 * self.waves(kernel))
        else:
            compute = 0.0
        return max(compute, memory, KERNEL_FLOOR_S)

    def waves(self, kernel: Kernel) -> float:
        """Share of the SMs the kernel's tiles keep busy, over all its waves."""
        tiles = math.ceil(max(kernel.rows, 1) / TILE) * math.ceil(max(kernel.cols, 1) / TILE)
        return tiles / (math.ceil(tiles / self.sm_count) * self.sm_count)


MATH_DTYPE = {"bf16": "bf16", "fp16": "fp16"}


def gpu_of(cfg) -> Gpu:
    """The point's GPU from its cluster's catalog entry; a ConfigError naming the keys to fill where it lacks one."""
    hw = cfg.cluster.hardware
    peaks = dict(hw.peak_tflops or {})
    needed = [("peak_tflops", peaks), ("device_memory_bandwidth_gbs", hw.device_memory_bandwidth_gbs),
              ("sm_count", hw.sm_count)]
    if hw.gpu:  # which attention kernels it runs
        needed.append(("compute_capability", hw.compute_capability))
    missing = [key for key, value in needed if not value]
    if missing:
        raise ConfigError(f"cluster {cfg.cluster.name} cannot be priced from its datasheet: fill "
                          + ", ".join(f"cluster.hardware.{key}" for key in missing)
                          + " (its GPU file in conf/cluster/gpu/, docs/clusters.md \"Hardware catalog\")")
    if cfg.precision in MATH_DTYPE:
        dtype = MATH_DTYPE[cfg.precision]
        if dtype not in peaks:
            raise ConfigError(f"cluster {cfg.cluster.name}'s GPU ({hw.gpu}) has no {dtype} peak in "
                              f"cluster.hardware.peak_tflops: it does not compute in {cfg.precision}")
        matmul = conv = peaks[dtype]
        tensor_cores = True
    else:
        tf32 = peaks.get("tf32", peaks["fp32"])
        matmul = tf32 if cfg.math.tf32 else peaks["fp32"]
        tensor_cores = bool(cfg.math.tf32) and "tf32" in peaks
        conv = peaks["fp32"] if cfg.math.tf32 is False else tf32  # torch's default: TF32 convolutions
    bandwidth = hw.device_memory_bandwidth_gbs * MEMORY_EFFICIENCY
    reductions = hw.device_memory_bandwidth_gbs * ROW_REDUCTION_EFFICIENCY
    name = hw.gpu or cfg.cluster.name
    traits = framework_attention(cfg)  # a framework's own kernel in torch's place (`rates`), or its torch's choice
    attention = (attention_kernel(cfg.network.attention, hw.compute_capability, cfg.precision in MATH_DTYPE,
                                  traits.get("rates"), str(traits.get("torch") or torch.__version__))
                 if hw.gpu else None)  # a CPU's fused attention: at its GEMMs' rate
    # FlashAttention-2 runs in half precision only; the memory-efficient kernel in fp32 runs on the FP32 units
    attention_peak = peaks[MATH_DTYPE[cfg.precision]] if cfg.precision in MATH_DTYPE else peaks["fp32"]
    attention_text = f", {attention.source}" if attention else ""
    fp8 = _fp8_peak(cfg)
    relative = FP8_RELATIVE_SHARE.get(cfg.get("fp8"), 0.0)
    fp8_text = f", fp8 GEMMs at {fp8:g} x the same share x {relative:g} ({cfg.fp8} scales)" if fp8 else ""
    calibrated = matmul_tflops(cfg.cluster.name, cfg.precision)
    if calibrated:  # `make calibrate` on the cluster measured a large matmul: what its GEMMs reach
        return Gpu(name, calibrated, calibrated * conv / matmul, bandwidth, hw.sm_count,
                   f"calibrated: {name} GEMMs at the measured {calibrated:.1f} TFLOP/s{fp8_text}, HBM "
                   f"{bandwidth:.0f} GB/s (datasheet x MEMORY_EFFICIENCY; norms and softmax x "
                   f"ROW_REDUCTION_EFFICIENCY), roofline per kernel{attention_text}",
                   tensor_cores, attention, attention_peak, fp8 * relative * calibrated / matmul, reductions)
    return Gpu(name, matmul * GEMM_EFFICIENCY, conv * GEMM_EFFICIENCY, bandwidth, hw.sm_count,
               f"datasheet: {name} GEMMs at {matmul:g} x {GEMM_EFFICIENCY} TFLOP/s{fp8_text}, HBM "
               f"{hw.device_memory_bandwidth_gbs:g} x {MEMORY_EFFICIENCY} GB/s (norms and softmax x "
               f"{ROW_REDUCTION_EFFICIENCY}), roofline per kernel{attention_text}",
               tensor_cores, attention, attention_peak, fp8 * relative * GEMM_EFFICIENCY, reductions)


def _fp8_peak(cfg) -> float:
    """The GPU's dense fp8 peak where the point trains fp8 linear layers (0.0 where it does not); a ConfigError
    naming the key where its catalog entry lacks it. An fp8 GEMM reaches FP8_RELATIVE_SHARE of the share of its peak
    that the point's bf16 GEMMs reach of theirs (the H200 lease's microbenchmarks)."""
    if cfg.get("fp8", Float8Recipe.none) == Float8Recipe.none:
        return 0.0
    hw = cfg.cluster.hardware
    if not hw.fp8_tflops:
        raise ConfigError(f"cluster {cfg.cluster.name} cannot price fp8={cfg.fp8}: fill cluster.hardware.fp8_tflops "
                          f"(the dense FP8 tensor-core peak of its GPU, {hw.gpu or 'unnamed'}; docs/clusters.md, "
                          "\"Hardware catalog\")")
    return float(hw.fp8_tflops)


@lru_cache(maxsize=64)
def _counted(network: str, dataset: str, batch: int, precision: str, fp8: str, compile: bool,
             activations: str, softmax: str | None, gpu: str | None) -> CountedNetwork:
    cfg = OmegaConf.create({"network": OmegaConf.create(network), "dataset": OmegaConf.create(dataset),
                            "precision": precision, "fp8": fp8, "compile": compile,
                            "framework": {"activations": {"dtype": activations}, "attention": {"softmax": softmax}},
                            "cluster": {"hardware": {"gpu": gpu}}})
    return count_network(cfg, batch)


def counted(cfg, batch: int) -> CountedNetwork:
    """`count_network`, once per network, data shape, batch, precision, fp8 recipe, compilation, the framework's
    activations' dtype and attention softmax, and GPU (or none) in a process."""
    return _counted(OmegaConf.to_yaml(cfg.network, resolve=True), OmegaConf.to_yaml(cfg.dataset, resolve=True),
                    batch, cfg.precision, cfg.fp8, cfg.compile, "half" if half_activations(cfg) else "computed",
                    framework_attention(cfg).get("softmax"), OmegaConf.select(cfg, "cluster.hardware.gpu"))


def optimizer_bytes(cfg) -> tuple[int, int]:
    """Bytes the optimizer step streams per fp32 parameter, and the state it keeps per parameter byte."""
    opt = cfg.optimizer
    name = str(opt.name)
    if name == "lamb":
        return LAMB_BYTES, 2
    if name in ADAM_DECAY_BYTES:
        return ADAM_BYTES + (ADAM_DECAY_BYTES[name] if opt.weight_decay else 0), 2
    momentum = opt.momentum > 0
    return SGD_BYTES[momentum] + (SGD_DECAY_BYTES if opt.weight_decay else 0), int(momentum)


def datasheet_profile(cfg, batch: int) -> Profile:
    """The profile of the point's network at `batch` on its cluster's GPU, priced from the datasheet."""
    gpu = gpu_of(cfg)
    network = counted(cfg, batch)
    layers = tuple(LayerProfile(
        name=layer.name, forward_s=sum(map(gpu.seconds, layer.forward)),
        backward_s=sum(map(gpu.seconds, layer.backward)),
        forward_flops=int(sum(k.flops for k in layer.forward)),
        backward_flops=int(sum(k.flops for k in layer.backward)),
        output_bytes=layer.output_bytes, saved_bytes=layer.saved_bytes, param_bytes=layer.param_bytes,
        param_tensors=layer.param_tensors, tied_bytes=layer.tied_bytes, block=layer.block,
        core_forward_s=sum(map(gpu.seconds, layer.core_forward)),
        core_forward_flops=int(sum(k.flops for k in layer.core_forward)), core_saved_bytes=layer.core_saved_bytes,
        output_elements=layer.output_elements, op_recomputed_s=sum(map(gpu.seconds, layer.op_recomputed)),
        op_recomputed_flops=int(sum(k.flops for k in layer.op_recomputed)), op_kept_bytes=layer.op_kept_bytes,
        stream_forward_s=sum(gpu.seconds(k) for k in layer.forward if k.residual),
        stream_backward_s=sum(gpu.seconds(k) for k in layer.backward if k.residual))
        for layer in network.layers)
    param_bytes = sum(layer.param_bytes for layer in layers)
    streamed, states = optimizer_bytes(cfg)
    optimizer_s = max(streamed * param_bytes / 4 / (gpu.bandwidth_gbs * 1e9), KERNEL_FLOOR_S)
    state_bytes = states * param_bytes
    saved = sum(layer.saved_bytes for layer in layers)
    # At its peak a step holds what it keeps and, while one kernel runs, that kernel's output and the gradient of it.
    train_bytes = 2 * param_bytes + state_bytes + saved + 2 * network.largest_output_bytes
    key = {"batch": batch, "precision": cfg.precision, "device": gpu.name, "priced_from": gpu.priced_from}
    return Profile(key=key, layers=layers, input_bytes=network.input_bytes,
                   forward_s=sum(layer.forward_s for layer in layers),
                   backward_s=sum(layer.backward_s for layer in layers),
                   optimizer_s=optimizer_s, optimizer_state_bytes=state_bytes, train_bytes=train_bytes,
                   buffer_bytes=network.buffer_bytes, warmup=0, steps=0)
