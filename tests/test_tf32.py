"""TF32 is read and set through the API of the torch at hand: where it has them, `fp32_precision` per backend and
operator, whose use makes the legacy flags (`allow_tf32`, `get_float32_matmul_precision`) raise when read."""

import pytest
import torch

from suite.runtime.metrics import math_dtype
from suite.runtime.torch_api import (
    CONV_FP32_PRECISION,
    MATMUL_FP32_PRECISION,
    convolution_tf32,
    matmul_tf32,
    matmuls_in_tf32,
)

GPU = torch.device("cuda", 0)
new_api = pytest.mark.skipif(not (MATMUL_FP32_PRECISION and CONV_FP32_PRECISION),
                             reason="this torch has no fp32_precision")


@pytest.fixture
def fp32_precision():
    """The new API's settings, as torch had them before the test."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    kept = matmul.fp32_precision, conv.fp32_precision
    yield matmul, conv
    matmul.fp32_precision, conv.fp32_precision = kept


@pytest.fixture
def ampere(monkeypatch):
    """A GPU with TF32 tensor cores as `cuda:0` (none here: its capability is what math_dtype reads)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))


def test_torchs_defaults_give_tf32_convolutions_and_fp32_matmuls(ampere):
    assert (convolution_tf32(), matmul_tf32()) == (True, False)
    assert [math_dtype("fp32", GPU, convolutional) for convolutional in (True, False)] == ["tf32", "fp32"]
    assert math_dtype("bf16", GPU, True) == "bf16"


def test_a_gpu_before_ampere_computes_fp32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    assert math_dtype("fp32", GPU, True) == "fp32"


@new_api
def test_tf32_set_through_the_new_api_is_read(fp32_precision, ampere):
    matmul, conv = fp32_precision
    matmul.fp32_precision, conv.fp32_precision = "tf32", "ieee"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()  # what math_dtype read before
    assert (convolution_tf32(), matmul_tf32()) == (False, True)
    assert [math_dtype("fp32", GPU, convolutional) for convolutional in (True, False)] == ["fp32", "tf32"]


@new_api
def test_matmuls_in_tf32_sets_the_new_api_and_restores_it(fp32_precision):
    matmul, _ = fp32_precision
    matmul.fp32_precision = "tf32"
    with matmuls_in_tf32(False):
        assert matmul.fp32_precision == "ieee" and not matmul_tf32()
    assert matmul.fp32_precision == "tf32"
    matmul.fp32_precision = "none"  # torch's default: as the generic fp32 precision
    with matmuls_in_tf32(True):
        assert matmul_tf32()
    assert matmul.fp32_precision == "none"
    assert not torch.backends.cuda.matmul.allow_tf32  # consistent again: the legacy flag reads
