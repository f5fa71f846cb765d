"""Collectives and sends on a GPU cluster's fabric, priced from its datasheet as NCCL prices them.

NCCL chooses, per call, the algorithm and protocol its own cost model says is fastest; that model is public
(NVIDIA/nccl, src/graph/tuning.cc, `ncclTopoTuneModel` and `ncclTopoGetAlgoTime`) and this module is it, for
the algorithms and protocols every fabric has: time = latency + bytes / algorithm bandwidth, where

- the ring's latency is a base plus one hop per step, on NVLink or PCIe inside a node and on the network for
  the steps that cross nodes (all-reduce 2(p - 1) steps, 2(n - 1) of them between n nodes; all-gather and
  reduce-scatter p - 1 and n - 1); its algorithm bandwidth is the bus bandwidth x p / steps;
- the tree (all-reduce only) goes up and down each node's chain and the tree of nodes: 2 ((p/n - 1) hops inside
  plus log2 n between), at half the bus bandwidth, 90% of it, at most 80 GB/s beyond two nodes (110 within);
- protocol Simple has the ring's full bus bandwidth; LL (low latency, for small messages) a quarter of it
  (a third on one node for all-gather and reduce-scatter) at a fraction of the latency.

Latencies in microseconds, `BASE_US` and `HOP_US`, are tuning.cc's `baseLat` and `hwLat`. The bus bandwidth is
the slowest link a ring crosses: inside a node the GPU's NVLink (all of its links: NVSwitch, a full mesh, DGX-1's
hybrid cube mesh) or, where GPUs are bridged in pairs or not at all, PCIe (a group of the two GPUs of a pair:
their NVLink); between nodes the node's NICs that the group's GPUs there use: all of them for a group of every GPU
of its nodes, one NIC's share per GPU where the node has a NIC per GPU (DGX's rails) and the group has fewer GPUs
there (a data-parallel group of a tensor- or pipeline-parallel layout: one GPU a node). A send between nodes goes
out through its GPU's NIC, beside the sends of the other GPUs of its stage. NCCL counts NVLink at 20 GB/s per
25 GB/s link and PCIe Gen3 x16 at 12 GB/s (src/graph/topo.h, `SM70/SM80_NVLINK_BW`, `PCI_BW`, `NET_BW` 12 per
100 Gbit/s): those shares of the datasheet rates are `ACHIEVED`. A send between two GPUs is one ring step of
Simple at the link between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from suite.config import IntraNodeFabric

SIMPLE, LL = "simple", "ll"
BASE_US = {("ring", LL): 3.6, ("ring", SIMPLE): 8.4, ("tree", SIMPLE): 0.0}
HOP_US = {  # per link type: ring LL, ring Simple, tree Simple
    "nvlink": {("ring", LL): 0.47, ("ring", SIMPLE): 3.4, ("tree", SIMPLE): 28.0},
    "pcie": {("ring", LL): 1.0, ("ring", SIMPLE): 5.7, ("tree", SIMPLE): 28.0},
    "net": {("ring", LL): 2.7, ("ring", SIMPLE): 9.6, ("tree", SIMPLE): 50.0},
}
ACHIEVED = {"nvlink": 20.0 / 25.0, "pcie": 12.0 / 15.75, "net": 12.0 / 12.5}
PCIE_X16_GBS = {3: 15.75, 4: 31.5, 5: 63.0}  # one direction, x16 (PCI-SIG: 8, 16, 32 GT/s per lane, 128b/130b)
NVLINK_FABRICS = (IntraNodeFabric.nvswitch, IntraNodeFabric.nvlink_mesh, IntraNodeFabric.nvlink_hybrid_cube_mesh)


@dataclass(frozen=True)
class Fabric:
    """A cluster's links as NCCL sees them: the link type inside a node and the bus bandwidths (GB/s)."""

    intra: str  # "nvlink" or "pcie"
    intra_gbs: float  # a GPU's achieved bandwidth to the others of its node
    pair_gbs: float | None  # NVLink pairs: the achieved bandwidth between the two GPUs of a pair
    net_gbs: float | None  # a node's NICs together, achieved; None: unknown
    gpus_per_node: int
    nics: int = 1  # a node's NICs (the rails its GPUs send on)

    def net_share(self, gpus: int) -> float:
        """The network bandwidth (GB/s) that `gpus` GPUs of a node sending at once have together: the NICs they
        use, one each where the node has a NIC per GPU."""
        nics = max(self.nics, 1)
        return (self.net_gbs or 0.0) * min(max(gpus, 1), nics) / nics


def fabric_of(cluster) -> tuple[Fabric | None, list[str]]:
    """The cluster's fabric from its catalog entry, or the keys it lacks."""
    hw = cluster.hardware
    missing = []
    fabric = hw.intra_node_fabric
    if fabric in NVLINK_FABRICS and hw.nvlink_bandwidth_gbs:
        intra, intra_gbs = "nvlink", hw.nvlink_bandwidth_gbs * ACHIEVED["nvlink"]
    elif fabric is not None and fabric not in NVLINK_FABRICS and (hw.intra_node_bandwidth_gbs
                                                                  or hw.pcie_generation in PCIE_X16_GBS):
        stated = hw.intra_node_bandwidth_gbs or PCIE_X16_GBS[hw.pcie_generation]
        intra, intra_gbs = "pcie", stated * ACHIEVED["pcie"]
    else:
        missing.append("intra_node_fabric, with nvlink_bandwidth_gbs (an NVLink fabric) or pcie_generation or "
                       "intra_node_bandwidth_gbs (PCIe, NVLink pairs)")
        intra, intra_gbs = "pcie", 0.0
    nics = 1
    if hw.nics_per_node and hw.nic_bandwidth_gbs:
        net, nics = hw.nics_per_node * hw.nic_bandwidth_gbs * ACHIEVED["net"], hw.nics_per_node
    elif hw.inter_node_bandwidth_gbs:
        net = hw.inter_node_bandwidth_gbs * ACHIEVED["net"]
    else:
        net = None
    pair = None
    if fabric == IntraNodeFabric.nvlink_pairs:
        if hw.nvlink_pair_bandwidth_gbs:
            pair = hw.nvlink_pair_bandwidth_gbs * ACHIEVED["nvlink"]
        else:
            missing.append("nvlink_pair_bandwidth_gbs (NVLink pairs: the links between the two GPUs of a pair)")
    if missing:
        return None, missing
    return Fabric(intra, intra_gbs, pair, net, max(cluster.workers_per_node, 1), nics), []


@dataclass(frozen=True)
class NcclLinks:
    """Collectives among the ranks of a point of `nodes` nodes on a fabric (the LinkModel interface)."""

    fabric: Fabric
    nodes: int
    source: str
    world_size: int = 0
    missing: str = ""

    def _span(self, ranks: int, stride: int) -> int:
        """Nodes a group of `ranks`, each `stride` ranks from the next, spans: as few as hold it (tensor-parallel
        groups inside a node, data-parallel groups over whole nodes, a group of one rank per stage or tensor-parallel
        group over as many nodes as those fill)."""
        per_node = max(1, self.fabric.gpus_per_node // max(stride, 1))
        return min(self.nodes, max(1, math.ceil(ranks / per_node)))

    def _bus_gbs(self, nodes: int, per_node: float) -> float:
        if nodes == 1:
            return self.fabric.intra_gbs
        net = self.fabric.net_share(math.ceil(per_node)) if self.fabric.net_gbs else self.fabric.intra_gbs
        return min(self.fabric.intra_gbs, net)

    def collective(self, kind: str, nbytes: float, ranks: int, stride: int = 1) -> float:
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        nodes = self._span(ranks, stride)
        per_node = ranks / nodes
        if kind == "all_reduce":
            steps, inter_steps = 2 * (ranks - 1), 2 * (nodes - 1)
        elif kind in ("all_gather", "reduce_scatter"):
            steps, inter_steps = ranks - 1, nodes - 1
        else:  # broadcast: pipelined along the ring, one hop's latency
            steps, inter_steps = 1, 1 if nodes > 1 else 0
        bus = self._bus_gbs(nodes, per_node)
        intra_hops = self.fabric.intra
        if ranks == 2 and nodes == 1 and self.fabric.pair_gbs:  # the two GPUs of an NVLink pair
            bus, intra_hops = self.fabric.pair_gbs, "nvlink"
        times = []
        for protocol in (SIMPLE, LL):
            hop_intra = HOP_US[intra_hops][("ring", protocol)] * (1.8 if nodes > 1 and protocol == LL else 1)
            latency = (BASE_US[("ring", protocol)] + (steps - inter_steps) * hop_intra
                       + inter_steps * HOP_US["net"][("ring", protocol)])
            if protocol == SIMPLE and kind == "all_reduce" and nodes > 1 and nbytes >= ranks / 16 * 65536:
                latency *= 1.9  # tuning.cc: the ring's plateau
            share = 1 / 4 if protocol == LL and (nodes > 1 or kind == "all_reduce") else 1 / 3 if protocol == LL else 1
            algbw = bus * share * (ranks / max(steps, 1) if kind != "broadcast" else 1)
            times.append(latency * 1e-6 + nbytes / (algbw * 1e9))
        if kind == "all_reduce":
            tree_bus = min(bus * 0.9, 80.0 if nodes > 2 else 110.0)
            latency = 2 * ((per_node - 1) * HOP_US[intra_hops][("tree", SIMPLE)]
                           + math.log2(nodes) * HOP_US["net"][("tree", SIMPLE)])
            times.append(latency * 1e-6 + nbytes / (tree_bus * 0.5 * 1e9))
        return min(times)

    def send(self, nbytes: float, senders: int = 1) -> float:
        """One of `senders` GPUs of a node sending `nbytes` at once (a pipeline stage's tensor-parallel ranks)."""
        if nbytes <= 0:
            return 0.0
        crosses = self.nodes > 1 and self.fabric.net_gbs is not None
        link = "net" if crosses else self.fabric.intra
        bandwidth = self.fabric.net_share(senders) / senders if crosses else self.fabric.intra_gbs
        latency = BASE_US[("ring", SIMPLE)] + HOP_US[link][("ring", SIMPLE)]
        return latency * 1e-6 + nbytes / (bandwidth * 1e9)


def nccl_links(cluster, nodes: int, ranks: int) -> NcclLinks | str:
    """The links of a point on the cluster's fabric, or what its catalog entry lacks (as a message)."""
    fabric, missing = fabric_of(cluster)
    if fabric is None:
        return (f"cluster {cluster.name} cannot price its links from its datasheet: fill "
                + "; ".join(f"cluster.hardware.{key}" for key in missing)
                + f" (conf/cluster/{cluster.name}.yaml), or run `make calibrate CLUSTER={cluster.name}` there")
    if nodes > 1 and fabric.net_gbs is None:
        return (f"cluster {cluster.name} spans {nodes} nodes but its catalog entry has no network bandwidth: fill "
                f"cluster.hardware.nics_per_node and nic_bandwidth_gbs (or inter_node_bandwidth_gbs)")
    where = (f"{fabric.intra} {fabric.intra_gbs:.0f} GB/s"
             + (f", the two GPUs of an NVLink pair {fabric.pair_gbs:.0f} GB/s" if fabric.pair_gbs else "")
             + (f", network {fabric.net_gbs:.0f} GB/s per node" if nodes > 1 else ""))
    return NcclLinks(fabric, nodes, f"datasheet: NCCL's model on {where}", ranks)
