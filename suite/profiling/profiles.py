"""What a profile of a network holds: taken on one device, layer by layer, as the performance model needs it.

A profile is taken at one batch (a rank's batch, or a pipeline's micro-batch), precision, optimizer and
thread count on this machine's device: `WARMUP` untimed training steps, then timed ones. The whole network
is timed over at least `WINDOW_S` seconds of steps (at least `STEPS`, at most `MAX_STEPS`), each phase's time
their mean: a training run's epoch averages over the swings of a machine's speed (a shared VM's doubles and
halves within seconds), and so must its profile, which a few steps would catch in one swing. Each layer alone
is timed over `STEPS` steps, their median. It holds, per layer of `suite.models.layers` (the unit a
pipeline cuts between; the last one includes the loss): forward and backward seconds, forward and backward
FLOPs (torch's FlopCounterMode, 2 per multiply-add), the bytes of its output (what a stage boundary after
it sends, and the gradient that comes back), the bytes autograd keeps for its backward, and its parameters'
bytes and count (a tied weight counted in its first layer, and as tied in the others); and of its attention
cores, their forward's seconds and FLOPs and the bytes kept inside them (what selective recomputation trades).
Layers are timed one at a time on the previous layer's output, which costs a little more than the same layers
inside the whole network, so their times are scaled to add up to the whole network's forward and backward, timed
in the same steps as its optimizer step; their sum is Study J's sequential measurement of a training step.
Loading a batch is profiled apart (`data_profile`), at the batch a rank reads, which a pipeline's micro-batch is
not. So is the forward on a worker thread (`worker_thread_profile`), where torchgpipe runs it. Taking one is
suite.profiling.measure's; keeping them, suite.profiling.cache's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from suite.errors import ConfigError

VERSION = 9  # of what a profile holds: a profile of another version is taken again
WARMUP = 2  # untimed steps first (allocator, caches, lazy initialisation)
STEPS = 5  # timed steps at least
WINDOW_S = 5.0  # of the whole network's timed steps, unless MAX_STEPS come first (SUITE_PROFILE_WINDOW_S sets it)
MAX_STEPS = 200  # a step of a tiny network takes milliseconds: 50 of them caught one swing of this VM's speed
DATA_BATCHES = 5  # batches loaded to time the data phase (after one untimed)


def window_s() -> float:
    """The seconds of steps a profile times the whole network over: `SUITE_PROFILE_WINDOW_S` where it is set (a
    shorter window for a quick check, such as the tests' profiles, at the price of catching one swing of a shared
    machine's speed), else `WINDOW_S`."""
    text = os.environ.get("SUITE_PROFILE_WINDOW_S", "")
    if not text:
        return WINDOW_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"SUITE_PROFILE_WINDOW_S={text!r} is not a number of seconds (0 or more)")
    return seconds


@dataclass(frozen=True)
class LayerProfile:
    name: str
    forward_s: float
    backward_s: float
    forward_flops: int
    backward_flops: int
    output_bytes: int  # the layer's output: the activation a stage boundary after it sends per micro-batch
    saved_bytes: int  # what autograd keeps for this layer's backward (its parameters excluded)
    param_bytes: int  # its own parameters
    param_tensors: int  # how many they are (what per-parameter hooks and messages scale with)
    tied_bytes: int  # parameters it shares with an earlier layer (GPT-2's LM head: the token embedding)
    block: bool  # one of the network's own submodules with parameters: an FSDP unit, a checkpointing candidate
    # Its attention cores (GPT-2's softmax(q k^T) v), which selective recomputation runs again in backward: their
    # forward's seconds and FLOPs, and what autograd keeps inside them and nowhere else (not their inputs).
    core_forward_s: float = 0.0
    core_forward_flops: int = 0
    core_saved_bytes: int = 0
    # The values of its output (a framework that sends a stage's output in another dtype sends these); 0: not counted
    output_elements: int = 0
    # A decoder block under `selective_op` (torchtitan's operator policy, suite.runtime.model_transforms):
    # the seconds and FLOPs of the forward ops it runs again in backward, and what it keeps for backward (its input
    # and the outputs of the ops the policy saves); counted on the meta device (suite.profiling.counted), 0 elsewhere
    op_recomputed_s: float = 0.0
    op_recomputed_flops: int = 0
    op_kept_bytes: int = 0
    # A decoder block's kernels on its residual stream alone (its norms, the dropouts and bias adds after its
    # row-parallel linears, its residual adds: suite.profiling.counted), which tensor parallelism without sequence
    # parallelism runs whole on every rank: their forward and backward seconds; 0 where not counted (measured)
    stream_forward_s: float = 0.0
    stream_backward_s: float = 0.0


@dataclass(frozen=True)
class Profile:
    key: dict[str, Any]
    layers: tuple[LayerProfile, ...]
    input_bytes: int  # one batch of the network's input
    forward_s: float  # the whole network, loss included
    backward_s: float
    optimizer_s: float  # the point's optimizer stepping every parameter
    optimizer_state_bytes: int  # after the first step
    train_bytes: int  # what training the whole network added to the process at its peak (all of the above, and
    # the allocator's and the kernels' workspace): peak resident set growth on CPU, peak allocation on GPU
    buffer_bytes: int  # BatchNorm statistics and the like
    warmup: int = WARMUP
    steps: int = STEPS  # of the whole network, timed
    taken: dict[str, float] = field(default_factory=dict)  # when (`at`, unix s), the cores' `busy_share` and the
    # `window_s` its steps were timed over

    @property
    def batch(self) -> int:
        return self.key["batch"]

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def param_tensors(self) -> int:
        return sum(layer.param_tensors for layer in self.layers)

    @property
    def workspace_bytes(self) -> int:
        """What training held at its peak beyond the parameters, their gradients, the optimizer's states and the
        saved activations: temporaries of backward and the optimizer, the allocator's slack."""
        accounted = 2 * self.param_bytes + self.optimizer_state_bytes + sum(layer.saved_bytes for layer in self.layers)
        return max(self.train_bytes - accounted, 0)

    @property
    def step_s(self) -> float:
        """One training step without data: forward, loss, backward, optimizer (Study J's sequential measurement)."""
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def flops(self) -> int:
        """Forward and backward FLOPs of one step at this batch."""
        return sum(layer.forward_flops + layer.backward_flops for layer in self.layers)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        layers = tuple(LayerProfile(**layer) for layer in data.pop("layers"))
        return cls(layers=layers, **data)


@dataclass(frozen=True)
class DataProfile:
    key: dict[str, Any]
    batch_s: float  # loading one batch into the device, as the trainer's data phase does
    batches: int = DATA_BATCHES

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataProfile:
        return cls(**{k: v for k, v in data.items() if k != "taken"})


@dataclass(frozen=True)
class WorkerThreadProfile:
    """The network's training forward on the calling thread, and on a worker thread that takes turns with it, as
    torchgpipe's worker runs every forward and the caller runs backward. On CPU the worker's OpenMP team competes
    for the cores with the caller's, which spins a while after each of its parallel regions."""

    key: dict[str, Any]
    forward_s: float
    worker_forward_s: float

    @property
    def slowdown(self) -> float:
        return self.worker_forward_s / self.forward_s

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerThreadProfile:
        return cls(**{k: v for k, v in data.items() if k != "taken"})
