"""FLOPs per step against their analytic counts (2 FLOPs per multiply-add), recomputation counted apart, and the
peak MFU divides by: a calibration of the same device, else the vendor's, else none and why."""

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from torch import nn

from suite.layout import Layout
from suite.paths import record_path
from suite.runtime.metrics import (
    Device,
    NoPeak,
    Peak,
    StepFlops,
    count_step,
    find_peak,
    math_dtype,
    step_flops,
    utilisation,
)
from suite.shared_names import PeakSource
from suite.strategies.gpipe import GPipe
from suite.worker.trainer import loss_fn

M, K, H, N = 4, 8, 16, 3  # batch, inputs, hidden, classes


def test_a_linear_network_counts_2mnk_forward_and_3x_with_backward():
    model = nn.Sequential(nn.Linear(K, H), nn.ReLU(), nn.Linear(H, N))
    inputs, targets = torch.randn(M, K), torch.randint(0, N, (M,))
    forward = 2 * M * K * H + 2 * M * H * N
    assert count_step(model, inputs.requires_grad_(), targets, loss_fn) == (forward, 3 * forward)
    # Training data needs no gradient: the first layer's backward computes its weights' gradient only.
    assert count_step(model, inputs.detach(), targets, loss_fn) == (forward, 3 * forward - 2 * M * K * H)


def test_a_convolutional_network_counts_its_multiply_adds():
    channels, filters, side, kernel = 3, 8, 6, 3
    model = nn.Sequential(nn.Conv2d(channels, filters, kernel, padding=1), nn.ReLU(),
                          nn.Conv2d(filters, filters, kernel, padding=1), nn.Flatten(), nn.Linear(filters * side**2, N))
    inputs, targets = torch.randn(M, channels, side, side), torch.randint(0, N, (M,))
    first = 2 * M * filters * side**2 * channels * kernel**2  # per output element, C_in x k x k multiply-adds
    second = 2 * M * filters * side**2 * filters * kernel**2
    head = 2 * M * filters * side**2 * N
    forward = first + second + head
    assert count_step(model, inputs.requires_grad_(), targets, loss_fn) == (forward, 3 * forward)
    assert count_step(model, inputs.detach(), targets, loss_fn) == (forward, 3 * forward - first)


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_a_grouped_convolution_counts_its_groups_multiply_adds(groups):
    """Depthwise (groups = channels) as MobileNetV2's: each output element meets channels / groups inputs."""
    channels, side, kernel = 8, 6, 3
    conv = nn.Conv2d(channels, channels, kernel, padding=1, groups=groups)
    model = nn.Sequential(conv, nn.Flatten(), nn.Linear(channels * side**2, N))
    inputs, targets = torch.randn(M, channels, side, side, requires_grad=True), torch.randint(0, N, (M,))
    convolution = 2 * M * channels * side**2 * channels // groups * kernel**2
    head = 2 * M * channels * side**2 * N
    assert count_step(model, inputs, targets, loss_fn) == (convolution + head, 3 * (convolution + head))


GPT = OmegaConf.create({"arch": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "dropout": 0.0, "width": 1.0,
                       "attention": "auto"})
TOKENS = OmegaConf.create({"kind": "tokens", "vocab_size": 512, "seq_len": 32})


def gpt_counts(batch: int) -> tuple[int, int, int]:
    """Forward FLOPs of one GPT-2 block, of its last product (MLP's down-projection) and of the LM head: per token
    2 x (qkv 3d^2 + proj d^2 + MLP 8d^2), and 2 x T x d for each of attention's two products (over the whole score
    matrix); the down-projection 2 x 4d x d; the head 2 d V."""
    d, t, v = GPT.n_embd, TOKENS.seq_len, TOKENS.vocab_size
    tokens = batch * t
    return tokens * (24 * d * d + 4 * t * d), tokens * 8 * d * d, tokens * 2 * d * v


def test_a_step_of_the_suites_gpt2_is_counted_on_the_meta_device_with_its_recomputation():
    batch = 8
    sample = (torch.zeros(TOKENS.seq_len, dtype=torch.long),) * 2
    block, last, head = gpt_counts(batch)
    forward = GPT.n_layer * block + head
    plain = step_flops(GPT, TOKENS, sample, batch, "none", 0.0, loss_fn)
    assert plain == StepFlops(forward, 3 * forward, 3 * forward)
    # Every block checkpointed runs its forward again in backward, every second one half of them; torch's
    # checkpoint stops once backward has what it needs, before the block's last product, whose output it does not
    # keep (no dropout after it here).
    recomputed = block - last
    assert step_flops(GPT, TOKENS, sample, batch, "every", 0.0, loss_fn) == StepFlops(forward, 3 * forward,
                                                                                3 * forward + 2 * recomputed)
    assert step_flops(GPT, TOKENS, sample, batch, "2", 0.0, loss_fn).hardware == 3 * forward + recomputed
    assert step_flops(GPT, TOKENS, sample, batch, "none", 0.75, loss_fn).hardware == 3 * forward + 0.75 * forward
    # Selective recomputation runs each block's attention core again (the meta device's math kernel), up to the
    # softmax it keeps: the scores' product, not the product with v.
    scores = batch * TOKENS.seq_len * 2 * TOKENS.seq_len * GPT.n_embd
    assert step_flops(GPT, TOKENS, sample, batch, "selective", 0.0, loss_fn).hardware == (3 * forward
                                                                                          + GPT.n_layer * scores)


@pytest.mark.parametrize("checkpoint, share", [("always", 1.0), ("except_last", 0.75), ("never", 0.0)])
def test_torchgpipe_recomputes_the_micro_batches_it_checkpoints(checkpoint, share):
    layout = Layout(dp=1, pp=2, mini_batch=8, micro_batches=4, stages_in_one_process=True)
    assert GPipe(checkpoint=checkpoint).recomputed_forward_share(layout) == share


def test_mfu_and_hfu_of_a_run():
    flops = StepFlops(forward=10**12, model=3 * 10**12, hardware=4 * 10**12)
    peak = Peak(1.0, "fp32", PeakSource.vendor, "a datasheet")
    metrics, tags = utilisation(flops, dp=2, steps=10, seconds=20.0, devices=2, peak=peak)
    # A global step is 2 replicas: 6 TFLOP; 10 of them in 20 s on 2 devices is 1.5 TFLOP/s each.
    assert metrics == pytest.approx({"model_tflop_per_step": 6.0, "hardware_tflop_per_step": 8.0,
                                     "achieved_tflops": 1.5, "peak_tflops": 1.0, "mfu": 1.5, "hfu": 2.0})
    assert tags == {"suite.peak_source": "vendor", "suite.peak_dtype": "fp32",
                    "suite.peak_detail": "a datasheet"}
    metrics, tags = utilisation(flops, 2, 10, 20.0, 2, NoPeak("no peak known"))
    assert set(metrics) == {"model_tflop_per_step", "hardware_tflop_per_step", "achieved_tflops"}
    assert tags == {"suite.mfu_missing": "no peak known"}


def cluster(peaks: dict | None = None):
    return OmegaConf.create({"name": "local", "hardware": {"peak_tflops": peaks}})


def write_record(device: str, threads: int | None, tflops: dict) -> None:
    path = record_path("local")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"provenance": {"device": device, "date": "2026-11-22", "hosts": ["vm"]},
                                    "matmul": {"n": 2048, "threads": threads, "tflops": tflops}}))


CPU = Device("Some CPU", threads=2)


def test_no_peak_is_a_stated_reason(results):
    found = find_peak(cluster(), "fp32", CPU)
    assert isinstance(found, NoPeak)
    assert found.reason == (f"no calibration record {record_path('local')} (make calibrate CLUSTER=local); "
                            "cluster local gives no hardware.peak_tflops.fp32")


def test_the_vendor_peak_stands_in_for_a_missing_calibration(results):
    found = find_peak(cluster({"fp32": 2.0}), "fp32", CPU)
    assert (found.tflops, found.source, found.dtype) == (2.0, PeakSource.vendor, "fp32")
    assert found.detail.startswith("conf/cluster/local.yaml hardware.peak_tflops.fp32 (no calibration record")


def test_a_calibration_of_the_same_device_comes_first(results):
    write_record(CPU.name, CPU.threads, {"fp32": 0.04, "bf16": 0.01})
    found = find_peak(cluster({"fp32": 2.0}), "bf16", CPU)
    assert (found.tflops, found.source, found.dtype) == (0.01, PeakSource.calibration, "bf16")
    assert found.detail == f"{record_path('local')}: bf16 matmul n=2048 measured 2026-11-22 on vm"


def test_a_record_of_link_costs_only_gives_no_peak(results):
    """A record written for the performance model's links, without a matmul on a named device, is no peak."""
    path = record_path("local")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("cluster: local\nprovenance: {world_size: 2}\n")
    found = find_peak(cluster(), "fp32", CPU)
    assert isinstance(found, NoPeak)
    assert found.reason.startswith(f"the calibration record {path} has no matmul measured on a named device")


@pytest.mark.parametrize("device, threads", [("Another CPU", 2), ("Some CPU", 4)])
def test_a_calibration_of_another_device_is_not_used(results, device, threads):
    write_record(device, threads, {"fp32": 0.04})
    found = find_peak(cluster(), "fp32", CPU)
    assert isinstance(found, NoPeak)
    assert found.reason.startswith(f"the calibration record {record_path('local')} measured {device} with {threads} "
                                   "threads, this point runs on Some CPU with 2 threads; cluster local gives no")


def test_cpu_points_compute_in_their_precision():
    assert [math_dtype(p, torch.device("cpu"), True) for p in ("fp32", "bf16")] == ["fp32", "bf16"]
