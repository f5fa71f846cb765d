"""Every `make bench-*` target runs, at smoke size (ARGS), as a user types it, and prints its ratio."""

import json
import re

import pytest

from conftest import run_make
from suite.paths import REPO_ROOT
from suite.tools.benchmarks import kernels
from suite.tools.benchmarks.launch import PARTS

pytestmark = pytest.mark.slow  # `make bench-*`: torchrun and its ranks


def test_bench_overhead_prints_its_ratio(results):
    result = run_make("bench-overhead", "ARGS=--rounds 1 steps_per_epoch=2 warmup_steps=1 dataset.samples=64 "
                                        "dataset.val_samples=16 batch_size=8")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "round 1/1: minimal " in result.stdout
    ratio = re.search(r"^overhead ratio suite/minimal = (\d+\.\d+) \(target <= 1\.02\)$", result.stdout, re.M)
    assert ratio and float(ratio.group(1)) > 0, result.stdout[-2000:]


def test_bench_pipeline_prints_each_schedules_ratio(results):
    """2 stages, 2 micro-batches: the ideal bubble is (p - 1) / (p + m - 1) = 1/3."""
    result = run_make("bench-pipeline", "ARGS=network.n_layer=2 network.n_embd=32 network.n_head=2 dataset.seq_len=16 "
                                        "dataset.samples=128 batch_size=8 strategy.micro_batches=2 "
                                        "strategy.balance=by_params epochs=1 steps_per_epoch=2 warmup_steps=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    numbers = r" \| ".join([r"(\d+\.\d+)"] * 5)
    rows = re.findall(rf"^\| (\S+) \| {numbers} \|$", result.stdout, re.M)
    assert [row[0] for row in rows] == ["gpipe", "gpipe_dist", "1f1b"], result.stdout[-2000:]
    for _, step, bound, ratio, bubble, ideal in rows:
        assert float(step) > 0 and float(bound) > 0 and float(ratio) > 0
        assert 0 <= float(bubble) < 1 and ideal == "0.333"


def test_bench_launch_splits_the_cost_of_a_point(results):
    result = run_make("bench-launch", "ARGS=--points 1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    parts = {name: float(line[len(name):].split()[0]) for name in [*(name for name, _ in PARTS), "total per point"]
             for line in result.stdout.splitlines() if line.startswith(name)}
    assert len(parts) == len(PARTS) + 1 and all(seconds >= 0 for seconds in parts.values()), result.stdout
    total = parts.pop("total per point")
    assert abs(sum(parts.values()) - total) < 0.05, result.stdout  # the parts follow each other, no gap
    cost = re.search(r"^launch cost per point: (\d+\.\d\d) s$", result.stdout, re.M)
    assert cost and float(cost.group(1)) > total, result.stdout  # the sweep's start and end on top


def test_bench_kernels_scores_a_gpus_kernels_and_steps(tmp_path):
    """A lease's files cut to one of each kind (the GPU's real names and numbers), and a Llama step shrunk to 2
    blocks of 256 tokens so that counting it is quick: every kind of kernel and the step print a model / measured
    ratio or time."""
    measured = REPO_ROOT / "docs" / "measurements" / "h200-2026-11-28"
    micro = json.loads((measured / "micro.json").read_text())
    gemms = [next(g for g in micro["gemms"] if g.get("role") and g["k"] > 1024),
             next(g for g in micro["gemms"] if g["n"] == 50257)]
    norm = next(m for m in micro["memory_bound"] if "backward_ms" in m and m["numel"] >= 2**24)
    small = {"env": micro["env"], "launch_floor": micro["launch_floor"], "gemms": gemms, "memory_bound": [norm],
             "attention": micro["attention"][:2]}  # FlashAttention-2 and the memory-efficient kernel
    (tmp_path / "micro.json").write_text(json.dumps(small))
    step = json.loads((measured / "profile_llama3_8b_4layers_bf16_b1_s8192.json").read_text())
    step["name"] = "llama3_8b_4layers_shrunk"
    step["seq"], step["vocab"] = 256, 1024
    (tmp_path / "profile_llama3_8b_4layers_shrunk.json").write_text(json.dumps(step))
    result = run_make("bench-kernels", f"ARGS={tmp_path}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "priced on cluster=h200: datasheet: NVIDIA H200 GEMMs at 989.4 x 0.8 TFLOP/s" in result.stdout
    ratio = r"\| (\d+) \| (\d+\.\d\d) \| (\d+\.\d\d) \| (\d+\.\d\d) \|"
    rows = {name: n for name, n, *_ in re.findall(rf"^\| ([^|]+) {ratio}$", result.stdout, re.M)}
    assert rows == {"GEMM: bf16, networks' layers, K > 1024": "1", "GEMM: bf16, a dimension not a multiple of 8": "1",
                    f"memory-bound: {norm['op']}, at least 16M elements": "1",
                    f"memory-bound: {norm['op']} backward, at least 16M elements": "1",
                    **{f"attention: {kernel}, forward + backward": "1" for kernel in ("flash", "efficient")},
                    "an eager kernel's launch (KERNEL_FLOOR_S)": "1"}, result.stdout
    assert re.search(r"^llama3_8b_4layers_shrunk: step 193\.8 ms measured, \d+\.\d model$", result.stdout, re.M)
    for kind in ("matmul", "attention", "memory", "optimizer"):
        assert re.search(rf"^\| {kind} kernels \| \d+\.\d \| \d+\.\d \| \d+ \| (\d+|not counted) \|$", result.stdout,
                         re.M), result.stdout


def test_profile_kernels_writes_what_bench_kernels_scores(tmp_path, capsys):
    """What a GPU lease runs (`make profile-kernels`), here on the CPU at its smoke shapes: micro.json and a step's
    profile naming the overrides of its network, which `make bench-kernels` prices on the cluster it is told."""
    measured = run_make("profile-kernels", f"OUT={tmp_path}", "ARGS=--smoke")
    assert measured.returncode == 0, measured.stdout[-3000:] + measured.stderr[-3000:]
    micro = json.loads((tmp_path / "micro.json").read_text())
    assert micro["env"]["gpu"] == "none (CPU)" and micro["fp8_gemms"] == []  # no fp8 tensor cores here
    assert {row["role"] for row in micro["gemms"] if "role" in row} == {"forward", "input_grad", "weight_grad"}
    assert all(row["ms"] > 0 for part in ("gemms", "memory_bound") for row in micro[part])
    (path,) = tmp_path.glob("profile_*.json")
    step = json.loads(path.read_text())
    assert step["overrides"][0] == "network=gpt2_nano" and step["step_ms"] > 0 and step["kernels"]
    scored = run_make("bench-kernels", f"ARGS={tmp_path} cluster=h100")
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    assert re.search(rf"^{step['name']}: step \d+\.\d ms measured, \d+\.\d model$", scored.stdout, re.M), scored.stdout
    assert re.search(r"^\| GEMM: bf16, square \| 2 \| \d+\.\d\d \|", scored.stdout, re.M), scored.stdout
    assert kernels.main([str(tmp_path)]) == 2  # a CPU's files name no GPU of the catalog
    assert capsys.readouterr().err == (f"{tmp_path}: measured on none (CPU), which no cluster is known to have: name "
                                       "one (cluster=NAME)\n")
