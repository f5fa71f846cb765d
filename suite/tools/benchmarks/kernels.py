"""Benchmark: the datasheet model's kernels and steps against a profile taken on the GPU (`make bench-kernels`).

The operator-level check of suite.predict.roofline. A GPU lease left its microbenchmarks and step profiles in
docs/measurements/<gpu>-<date>/: micro.json (GEMMs by shape and dtype, memory-bound kernels by size, fused
attention, an eager kernel's launch) and profile_<network>_....json (one training step of a network: its time, its
forward, backward and optimizer phases, the kernels it launched). Each is priced on the catalog entry of the GPU it
ran on, as `make predict` prices a point there, and printed beside what was measured: per kind of kernel, the
median and range of the model's time over the measured one (above 1: the model is slow), then each step.

    python -m suite.tools.benchmarks.kernels [DIR] [cluster=NAME]   # default: the H200 lease of 2026-11-28
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from suite.errors import ConfigError
from suite.paths import REPO_ROOT
from suite.predict.roofline import (
    ADAM_BYTES,
    ADAM_DECAY_BYTES,
    KERNEL_FLOOR_S,
    Gpu,
    counted,
    datasheet_profile,
    gpu_of,
)
from suite.profiling.counted import ATTENTION, ATTENTION_BACKWARD, CAUSAL_WORK, MATMUL, MEMORY, Kernel, aligned
from suite.sweep.plan import plan
from suite.tools.benchmarks.kernel_profile import NETWORKS, step_overrides

DEFAULT_DIR = REPO_ROOT / "docs" / "measurements" / "h200-2026-11-28"
# The GPU's name in micro.json's env (torch.cuda's), and the cluster of the catalog with that GPU
CLUSTERS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100", "NVIDIA A100-SXM4-80GB": "dgx_a100_80gb",
            "NVIDIA A100-SXM4-40GB": "dgx_a100_40gb"}
PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
LARGE = 2**24  # elements: memory-bound kernels scored apart below this size, where their launch is most of them
ROW_REDUCTIONS = ("layer_norm", "softmax")  # micro.json's ops that are ATen's LayerNorm and softmax kernels
OPTIMIZER = "optimizer"  # the foreach kernels of the optimizer step


def _ratios(rows: Iterable[tuple[float, float]]) -> str:
    ratios = sorted(model / measured for model, measured in rows)
    return (f"{len(ratios)} | {statistics.median(ratios):.2f} | {ratios[0]:.2f} | {ratios[-1]:.2f}" if ratios
            else "0 | | |")


# The attention kernel the model prices for each of torch's backends the profile timed: `auto` is torch's own choice,
# cuDNN's on Hopper (suite.predict.attention); math (a CPU's profile) at the GEMMs' rate
MODEL_ATTENTION = {"flash": "flash", "efficient": "efficient", "cudnn": "auto", "math": "math"}


def _gpu(cluster: str, dtype: str, tf32: bool = False, attention: str = "auto") -> Gpu:
    (point,) = plan([[f"cluster={cluster}", f"precision={PRECISION[dtype]}", f"math.tf32={str(tf32).lower()}",
                      "dataset=tokens", "network=gpt2_medium", f"network.attention={attention}"]], runs_here=False)
    return gpu_of(point.cfg)


def gemm_group(gemm: dict) -> str:
    """The group a measured GEMM is scored in."""
    dtype = gemm["dtype"]
    if dtype == "float32":
        return "fp32 on TF32 tensor cores" if gemm.get("tf32") else "fp32 on the FP32 units"
    if dtype == "float16":
        return "fp16, square"
    if not aligned(gemm["m"], gemm["n"], gemm["k"]):
        return "bf16, a dimension not a multiple of 8"
    if gemm.get("role"):
        return f"bf16, networks' layers, K {'<=' if gemm['k'] <= 1024 else '>'} 1024"
    if gemm["m"] == gemm["n"] == gemm["k"]:
        return "bf16, square"
    return f"bf16, {gemm['n']} x {gemm['k']} weights, {'128-1024' if gemm['m'] <= 1024 else '1152-4096'} rows"


def gemm_seconds(gemm: dict, gpus: Callable[[str, bool], Gpu]) -> float:
    m, n, k, dtype = gemm["m"], gemm["n"], gemm["k"], gemm["dtype"]
    size = ELEMENT_BYTES[dtype]
    kernel = Kernel(MATMUL, 2 * m * n * k, size * (m * k + k * n + m * n), m, n,
                    aligned=aligned(m, n, k))
    return gpus(dtype, bool(gemm.get("tf32"))).seconds(kernel)


def attention_seconds(shape: list[int], gpu: Gpu) -> tuple[float, float]:
    """Forward and backward of causal attention of shape [batch, query heads, key-value heads, tokens, head dim],
    counted as suite.profiling.counted counts it."""
    batch, heads, _, tokens, head_dim = shape
    forward = 4 * batch * heads * tokens * tokens * head_dim * CAUSAL_WORK
    query = batch * heads * tokens * head_dim * 2
    rows = batch * heads * tokens
    return (gpu.seconds(Kernel(ATTENTION, forward, 4 * query, rows, head_dim, keys=tokens, causal=True)),
            gpu.seconds(Kernel(ATTENTION, forward * ATTENTION_BACKWARD, 8 * query, rows, head_dim, keys=tokens,
                               causal=True)))


def overrides_of(profile: dict) -> list[str]:
    """What builds the profiled step's network and batch: the profile's own overrides (suite.tools.benchmarks.
    kernel_profile writes them), else those of the network its name starts with."""
    if "overrides" in profile:
        return profile["overrides"]
    network = next((v for k, v in NETWORKS.items() if profile["name"].startswith(k)), None)
    if network is None:
        raise ConfigError(f"{profile['name']}: no network of the suite is known to be this profile's "
                          f"(suite.tools.benchmarks.kernel_profile.NETWORKS: {', '.join(NETWORKS)})")
    return step_overrides(network, profile["batch"], profile["seq"], profile["vocab"])


def profiled_kind(kernel: str) -> str | None:
    """The kind of kernel a profiled CUDA kernel's name says it is (None: a host-side range, not a kernel)."""
    if kernel.startswith("Optimizer."):  # the optimizer's record_function range around its foreach kernels
        return None
    name = kernel.lower()
    if "multi_tensor_apply" in name:
        return OPTIMIZER
    if any(word in name for word in ("fmha", "flash", "cudnn", "attn")):
        return ATTENTION
    if any(word in name for word in ("nvjet", "gemm", "cutlass", "cublas")):
        return MATMUL
    return MEMORY


def print_step(profile: dict, cluster: str) -> None:
    """One profiled step against the model's: its time, each phase, and each kind of kernel's time and count."""
    (point,) = plan([[f"cluster={cluster}", *overrides_of(profile)]], runs_here=False)
    gpu, batch = gpu_of(point.cfg), profile["batch"]
    priced = datasheet_profile(point.cfg, batch)
    kernels = [k for layer in counted(point.cfg, batch).layers for k in (*layer.forward, *layer.backward)]
    phases = {"forward": priced.forward_s, "backward": priced.backward_s, "optimizer": priced.optimizer_s}
    print(f"\n{profile['name']}: step {profile['step_ms']:.1f} ms measured, {1e3 * sum(phases.values()):.1f} "
          "model\n\n| phase or kind | measured ms | model ms | kernels measured | kernels counted |\n"
          "|---|---:|---:|---:|---:|")
    for phase, seconds in phases.items():
        print(f"| {phase} | {profile['phases_ms'][phase]:.1f} | {1e3 * seconds:.1f} | | |")
    measured: dict[str, list[float]] = {}
    for row in profile["kernels"]:
        kind = profiled_kind(row["kernel"])
        if kind:
            totals = measured.setdefault(kind, [0.0, 0.0])
            totals[0] += row["ms_per_step"]
            totals[1] += row["count"]
    for kind in (MATMUL, ATTENTION, MEMORY, OPTIMIZER):
        ms, count = measured.get(kind, [0.0, 0.0])
        of_kind = [k for k in kernels if k.kind == kind]
        model_ms = 1e3 * (priced.optimizer_s if kind == OPTIMIZER else sum(map(gpu.seconds, of_kind)))
        counted_kernels = "not counted" if kind == OPTIMIZER else len(of_kind)
        print(f"| {kind} kernels | {ms:.1f} | {model_ms:.1f} | {count:.0f} | {counted_kernels} |")


def main(args: list[str]) -> int:
    directory = Path(next((a for a in args if "=" not in a), DEFAULT_DIR))
    micro = json.loads((directory / "micro.json").read_text())
    gpu_name = micro["env"]["gpu"]
    cluster = next((a.split("=", 1)[1] for a in args if a.startswith("cluster=")), CLUSTERS.get(gpu_name))
    if cluster is None:
        print(f"{directory}: measured on {gpu_name}, which no cluster is known to have: name one (cluster=NAME)",
              file=sys.stderr)
        return 2
    cache: dict[tuple[str, bool, str], Gpu] = {}

    def gpus(dtype: str, tf32: bool, attention: str = "auto") -> Gpu:
        key = (dtype, tf32, attention)
        if key not in cache:
            cache[key] = _gpu(cluster, dtype, tf32, attention)
        return cache[key]

    bf16 = gpus("bfloat16", False)
    print(f"{directory.relative_to(REPO_ROOT) if directory.is_relative_to(REPO_ROOT) else directory}: {gpu_name} "
          f"({micro['env'].get('torch')}), priced on cluster={cluster}: {bf16.priced_from}\n")
    print("Model time / measured time (above 1: the model is slow)\n")
    print("| kernels | n | median | min | max |\n|---|---:|---:|---:|---:|")
    groups: dict[str, list[tuple[float, float]]] = {}
    for gemm in micro["gemms"]:
        groups.setdefault(f"GEMM: {gemm_group(gemm)}", []).append((gemm_seconds(gemm, gpus), gemm["ms"] / 1e3))
    for row in micro["memory_bound"]:
        if "bytes" not in row:  # a composite (cross entropy), not one kernel
            continue
        size = f"{'under' if row['numel'] < LARGE else 'at least'} {LARGE // 2**20}M elements"
        reduction = row["op"] in ROW_REDUCTIONS  # ATen's kernels of counted.ROW_REDUCTIONS
        groups.setdefault(f"memory-bound: {row['op']}, {size}", []).append(
            (bf16.seconds(Kernel(MEMORY, 0, row["bytes"], row_reduction=reduction)), row["ms"] / 1e3))
        if "backward_ms" in row:
            groups.setdefault(f"memory-bound: {row['op']} backward, {size}", []).append(
                (bf16.seconds(Kernel(MEMORY, 0, row["backward_bytes"], row_reduction=reduction)),
                 row["backward_ms"] / 1e3))
    attention = [row for row in micro["attention"] if "error" not in row]
    for row in attention:
        forward, backward = attention_seconds(row["shape"], gpus("bfloat16", False, MODEL_ATTENTION[row["backend"]]))
        groups.setdefault(f"attention: {row['backend']}, forward + backward", []).append(
            (forward + backward, (row["fwd_ms"] + row["bwd_ms"]) / 1e3))
    adamw = micro.get("optimizers") or {}
    if "ms" in adamw:  # foreach AdamW with weight decay over fp32 parameters: one pass per operation
        streamed = (ADAM_BYTES + ADAM_DECAY_BYTES["adamw"]) * adamw["parameters"]
        groups["foreach AdamW (ADAM_BYTES)"] = [(bf16.seconds(Kernel(MEMORY, 0, streamed)), adamw["ms"] / 1e3)]
    floor = micro.get("launch_floor", {}).get("add_us_per_kernel")
    if floor:
        groups["an eager kernel's launch (KERNEL_FLOOR_S)"] = [(KERNEL_FLOOR_S, floor / 1e6)]
    for name, rows in groups.items():
        print(f"| {name} | {_ratios(rows)} |")
    profiles = sorted(directory.glob("profile_*.json"))
    for path in profiles:
        print_step(json.loads(path.read_text()), cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
