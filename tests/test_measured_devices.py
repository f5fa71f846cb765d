"""A rank measures every device it computes on: a gpipe process drives a GPU per partition, and its clocks wait
for all of them, its phases last as long as on the GPU where they last longest, and its memory covers each (see
tests/test_nvml.py). No GPU here: CUDA events and streams are stood in for by a clock per device."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from suite.layout import Layout
from suite.models.gpt2 import GPT2
from suite.runtime.metrics import PhaseTimer, synchronize
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.gpipe import GPipe

GPUS = [torch.device("cuda", 0), torch.device("cuda", 1)]



def test_gpipe_measures_each_of_its_devices_once(one_rank_group):
    """Two partitions on the one CPU: one device to measure, and the phase timer records on it."""
    env = one_rank_group
    cfg = OmegaConf.create({"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
                            "dataset": {"kind": "tokens", "vocab_size": 16, "seq_len": 4},
                            "cluster": {"share_gpus": False}})
    timer = PhaseTimer(env.device)
    rank = RankContext(cfg, env, Layout(dp=1, pp=2, mini_batch=4, micro_batches=2, stages_in_one_process=True),
                       make_precision("fp32", env.device), timer, nn.functional.cross_entropy)
    model = GPT2(vocab_size=16, block_size=4, n_layer=2, n_head=2, n_embd=8)
    runtime = GPipe(devices=["cpu", "cpu"], balance=[2, 2]).setup(model, rank)
    assert runtime.devices == timer.devices == [torch.device("cpu")]


class Clocks:
    """A clock per GPU stream (ms), standing in for CUDA events and streams: an event records its stream's time."""

    def __init__(self, monkeypatch) -> None:
        self.now = {str(gpu): 0.0 for gpu in GPUS}
        clocks = self

        class Event:
            def __init__(self, enable_timing: bool) -> None:
                self.stream, self.at = None, None

            def record(self, stream: str) -> None:
                self.stream, self.at = stream, clocks.now[stream]

            def elapsed_time(self, end: "Event") -> float:
                assert end.stream == self.stream  # CUDA times only events of one device
                return end.at - self.at

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device: str(device))


def test_a_phase_lasts_as_long_as_on_its_slowest_gpu(monkeypatch):
    clocks = Clocks(monkeypatch)
    timer = PhaseTimer(GPUS[0])
    timer.devices = GPUS
    timer.enabled = True
    with timer.phase("optimizer"):
        clocks.now["cuda:0"] += 2.0
        clocks.now["cuda:1"] += 5.0  # the last partition's optimizer step, on its own GPU
    timer.collect()
    assert timer.totals["optimizer"] == pytest.approx(0.005)


def test_the_clock_waits_for_every_gpu(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    synchronize(torch.device("cpu"), *GPUS)
    assert waited == GPUS
