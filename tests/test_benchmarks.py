"""Every `make bench-*` target runs, at smoke size (ARGS), as a user types it, and prints its ratio."""

import re

import pytest

from conftest import run_make

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
