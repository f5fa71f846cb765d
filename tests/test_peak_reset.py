"""The peaks a point reports start from a GPU freed of the cache its setup left (FSDP2 and ZeRO move the whole
model to the GPU before sharding it; `by_time` balancing profiles layer copies): `reset_peak` gives the cache back
to the driver, garbage collected first, before it restarts the peaks of every GPU the rank drives. No GPU here:
torch.cuda's GPU-only calls are stood in for by recorders."""

import gc
import weakref

import pytest
import torch

from suite.runtime.metrics import reset_peak


class Holder:
    """A weakly referable object kept alive by nothing but a reference cycle, as a tensor of setup can be."""


@pytest.fixture
def cuda_calls(monkeypatch):
    """The torch.cuda calls reset_peak makes, in order; while the fixture lasts only explicit collections run."""
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache", None)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    gc.disable()
    yield calls
    gc.enable()


def test_on_cpu_nothing_is_freed_or_reset(cuda_calls):
    reset_peak(torch.device("cpu"))
    assert cuda_calls == []


def test_the_cache_is_freed_after_collecting_garbage_then_every_gpus_peak_restarts(cuda_calls, monkeypatch):
    cycle = Holder()
    cycle.itself = cycle
    held = weakref.ref(cycle)
    del cycle
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: cuda_calls.append(("empty_cache", held() is None)))

    reset_peak(torch.device("cuda", 0), torch.device("cuda", 1))

    # ("empty_cache", True): the cache was freed once the cycle had been collected.
    assert cuda_calls == [("empty_cache", True), ("reset", torch.device("cuda", 0)),
                          ("reset", torch.device("cuda", 1))]
