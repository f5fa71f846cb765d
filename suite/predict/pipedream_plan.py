"""PipeDream's planner (Narayanan et al., SOSP 2019, section 3.1): how many stages, which layers each holds and how
many replicas each gets, from the per-layer profile and the cluster's links.

A stage of layers i..j-1 on r replicas takes its mini-batches round-robin, so in steady state it spends per
mini-batch (its layers' forward, backward and optimizer step, plus the all-reduce of its gradients among the r
replicas) / r; a boundary costs the activation and its gradient sent once each per mini-batch, also shared by the
receiving stage's replicas. The pipeline's time per mini-batch is the largest of these, as PipeDream's dynamic
program minimises it:

    A(j, m, s) = min over i < j, r <= m of max(A(i, m - r, s - 1), T(i..j, r), C(i, r))

here with the number of stages s kept, so that the best configuration of each stage count is the runner-up list.
Every worker is used (the point's `workers`, as the sweep runs them). The ranks go to the stages in order (stage 0
on the first ones), so a stage's all-reduce and a boundary's sends use the inter-node links where their ranks span
nodes (PipeDream's hierarchical planner solves within a node, then across: the same costs, placed). PipeDream's
memory rule drops a stage that cannot hold its stashed versions, ceil(ranks of later stages / r) copies of its
weights and saved activations; here its live weights count too.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from suite.errors import ConfigError
from suite.layout import will_use_cuda
from suite.predict.links import LinkModel, link_model
from suite.predict.memory import capacity_bytes
from suite.predict.predictor import processes_per_node, workload
from suite.profiling.profiles import Profile
from suite.sweep.checks import validate
from suite.sweep.plan import Point

MAX_WORKERS = 32  # the search grows with the cube of the workers


@dataclass(frozen=True)
class Stage:
    first: int  # its first layer
    end: int  # one past its last layer
    replicas: int
    time_s: float  # per mini-batch of the pipeline: its replicas' compute and gradient all-reduce, shared among them
    send_s: float  # its input boundary: activation and gradient, per mini-batch of the pipeline

    @property
    def layers(self) -> int:
        return self.end - self.first


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    time_s: float  # per mini-batch in steady state: the slowest stage or boundary

    @property
    def replicas(self) -> list[int]:
        return [stage.replicas for stage in self.stages]

    @property
    def balance(self) -> list[int]:
        return [stage.layers for stage in self.stages]

    @property
    def name(self) -> str:
        """As PipeDream writes a configuration: replicas per stage, `2-1-1`."""
        return "-".join(map(str, self.replicas))

    def knobs(self) -> str:
        """The knobs that run it: `strategy.replicas=[2,1,1] strategy.balance=[..]`."""
        listed = (",".join(map(str, values)) for values in (self.replicas, self.balance))
        return "strategy.replicas=[{}] strategy.balance=[{}]".format(*listed)


@dataclass(frozen=True)
class Costs:
    """Per layer, what the planner prices, and the links among any ranks."""

    compute_s: tuple[float, ...]  # forward + backward + its share of the optimizer step, one mini-batch
    param_bytes: tuple[int, ...]
    tied_bytes: tuple[int, ...]  # a copy of an earlier layer's weight, its own on a later stage
    saved_bytes: tuple[int, ...]
    output_bytes: tuple[int, ...]
    links: Callable[[int, int], LinkModel]  # (ranks, nodes they span) -> their links
    per_node: int  # ranks per node
    capacity_bytes: float | None  # a rank's memory; None: unknown (no memory rule)

    @classmethod
    def from_profile(cls, profile: Profile, links: Callable[[int, int], LinkModel], per_node: int,
                     capacity_bytes: float | None) -> Costs:
        per_byte = profile.optimizer_s / max(profile.param_bytes, 1)
        layers = profile.layers
        return cls(tuple(x.forward_s + x.backward_s + per_byte * x.param_bytes for x in layers),
                   tuple(x.param_bytes for x in layers), tuple(x.tied_bytes for x in layers),
                   tuple(x.saved_bytes for x in layers), tuple(x.output_bytes for x in layers), links, per_node,
                   capacity_bytes)


class Planner:
    def __init__(self, costs: Costs, workers: int) -> None:
        if workers > MAX_WORKERS:
            raise ConfigError(f"the PipeDream planner searches up to {MAX_WORKERS} workers, not {workers} (its search "
                              "grows with the cube of the workers)")
        self.costs, self.workers, self.layers = costs, workers, len(costs.compute_s)
        self.prefix = {name: [0, *itertools.accumulate(getattr(costs, name))] for name in
                       ("compute_s", "param_bytes", "tied_bytes", "saved_bytes")}
        self._stages: dict[tuple[int, int, int, int], Stage | None] = {}

    def _sum(self, name: str, first: int, end: int) -> float:
        return self.prefix[name][end] - self.prefix[name][first]

    def _nodes(self, first_rank: int, ranks: int) -> int:
        per = self.costs.per_node
        return (first_rank + ranks - 1) // per - first_rank // per + 1

    def stage(self, first: int, end: int, replicas: int, first_rank: int) -> Stage | None:
        """Layers first..end-1 on `replicas` ranks from `first_rank`; None where they cannot hold what they stash."""
        key = (first, end, replicas, first_rank)
        if key not in self._stages:
            self._stages[key] = self._stage(*key)
        return self._stages[key]

    def _stage(self, first: int, end: int, replicas: int, first_rank: int) -> Stage | None:
        params = self._sum("param_bytes", first, end) + (self._sum("tied_bytes", first, end) if first else 0)
        later = self.workers - first_rank - replicas
        capacity = self.costs.capacity_bytes
        stashed = math.ceil(later / replicas) * (self._sum("saved_bytes", first, end) + params)
        if capacity is not None and params + stashed > capacity:
            return None
        compute = self._sum("compute_s", first, end)
        links = self.costs.links(replicas, self._nodes(first_rank, replicas))
        sync = links.collective("all_reduce", params, replicas)
        send = 0.0
        if first:
            spans = self._nodes(first_rank - 1, replicas + 1)  # the previous stage's last rank and this stage's
            send = 2 * self.costs.links(2, spans).send(self.costs.output_bytes[first - 1]) / replicas
        return Stage(first, end, replicas, (compute + sync) / replicas, send)

    def _best(self) -> list[list[list[Plan | None]]]:
        """best[s][m][j]: the fastest s-stage pipeline of layers 0..j-1 on ranks 0..m-1."""
        L, W = self.layers, self.workers
        depth = min(L, W)
        best: list[list[list[Plan | None]]] = [[[None] * (L + 1) for _ in range(W + 1)] for _ in range(depth + 1)]
        for m in range(1, W + 1):
            for j in range(1, L + 1):
                one = self.stage(0, j, m, 0)
                best[1][m][j] = Plan((one,), one.time_s) if one else None
        for s in range(2, depth + 1):
            for m in range(s, W + 1):
                for j in range(s, L + 1):
                    for i in range(s - 1, j):
                        for r in range(1, m - s + 2):
                            before = best[s - 1][m - r][i]
                            last = self.stage(i, j, r, m - r) if before else None
                            if last is None:
                                continue
                            time = max(before.time_s, last.time_s, last.send_s)
                            if best[s][m][j] is None or time < best[s][m][j].time_s:
                                best[s][m][j] = Plan((*before.stages, last), time)
        return best

    def plans(self) -> list[Plan]:
        """The best plan of each stage count, fastest first."""
        best = self._best()
        plans = [found for by_ranks in best[1:] if (found := by_ranks[self.workers][self.layers])]
        if not plans:
            raise ConfigError(f"no PipeDream configuration of {self.workers} workers holds its stashed weights and "
                              "activations in a rank's memory")
        return sorted(plans, key=lambda plan: plan.time_s)


def point_planner(point: Point) -> tuple[Planner, int]:
    """The planner of a point's network, cluster and workers, priced as the predictor prices the point (profiled,
    or from the cluster's datasheet, at one mini-batch of `batch_size`); and that mini-batch (samples)."""
    w, _, _ = workload(point)
    cluster = point.cfg.cluster

    @functools.cache
    def among(ranks: int, nodes: int) -> LinkModel:
        return link_model(cluster, nodes, ranks)
    device = "cuda" if will_use_cuda(cluster) else "cpu"
    capacity = capacity_bytes(point.cfg, device, processes_per_node(point))
    costs = Costs.from_profile(w.profile, among, cluster.workers_per_node, capacity)
    return Planner(costs, point.cfg.workers), w.profile.batch


def pricing_point(cfg: DictConfig) -> Point:
    """The point priced for planning: strategy pipedream as one stage on every worker (a point of any worker count,
    whatever its layers: the plan cuts them)."""
    pricing = cfg.copy()
    pricing.strategy.pp, pricing.strategy.replicas, pricing.strategy.balance = 1, None, "by_params"
    strategy, layout = validate(pricing, torch.__version__, runs_here=False)
    return Point((), pricing, strategy, layout)


def resolve_auto(cfg: DictConfig) -> None:
    """`strategy.pp=auto`: the planner's configuration, written into the point's `strategy.replicas` and
    `strategy.balance` (what every rank then runs, and what the run records)."""
    planner, _ = point_planner(pricing_point(cfg))
    chosen = planner.plans()[0]
    cfg.strategy.replicas, cfg.strategy.balance = chosen.replicas, chosen.balance
