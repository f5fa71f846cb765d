"""Loss scaling in fp16: a step whose gradients overflow is skipped, and counted (`fp16_skipped_steps`)."""

import torch

from suite.runtime.numerics import make_precision


def scaled_step(precision, weight: torch.nn.Parameter, optimizer, factor: float) -> None:
    precision.backward((weight * factor).sum())
    precision.step(optimizer)
    optimizer.zero_grad()


def test_an_overflowing_step_is_skipped_and_counted_and_a_finite_one_is_not():
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    precision = make_precision("fp16", torch.device("cpu"))  # GradScaler("cpu"): the same logic as on a GPU
    scaled_step(precision, weight, optimizer, 1e35)  # x 65536 (the initial scale) is inf in fp32
    assert precision.skipped_steps == 1 and torch.equal(weight.detach(), torch.ones(4))
    scaled_step(precision, weight, optimizer, 1.0)
    assert precision.skipped_steps == 1 and weight.detach()[0] == 0.9
    scaled_step(precision, weight, optimizer, 1e35)  # x 32768, the scale the first overflow left: inf again
    assert precision.skipped_steps == 2 and weight.detach()[0] == 0.9


def test_no_scaler_outside_fp16():
    precision = make_precision("bf16", torch.device("cpu"))
    assert precision.scaler is None and precision.skipped_steps == 0
