"""What a collective or a point-to-point send of n bytes costs among p ranks, from a calibration record.

A calibration record (written by `make calibrate` on the cluster: `results/calibration/<cluster>.yaml`, the
latest, and `<cluster>.w<ranks>.yaml`, the latest among each number of ranks) holds, per scope (`intra_node`:
the ranks of a node; `inter_node`: all ranks of several nodes) and collective, the time of a message of each
measured size among the scope's `ranks`, and the one-way time of a send between two ranks
(`p2p.<scope>.curve`). A point on one node is priced by the `intra_node` curves, one on several nodes by the
`inter_node` ones (the slowest link of its rings), of the record whose ranks are nearest the point's: on a CPU
node of fewer cores than ranks a collective also waits for its ranks to be scheduled, which only a record among
as many ranks holds. Between measured sizes the time is interpolated log-log; beyond the largest it grows at
the largest size's bandwidth. To price the same collective among p ranks the measured time is split into its
latency (the smallest message's time), which grows with the ring's steps, and the rest, which grows with the
bandwidth-optimal ring's bus factor (nccl-tests: busbw is the same at every p): all-reduce 2(p-1)/p, all-gather
and reduce-scatter (p-1)/p, broadcast 1.
Where a GPU cluster has no record, NCCL's own cost model prices its catalog fabric (suite.predict.fabric); where
a CPU cluster has none, its `hardware` latency and bandwidth give an alpha-beta model.

Message sizes are the whole buffer, as `suite.runtime.metrics` counts them: an all-gather's output, a
reduce-scatter's input.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from suite.errors import ConfigError
from suite.layout import will_use_cuda
from suite.paths import calibration_files, read_record, reading, record_path
from suite.predict.fabric import nccl_links

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
P2P = "p2p"


def bus_factor(kind: str, ranks: int) -> float:
    """Bytes each rank sends, per byte of the buffer, in the bandwidth-optimal ring algorithm."""
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0  # broadcast, p2p


def sent_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """Bytes one rank sends in a collective of an `nbytes` buffer among `ranks` (suite.runtime.metrics's count)."""
    return bus_factor(kind, ranks) * nbytes if ranks > 1 else 0.0


def ring_steps(kind: str, ranks: int) -> int:
    """Latency-bound steps of the ring algorithm."""
    if kind == P2P:
        return 1
    return 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1


class Curve(Protocol):
    def time(self, nbytes: float) -> float: ...

    @property
    def latency(self) -> float: ...


@dataclass(frozen=True)
class Measured:
    """Times measured at increasing message sizes, interpolated log-log."""

    sizes: tuple[float, ...]
    times: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.times) or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError("a measured curve needs increasing, distinct sizes, one time each")
        if min(self.sizes) <= 0 or min(self.times) <= 0:
            raise ValueError("measured sizes and times must be positive")

    @property
    def latency(self) -> float:
        return self.times[0]

    def time(self, nbytes: float) -> float:
        sizes, times = self.sizes, self.times
        if nbytes <= sizes[0]:
            return times[0]
        if nbytes >= sizes[-1]:
            return times[-1] * nbytes / sizes[-1]
        i = bisect.bisect_right(sizes, nbytes)
        x0, x1, y0, y1 = (math.log(v) for v in (sizes[i - 1], sizes[i], times[i - 1], times[i]))
        return math.exp(y0 + (y1 - y0) * (math.log(nbytes) - x0) / (x1 - x0))


@dataclass(frozen=True)
class AlphaBeta:
    """A link of `latency_s` per ring step and `bandwidth_bps` bytes per second (the curve at 2 ranks)."""

    latency_s: float
    bandwidth_bps: float
    kind: str

    @property
    def latency(self) -> float:
        return ring_steps(self.kind, 2) * self.latency_s

    def time(self, nbytes: float) -> float:
        return self.latency + bus_factor(self.kind, 2) * nbytes / self.bandwidth_bps


@dataclass(frozen=True)
class LinkModel:
    curves: dict[str, Curve]  # per collective kind and "p2p"
    world_size: int  # ranks the curves were measured among
    source: str  # where the numbers come from, for the report
    missing: str = ""  # without curves: why, raised when a point needs them

    def curve(self, kind: str) -> Curve:
        if kind not in self.curves:
            raise ConfigError(self.missing or f"links from {self.source} have no {kind} curve")
        return self.curves[kind]

    def collective(self, kind: str, nbytes: float, ranks: int, stride: int = 1) -> float:
        """Seconds for one collective of an `nbytes` buffer among `ranks` ranks (0 for one rank or no bytes), each
        `stride` ranks from the next (measured curves hold the ranks they were measured among: stride aside)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        curve = self.curve(kind)
        n = self.world_size
        latency = curve.latency
        transfer = max(curve.time(nbytes) - latency, 0.0)
        return (latency * ring_steps(kind, ranks) / ring_steps(kind, n)
                + transfer * bus_factor(kind, ranks) / bus_factor(kind, n))

    def send(self, nbytes: float, senders: int = 1) -> float:
        """Seconds to send `nbytes` from one rank to another (beside `senders` - 1 others of its node: measured
        curves are of one send)."""
        return self.curve(P2P).time(nbytes) if nbytes > 0 else 0.0

    @classmethod
    def from_calibration(cls, path: Path, nodes: int = 1) -> LinkModel | None:
        """The curves of the scope a point of `nodes` nodes communicates in (intra-node where the record has
        no inter-node curves: a record taken on one node); None where the record measured no links (a job of
        one rank, e.g. on a machine with one GPU)."""
        return cls.from_record(read_record(path), path, nodes)

    @classmethod
    def from_record(cls, record: dict, path: Path, nodes: int) -> LinkModel | None:
        with reading(path):
            scopes = record["collectives"]
            if not scopes:
                return None
            scope = "inter_node" if nodes > 1 and "inter_node" in scopes else "intra_node"
            collectives = scopes[scope]
            curves: dict[str, Curve] = {kind: _measured(collectives[kind]) for kind in COLLECTIVES}
            curves[P2P] = _measured(record["p2p"][scope]["curve"])
            world = int(collectives["ranks"])
        return cls(curves, world, f"calibration {path.name} ({scope}, {world} ranks)")

    @classmethod
    def from_hardware(cls, latency_us: float, bandwidth_gbs: float, where: str) -> LinkModel:
        curves: dict[str, Curve] = {kind: AlphaBeta(latency_us * 1e-6, bandwidth_gbs * 1e9, kind)
                                    for kind in (*COLLECTIVES, P2P)}
        return cls(curves, 2, f"{where} latency {latency_us} us, bandwidth {bandwidth_gbs} GB/s")


def _measured(rows: list[dict]) -> Measured:
    """A record's rows as a curve; a larger message is never cheaper, so a time below a smaller message's (noise)
    is raised to it."""
    rows = sorted(rows, key=lambda r: r["bytes"])
    times, slowest = [], 0.0
    for row in rows:
        slowest = max(slowest, float(row["time_s"]))
        times.append(slowest)
    return Measured(tuple(float(r["bytes"]) for r in rows), tuple(times))


def calibrated_links(cluster: str, nodes: int) -> list[LinkModel]:
    """The links of each number of ranks the cluster's records measured (in the scope of a point of `nodes`
    nodes), the newest record of each; fewest ranks first."""
    newest: dict[int, tuple[str, LinkModel]] = {}
    for path in calibration_files(cluster):
        record = read_record(path)
        links = LinkModel.from_record(record, path, nodes)
        with reading(path):
            date = str((record.get("provenance") or {}).get("date", ""))
        if links and (links.world_size not in newest or date > newest[links.world_size][0]):
            newest[links.world_size] = date, links
    return [links for _, (_, links) in sorted(newest.items())]


def matmul_tflops(cluster: str, precision: str) -> float | None:
    """The matrix-multiply throughput a cluster's calibration record measured, if any."""
    path = record_path(cluster)
    if not path.exists():
        return None
    record = read_record(path)
    with reading(path):
        value = ((record.get("matmul") or {}).get("tflops") or {}).get(precision)
        return float(value) if value else None


def nearest(counts: Iterable[int], ranks: int) -> int:
    """Of the numbers of ranks a calibration measured, the nearest `ranks` (by ratio; the fewer where two are)."""
    return min(counts, key=lambda count: (abs(math.log(count / max(ranks, 1))), count))


def link_model(cluster, nodes: int, ranks: int, fewer_than: int | None = None) -> LinkModel:
    """The links of a point of `ranks` ranks on `nodes` nodes of a cluster: those its calibration records
    measured among the number of ranks nearest its own (`fewer_than`: only among fewer ranks than that, a point
    held out by worker count), else on GPUs NCCL's model of its catalog fabric (suite.predict.fabric), else its
    hardware's latency and bandwidth (inter-node where the point spans nodes); with neither, no links, which only
    a one-rank point can be priced without."""
    measured = {links.world_size: links for links in calibrated_links(cluster.name, nodes)
                if fewer_than is None or links.world_size < fewer_than}
    if measured:
        return measured[nearest(measured, ranks)]
    path = record_path(cluster.name)
    if will_use_cuda(cluster):
        links = nccl_links(cluster, nodes, ranks)
        return links if not isinstance(links, str) else LinkModel({}, 1, "none", links)
    hw = cluster.hardware
    scope = "inter_node" if nodes > 1 else "intra_node"
    latency, bandwidth = hw.get(f"{scope}_latency_us"), hw.get(f"{scope}_bandwidth_gbs")
    if latency is None or bandwidth is None:
        return LinkModel({}, 1, "none", f"cluster {cluster.name} has no link costs: run `make calibrate "
                         f"CLUSTER={cluster.name}` there with two ranks or more (writes {path}), or set "
                         f"cluster.hardware.{scope}_latency_us and cluster.hardware.{scope}_bandwidth_gbs")
    return LinkModel.from_hardware(latency, bandwidth, f"cluster {cluster.name} hardware ({scope})")
