"""Collectives and sends on a GPU cluster's fabric, priced from its datasheet as NCCL prices them.

NCCL chooses, per call, the algorithm and protocol its own cost model says is fastest; that model is public and this
module is it, as of NCCL 2.30.7 (NVIDIA/nccl@5067397c, src/graph/tuning.cc: `ncclTunerConstantsDefaults`,
`ncclTopoTuneModel`), for the algorithms every fabric has and NVLink SHARP where the node has it: time = latency +
bytes / algorithm bandwidth, where

- the ring's latency is a base plus one hop per step, on NVLink or PCIe inside a node and on the network for the
  steps that cross nodes (all-reduce 2(p - 1) steps, 2(n - 1) of them between n nodes; all-gather and reduce-scatter
  p - 1 and n - 1); across nodes a step inside one costs at least the host's network overhead (an x86 Intel host's
  1 us, three times that under Simple: `getNetOverhead`; NCCL takes 2 us on AMD hosts, which the catalog does not
  name), and with one GPU a node every hop is the network tree's; its algorithm bandwidth is the bus bandwidth x p /
  steps;
- the tree (all-reduce only) goes up and down each node's chain and the tree of nodes: 2 ((p/n - 1) hops inside
  plus log2 n between), at half of 92% of the bus bandwidth, at most 80 GB/s beyond two nodes (110 within: NCCL 2.7's
  totals; 2.30 caps it per channel, `perChMaxTreeBws`, and a datasheet does not give the channels);
- protocol Simple has the bus bandwidth; LL (low latency, for small messages) half of it, at most `LL_MAX_GBS`;
  LL128 92% of it (120 of every 128 bytes are data), on NVLink nodes only (NCCL enables it where GPUs reach each
  other over NVLink: `typeIntra <= PATH_NVB`; the NIC is taken to sit on its GPU's PCIe switch, as in DGX nodes);
- NVLink SHARP (NVLS: the NVSwitch reduces) on Hopper and later NVSwitch nodes, all-reduce only (NCCL's model never
  prefers it for all-gather or reduce-scatter): on one node `NVLS_EFFICIENCY` x (g - 1)/g x twice the GPU's NVLink
  (g GPUs, one channel each: `NCCL_MAX_NVLS_ARITY`), across nodes (NVLS tree) at most the network x 2 on two nodes
  (x 1 beyond), and `NVLS_TREE_CHANNEL_GBS` a channel; its latency one NVLS hop, plus 2 log2 n network hops.

Latencies in microseconds, `BASE_US` and `HOP_US`, are tuning.cc's `baseLatencies` and `hwLatencies`. The bus
bandwidth is the slowest link a ring crosses: inside a node the GPU's NVLink (all of its links: NVSwitch, a full
mesh, DGX-1's hybrid cube mesh) or, where GPUs are bridged in pairs or not at all, PCIe (a group of the two GPUs of a
pair: their NVLink); between nodes the node's NICs that the group's GPUs there use: all of them for a group of every
GPU of its nodes, one NIC's share per GPU where the node has a NIC per GPU (DGX's rails) and the group has fewer GPUs
there (a data-parallel group of a tensor- or pipeline-parallel layout: one GPU a node). A send between nodes goes
out through its GPU's NIC, beside the sends of the other GPUs of its stage. NCCL counts an NVLink at 20 GB/s of its
25 (Volta, Ampere; 20.6 on Hopper), PCIe Gen3 x16 at 12 GB/s (src/graph/topo.h, `SM80_NVLINK_BW`, `SM90_NVLINK_BW`,
`PCI_BW`, `NET_BW` 12 per 100 Gbit/s): those shares of the datasheet rates are `ACHIEVED`. A send between two GPUs
is one ring step of Simple at the link between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from suite.config import IntraNodeFabric

SIMPLE, LL, LL128 = "simple", "ll", "ll128"
RING, TREE, NVLS, NVLS_TREE = "ring", "tree", "nvls", "nvls_tree"
BASE_US = {(TREE, LL): 6.8, (TREE, LL128): 14.0, (TREE, SIMPLE): 8.4,
           (RING, LL): 6.6, (RING, LL128): 14.0, (RING, SIMPLE): 8.4,
           (NVLS, SIMPLE): 0.0, (NVLS_TREE, SIMPLE): 0.0}
HOP_US = {  # per link type and (algorithm, protocol)
    "nvlink": {(TREE, LL): 0.6, (TREE, LL128): 1.25, (TREE, SIMPLE): 4.0,
               (RING, LL): 0.6, (RING, LL128): 1.9, (RING, SIMPLE): 3.4,
               (NVLS, SIMPLE): 25.0, (NVLS_TREE, SIMPLE): 25.0},
    "pcie": {(TREE, LL): 1.0, (TREE, LL128): 1.9, (TREE, SIMPLE): 4.0,
             (RING, LL): 1.0, (RING, LL128): 2.5, (RING, SIMPLE): 5.7},
    "net": {(TREE, LL): 5.0, (TREE, LL128): 8.5, (TREE, SIMPLE): 14.0,
            (RING, LL): 2.7, (RING, LL128): 4.0, (RING, SIMPLE): 14.0,
            (NVLS, SIMPLE): 18.0, (NVLS_TREE, SIMPLE): 20.9},
}
NET_OVERHEAD_US = 1.0  # an x86 Intel host's (getNetOverhead), x3 under Simple
# LL's bandwidth cap (llMaxBws): on one node by GPU generation (Volta, Ampere, Hopper); across 2 and more nodes an
# Intel host's
LL_MAX_GBS = {"node": {7: 39.0, 8: 87.7, 9: 141.0}, 2: 39.0, "more": 20.4}
LL128_SHARE = 0.92
TREE_SHARE = 0.92
NVLS_EFFICIENCY = {9: 0.85, 10: 0.74}  # Hopper, Blackwell (nvlsEfficiency)
NVLS_TREE_CHANNEL_GBS = {9: (57.7, 45.5), 10: (96.0, 80.0)}  # two nodes, more (perChMaxNVLSTreeBws)
ACHIEVED = {"nvlink": 20.0 / 25.0, "pcie": 12.0 / 15.75, "net": 12.0 / 12.5}
HOPPER_NVLINK_ACHIEVED = 20.6 / 25.0
PCIE_X16_GBS = {3: 15.75, 4: 31.5, 5: 63.0}  # one direction, x16 (PCI-SIG: 8, 16, 32 GT/s per lane, 128b/130b)
NVLINK_FABRICS = (IntraNodeFabric.nvswitch, IntraNodeFabric.nvlink_mesh, IntraNodeFabric.nvlink_hybrid_cube_mesh)


def generation(compute_capability: float | None) -> int:
    """The GPU's major compute capability as NCCL's tables index it (Volta 7, Ampere 8, Hopper 9, Blackwell 10);
    an unknown one is taken as Ampere."""
    return min(max(int(compute_capability or 8), 7), 10)


@dataclass(frozen=True)
class Fabric:
    """A cluster's links as NCCL sees them: the link type inside a node and the bus bandwidths (GB/s)."""

    intra: str  # "nvlink" or "pcie"
    intra_gbs: float  # a GPU's achieved bandwidth to the others of its node
    pair_gbs: float | None  # NVLink pairs: the achieved bandwidth between the two GPUs of a pair
    net_gbs: float | None  # a node's NICs together, achieved; None: unknown
    gpus_per_node: int
    nics: int = 1  # a node's NICs (the rails its GPUs send on)
    generation: int = 8  # the GPU's major compute capability (`generation`)
    nvswitch: bool = False  # its NVLinks meet in NVSwitches (NVLink SHARP from Hopper on)

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
    gen = generation(hw.compute_capability)
    if fabric in NVLINK_FABRICS and hw.nvlink_bandwidth_gbs:
        intra = "nvlink"
        intra_gbs = hw.nvlink_bandwidth_gbs * (HOPPER_NVLINK_ACHIEVED if gen >= 9 else ACHIEVED["nvlink"])
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
    return Fabric(intra, intra_gbs, pair, net, max(cluster.workers_per_node, 1), nics, gen,
                  fabric == IntraNodeFabric.nvswitch), []


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
        protocols = (SIMPLE, LL, LL128) if intra_hops == "nvlink" else (SIMPLE, LL)
        ll_max = (LL_MAX_GBS["node"][min(self.fabric.generation, 9)] if nodes == 1
                  else LL_MAX_GBS[2] if nodes == 2 else LL_MAX_GBS["more"])
        shares = {SIMPLE: bus, LL: min(ll_max, bus * 0.5), LL128: bus * LL128_SHARE}
        times = []
        for protocol in protocols:
            hop_intra = HOP_US[intra_hops][(RING, protocol)]
            if nodes > 1:
                hop_intra = max(hop_intra, NET_OVERHEAD_US * (3 if protocol == SIMPLE else 1))
            hop_net = HOP_US["net"][(RING if per_node > 1 else TREE, protocol)]
            latency = BASE_US[(RING, protocol)] + (steps - inter_steps) * hop_intra + inter_steps * hop_net
            algbw = shares[protocol] * (ranks / max(steps, 1) if kind != "broadcast" else 1)
            times.append(latency * 1e-6 + nbytes / (algbw * 1e9))
        if kind == "all_reduce":
            tree = min(bus * TREE_SHARE, 80.0 if nodes > 2 else 110.0)
            tree_shares = {SIMPLE: tree, LL: min(tree / 3.8, ll_max),
                           LL128: tree * (7 / 9 if nodes == 1 else 120 / 128)}
            for protocol in protocols:
                latency = BASE_US[(TREE, protocol)] + 2 * ((per_node - 1) * HOP_US[intra_hops][(TREE, protocol)]
                                                           + math.log2(nodes) * HOP_US["net"][(TREE, protocol)])
                times.append(latency * 1e-6 + nbytes / (tree_shares[protocol] * 0.5 * 1e9))
            times += self._nvls_all_reduce(nbytes, ranks, nodes, per_node, steps)
        return min(times)

    def _nvls_all_reduce(self, nbytes: float, ranks: int, nodes: int, per_node: float, steps: int) -> list[float]:
        """NVLink SHARP's all-reduce (one node) or NVLS tree (across nodes), where the node has it."""
        gen, g = self.fabric.generation, math.ceil(per_node)
        if not (self.fabric.nvswitch and gen in NVLS_EFFICIENCY and g >= 2):
            return []
        bus = self.fabric.intra_gbs * NVLS_EFFICIENCY[gen] * (g - 1) / g * 2
        if nodes == 1:
            latency = HOP_US["nvlink"][(NVLS, SIMPLE)]
        else:
            bus = min(bus, self.fabric.net_share(g) * (2 if nodes == 2 else 1),
                      g * NVLS_TREE_CHANNEL_GBS[gen][0 if nodes == 2 else 1])
            hop_net = HOP_US["net"][(NVLS_TREE, SIMPLE)]
            latency = HOP_US["nvlink"][(NVLS_TREE, SIMPLE)] + 2 * math.log2(nodes) * hop_net
        return [latency * 1e-6 + nbytes / (bus * ranks / steps * 1e9)]

    def send(self, nbytes: float, senders: int = 1) -> float:
        """One of `senders` GPUs of a node sending `nbytes` at once (a pipeline stage's tensor-parallel ranks)."""
        if nbytes <= 0:
            return 0.0
        crosses = self.nodes > 1 and self.fabric.net_gbs is not None
        link = "net" if crosses else self.fabric.intra
        bandwidth = self.fabric.net_share(senders) / senders if crosses else self.fabric.intra_gbs
        latency = BASE_US[(RING, SIMPLE)] + HOP_US[link][(RING, SIMPLE)]
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
