"""Fused attention on a GPU, priced from its kernels' published benchmarks: the share of the dense half-precision
peak that FlashAttention-2 and the memory-efficient kernel reach, forward and backward together, by sequence
length, head dimension and mask.

A fused attention kernel is not a GEMM: its two matmuls per tile sit between an online softmax (exponentials on
the special-function units, rescaling), its grid is batch x heads x query blocks, and its backward recomputes the
scores and adds into dQ. What it reaches is measured, not derived: the FlashAttention-2 paper's figure "Attention
forward + backward speed" (Dao 2023, arXiv 2307.08691, Figure 4 on an A100 80GB SXM4; the same plots, on an H100
80GB SXM5 too, are assets/flash2_a100_fwd_bwd_benchmark.png and assets/flash2_h100_fwd_bwd_benchmark.png of
Dao-AILab/flash-attention@4f285b35): batch x sequence = 16k tokens, hidden 2048 (32 heads of 64 or 16 of 128),
fp16, FLOPs counted as suite.profiling.counted counts them (4 B s^2 H d forward, halved under a causal mask,
backward 2.5 times that; benchmarks/benchmark_flash_attention.py lines 27-30). The values are the bars' labels;
one, the A100's 512 tokens at head dimension 128 without a mask, is under the legend and read from its bar's height.
On Hopper torch's own build of FlashAttention-2 reaches less than the plot (TORCH_FLASH2_HOPPER, timed on the
H200 lease); on the A100 it is priced at the plot's bars. From torch 2.11 torch's own choice on Hopper and later is
cuDNN's fused attention (its wheels' cuDNN passes the version check_prefer_cudnn_attention asks for), priced at what
the lease timed it reach against the plot (CUDNN_HOPPER).

The figure's "FlashAttention Triton" bars are Tri Dao's Triton FlashAttention (flash_attn_triton.py), which torch
does not ship: a framework that ran it (llm-foundry's `attn_impl: triton`) says so in its file (conf/framework/,
`attention.rates: flash_triton`) and its attention is priced at those bars, published on the A100 only and carried to
other GPUs as the memory-efficient kernel's are.

The figure's "xformers" bars are the memory-efficient kernel torch runs as SDPBackend.EFFICIENT_ATTENTION (torch's
is xformers' CUTLASS kernel); they are published on the A100 only. On a Hopper GPU that kernel, built for Ampere's
mma instructions, loses what FlashAttention-2 (also built for them) loses there: its A100 share scaled by
FlashAttention-2's H100 share over its A100 share. On a GPU before Ampere (Volta, Turing) FlashAttention-2 does not
run and torch takes the memory-efficient kernel, priced at its A100 share of that GPU's own peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from packaging.version import Version

from suite.models.gpt2 import flash_runs
from suite.profiling.counted import Kernel
from suite.shared_names import AttentionKernel

SEQUENCES = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
# TFLOP/s, forward + backward, at SEQUENCES; by (head dimension, causal)
FLASH2_A100 = {(64, False): (132, 153, 162, 171, 175, 176), (128, False): (151, 173, 187, 196, 201, 203),
               (64, True): (88, 119, 140, 156, 165, 171), (128, True): (99, 133, 155, 173, 182, 189)}
EFFICIENT_A100 = {(64, False): (68, 73, 76, 77, 75, 75), (128, False): (83, 91, 95, 96, 97, 98),
                  (64, True): (51, 60, 66, 68, 69, 67), (128, True): (58, 72, 82, 87, 91, 92)}
FLASH_TRITON = "flash_triton"  # a framework's own kernel, priced at its bars (not one torch runs)
FLASH_TRITON_A100 = {(64, False): (90, 102, 98, 98, 100, 100), (128, False): (78, 85, 90, 93, 95, 95),
                     (64, True): (59, 75, 79, 76, 79, 80), (128, True): (50, 61, 68, 74, 78, 80)}
FLASH2_H100 = {(64, False): (215, 254, 274, 288, 294, 296), (128, False): (248, 294, 320, 326, 335, 338),
               (64, True): (141, 192, 232, 257, 273, 284), (128, True): (163, 221, 265, 294, 308, 328)}
# What torch's own FlashAttention-2 (SDPBackend.FLASH_ATTENTION, the kernel torch picks on Hopper unless cuDNN's is
# enabled: pytorch/pytorch#138522) reaches there of the published H100 plot's rate: the five causal shapes the H200
# lease timed forward and backward (head dimension 64 at 1024 and 2048 tokens, 128 at 4096 and 8192;
# docs/measurements/h200-2026-11-28/micro.json, `make bench-kernels`) took the plot's time over 0.89, the median
# (0.73-0.96; 0.89 and 0.91 at the two shapes of the plot's own batch x heads).
TORCH_FLASH2_HOPPER = 0.89
# cuDNN's fused attention (SDPBackend.CUDNN_ATTENTION), which torch's `auto` takes on compute capability 9.0 and later
# where its cuDNN is 9.15.1 or newer (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
# check_prefer_cudnn_attention; pytorch/pytorch#138522 made it opt-in before): torch 2.11's wheels, whose cuDNN 9.19
# the H200 lease ran it with (its profiles' attention kernels are cuDNN's). Against the published H100 plot's rate, the
# lease's five causal shapes ran 1.62 times as fast (median; 0.91-1.72).
CUDNN = "cudnn"
CUDNN_HOPPER = 1.62
CUDNN_PREFERRED_FROM = "2.11"  # the first torch whose wheels' cuDNN passes that check
# The figures' GPUs' dense fp16 peaks (conf/cluster/gpu/a100_sxm4_40gb.yaml, h100_sxm5_80gb.yaml)
A100_PEAK = 312.0
H100_PEAK = 989.4
HOPPER = 9.0


def _share(curves: dict, peak: float, kernel: Kernel) -> float:
    """The curves' share of `peak` at the kernel's keys and head dimension: linear in log2(sequence) between the
    benchmarked lengths and in the head dimension between 64 and 128, the nearest benchmarked value outside them."""
    position = min(max(math.log2(max(kernel.keys, 1) / SEQUENCES[0]), 0.0), len(SEQUENCES) - 1.0)
    low = min(int(position), len(SEQUENCES) - 2)

    def at(head_dim: int) -> float:
        values = curves[head_dim, kernel.causal]
        return values[low] + (position - low) * (values[low + 1] - values[low])

    weight = min(max((kernel.cols - HEAD_DIMS[0]) / (HEAD_DIMS[1] - HEAD_DIMS[0]), 0.0), 1.0)
    return ((1 - weight) * at(HEAD_DIMS[0]) + weight * at(HEAD_DIMS[1])) / peak


@dataclass(frozen=True)
class AttentionKernelCost:
    """What one of torch's fused attention kernels reaches on a GPU of `capability`, as a share of its peak."""

    kernel: str  # flash | efficient | cudnn (torch's on Hopper) | flash_triton (a framework's: the docstring)
    capability: float

    def share(self, kernel: Kernel) -> float:
        if self.kernel == CUDNN:
            return _share(FLASH2_H100, H100_PEAK, kernel) * CUDNN_HOPPER
        if self.kernel == AttentionKernel.flash:
            if self.capability >= HOPPER:
                return _share(FLASH2_H100, H100_PEAK, kernel) * TORCH_FLASH2_HOPPER
            return _share(FLASH2_A100, A100_PEAK, kernel)
        share = _share(FLASH_TRITON_A100 if self.kernel == FLASH_TRITON else EFFICIENT_A100, A100_PEAK, kernel)
        if self.capability >= HOPPER:
            share *= _share(FLASH2_H100, H100_PEAK, kernel) / _share(FLASH2_A100, A100_PEAK, kernel)
        return share

    @property
    def source(self) -> str:
        if self.kernel == CUDNN:
            return (f"attention: cuDNN's fused attention (torch's choice on Hopper from {CUDNN_PREFERRED_FROM}) at "
                    f"{CUDNN_HOPPER} x FlashAttention-2's published H100 share of the peak (measured)")
        name = {AttentionKernel.flash: "FlashAttention-2", FLASH_TRITON: "Triton FlashAttention"}.get(
            self.kernel, "the memory-efficient kernel")
        gpu = "H100" if self.capability >= HOPPER else "A100"
        scaled = " scaled to Hopper by FlashAttention-2's" if self.kernel != "flash" and gpu == "H100" else ""
        hopper_flash = self.kernel == AttentionKernel.flash and gpu == "H100"
        torch_build = f" x {TORCH_FLASH2_HOPPER} (torch's build, measured)" if hopper_flash else ""
        return f"attention: {name} at its published {'A100' if scaled else gpu} share of the peak{scaled}{torch_build}"


def attention_kernel(attention: str, capability: float, half: bool, rates: str | None = None,
                     torch_version: str = torch.__version__) -> AttentionKernelCost | None:
    """The fused kernel torch (of `torch_version`: this environment's, which runs the suite's points) runs for
    `network.attention` on a GPU of `capability` (None for math, which the counted network already holds as its
    GEMMs and softmax), or the kernel a framework ran in its place (`rates`: flash_triton). The planner has refused
    flash where it cannot run (suite.sweep.checks)."""
    if attention == AttentionKernel.math:
        return None
    if rates == FLASH_TRITON:
        return AttentionKernelCost(FLASH_TRITON, capability)
    if attention == AttentionKernel.auto:
        if not flash_runs(half, capability):
            return AttentionKernelCost(AttentionKernel.efficient, capability)
        if capability >= HOPPER and Version(torch_version).release >= Version(CUDNN_PREFERRED_FROM).release:
            return AttentionKernelCost(CUDNN, capability)
        attention = AttentionKernel.flash
    return AttentionKernelCost(str(attention), capability)
