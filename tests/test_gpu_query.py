"""The sweep's driver asks about this machine's GPU (bf16 support, memory, name) without a CUDA context of its own,
which would hold memory on GPU 0 for the whole sweep: a child process answers."""

import pytest
import torch

from conftest import DIGITS
from suite.errors import ConfigError
from suite.predict.memory import capacity_bytes
from suite.profiling.cache import device_name
from suite.runtime.gpu_query import first_gpu, nvidia_driver
from suite.sweep.plan import plan


@pytest.fixture
def fresh_answer():
    """first_gpu asks again (it keeps its answer for the driver's life)."""
    first_gpu.cache_clear()
    yield
    first_gpu.cache_clear()


def test_without_a_gpu_the_answer_is_none(fresh_answer):
    assert first_gpu() is None
    (point,) = plan([DIGITS])
    assert capacity_bytes(point.cfg, "cuda", 1) is None  # this machine's GPU memory: unknown
    assert "NVIDIA driver" in nvidia_driver()  # its version, or why NVML does not answer


@pytest.mark.slow  # starts a process
def test_the_driver_asks_about_its_gpu_in_a_child_process(fresh_answer, monkeypatch):
    """As if this machine had a GPU: counting GPUs opens no context, so the driver believes the count, and its
    questions about the GPU go to a child process, which (no GPU here) fails with one line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    initialised = []
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: initialised.append("CUDA initialised in the driver"))
    failed = "a process asking this machine's first GPU for its properties failed: "
    with pytest.raises(ConfigError, match=failed):
        plan([[*DIGITS, "cluster.device=cuda", "precision=bf16"]])  # is its GPU older than bf16?
    (point,) = plan([[*DIGITS, "cluster.device=cuda"]])
    with pytest.raises(ConfigError, match=failed):
        capacity_bytes(point.cfg, "cuda", 1)
    with pytest.raises(ConfigError, match=failed):
        device_name(torch.device("cuda"))
    assert initialised == [] and not torch.cuda.is_initialized()
