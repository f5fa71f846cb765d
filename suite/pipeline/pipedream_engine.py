"""Asynchronous PipeDream (Narayanan et al., SOSP 2019) with weight stashing, on point-to-point ops.

Each stage runs its own one-forward-one-backward order with no flush between mini-batches: a stage
with `lag` stages after it starts `lag` mini-batches before its first backward, then alternates
forward of mini-batch k and backward of mini-batch k - lag; the last stage (lag 0) runs each
backward right after its forward. Every backward is followed by this stage's weight update.

A stage on r replicas (PipeDream's 2-1-1) runs the stream's mini-batches round-robin, k on replica
k mod r, each replica in the same order over its own share, its gradients averaged with the other
replicas' after every backward (so the r replicas update together, on r mini-batches). Its lag is
PipeDream's count of mini-batches a replica admits, ceil(ranks of this and later stages / r) - 1:
fewer, and a replica waiting in the all-reduce holds back a forward a later stage needs (checked
against every replication of up to ten ranks in tests/test_pipedream.py).

Weight stashing: mini-batch k's forward runs on a snapshot of the weights current at that moment,
and its backward differentiates through that same snapshot, however many updates happened since;
the resulting gradient is applied to the current weights. A stage thus holds up to `lag` stale
versions besides its live weights (identical snapshots are shared). Sends are non-blocking and
receives blocking: each stage's order is a topological order of the pipeline's dependencies, so
no cycle of waits can form, as long as activations and gradients travel on process groups of their
own (the pipeline groups' channels): on one NCCL communicator a stage's send of the next activation would
queue its receive of a gradient behind it while the next stage's gradient send waits for that receive.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from suite.layout import Layout
from suite.pipeline import p2p
from suite.pipeline.groups import PipelineGroups
from suite.runtime.metrics import PhaseTimer
from suite.runtime.numerics import Precision


@dataclass
class InFlight:
    minibatch: int  # its index in the pipeline's stream
    inputs: torch.Tensor  # what this stage received (a leaf when it came from the previous stage)
    output: torch.Tensor  # activation sent on, or the loss on the last stage
    version: int  # updates applied to this stage before the forward
    checksum: float | None  # of the weights the forward used, when recording versions


@dataclass(frozen=True)
class VersionRecord:
    """What one mini-batch saw on one stage: the test of weight stashing reads these. The checksums read every
    parameter to the host (a device sync each), so a stage keeps records only when built with `record_versions`."""

    minibatch: int
    forward_version: int
    forward_checksum: float
    backward_checksum: float  # of the weights the backward differentiated through
    live_version_at_backward: int


def lag(layout: Layout, stage: int) -> int:
    """Mini-batches a rank of `stage` starts before its first backward (PipeDream's NOAM less one)."""
    later = sum(layout.stage_width(s) for s in range(stage, layout.pp))
    return math.ceil(later / layout.stage_width(stage)) - 1


def checksum(tensors) -> float:
    return float(sum(t.detach().double().sum().item() for t in tensors))


class PipeDreamStage:
    def __init__(self, module: nn.Module, stage: int, topology: PipelineGroups, optimizer: torch.optim.Optimizer,
                 sync_grads: Callable[[], None], device: torch.device, record_versions: bool = False) -> None:
        self.module, self.stage, self.topology = module, stage, topology
        self.record_versions = record_versions
        self.optimizer, self.sync_grads, self.device = optimizer, sync_grads, device
        self.lag = lag(topology.layout, topology.stage_rank)
        self.in_flight: deque[InFlight] = deque()
        self.stashes: dict[int, dict[str, torch.Tensor]] = {}  # weight version -> snapshot
        self.sends: list = []
        self.version = 0
        self.started = 0
        self.weight_versions_max = 0
        self.records: list[VersionRecord] = []

    def _snapshot(self) -> dict[str, torch.Tensor]:
        if self.version not in self.stashes:
            self.stashes[self.version] = {name: p.detach().clone().requires_grad_(p.requires_grad)
                                          for name, p in self.module.named_parameters()}
        return self.stashes[self.version]

    def _count_versions(self) -> None:
        stale = {f.version for f in self.in_flight if f.version < self.version}
        self.weight_versions_max = max(self.weight_versions_max, len(stale))

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn, precision: Precision,
             timer: PhaseTimer) -> torch.Tensor | None:
        """Forward of the next mini-batch, then the backward that is due; the loss on the last stage."""
        loss = self._forward(inputs, targets, loss_fn, precision, timer)
        if len(self.in_flight) > self.lag:
            self._backward(timer)
        self.sends = [work for work in self.sends if not work.is_completed()]
        return loss

    def drain(self, timer: PhaseTimer) -> None:
        """Backward of every mini-batch still in flight (end of an epoch, before evaluation)."""
        while self.in_flight:
            self._backward(timer)
        p2p.wait_all(self.sends)

    def _forward(self, inputs, targets, loss_fn, precision: Precision, timer: PhaseTimer):
        topo = self.topology
        k = topo.stream_index(self.started)
        if not topo.is_first:
            previous = topo.stage_rank - 1
            inputs = p2p.recv(topo.peer(previous, k), self.device, topo.channel(previous, topo.stage_rank, k))
            inputs.requires_grad_()
        with timer.phase("forward", f"stage{self.stage}.forward"), precision.autocast():
            if self.lag:
                weights = self._snapshot()
                output = functional_call(self.module, weights, (inputs,))
            else:  # no update can come between this forward and its backward
                weights = dict(self.module.named_parameters())
                output = self.module(inputs)
            if topo.is_last:
                output = loss_fn(output, targets)
        self.in_flight.append(InFlight(k, inputs, output, self.version,
                                       checksum(weights.values()) if self.record_versions else None))
        self.started += 1
        if topo.is_last:
            return output.detach()
        following = topo.stage_rank + 1
        self.sends += p2p.isend(output, topo.peer(following, k), topo.channel(topo.stage_rank, following, k))
        return None

    def _backward(self, timer: PhaseTimer) -> None:
        topo = self.topology
        self._count_versions()
        done = self.in_flight.popleft()
        following, previous, k = topo.stage_rank + 1, topo.stage_rank - 1, done.minibatch
        grad = None if topo.is_last else p2p.recv(topo.peer(following, k), self.device,
                                                  topo.channel(following, topo.stage_rank, k))
        weights = self.stashes.get(done.version) if self.lag else dict(self.module.named_parameters())
        with timer.phase("backward", f"stage{self.stage}.backward"):
            torch.autograd.backward(done.output, grad)
        if not topo.is_first:
            self.sends += p2p.isend(done.inputs.grad, topo.peer(previous, k),
                                    topo.channel(topo.stage_rank, previous, k))
        if self.record_versions:
            self.records.append(VersionRecord(done.minibatch, done.version, done.checksum,
                                              checksum(weights.values()), self.version))
        if self.lag:
            for name, param in self.module.named_parameters():
                param.grad, weights[name].grad = weights[name].grad, None
            if all(f.version != done.version for f in self.in_flight):
                del self.stashes[done.version]
        with timer.phase("optimizer"):
            self.sync_grads()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
