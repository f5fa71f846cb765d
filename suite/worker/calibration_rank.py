"""One rank of a calibration job (`make calibrate`): what the performance model and MFU need to know about
a machine, measured the way nccl-tests and a matmul benchmark measure it.

- the dense matmul rate of one device per math dtype (rank 0's; on CPU with every core it may use);
- all-reduce, all-gather, reduce-scatter and broadcast of float32 buffers over message sizes (the whole buffer:
  an all-gather's output, a reduce-scatter's input), among the ranks of each node (`intra_node`, every node at
  once) and, on several nodes, among all ranks (`inter_node`): time, algorithm bandwidth (size / time) and
  bus bandwidth (nccl-tests' `busbw`, `bus_bandwidth`);
- send/recv ping-pong between two ranks of a node and, on several nodes, two ranks of different nodes:
  one-way time per size, latency (one float) and bandwidth.

Every measurement is timed after untimed warm-up calls, over a number of iterations the ranks agree on from
one timed trial (about `seconds` in all), with the device synchronised and the ranks started together; its
time is the slowest rank's. Rank 0 prints a line per measurement and returns the results (the job's summary).
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from suite.layout import node_threads
from suite.runtime.dist import DistEnv
from suite.runtime.manifest import rank_info
from suite.runtime.metrics import SHARE_SENT, synchronize
from suite.runtime.torch_api import matmuls_in_tf32
from suite.shared_names import Collective, MathDtype

log = logging.getLogger("suite")

GB = 1e9  # bandwidths in GB/s, as nccl-tests prints them
FLOAT_BYTES = 4
LATENCY_BYTES = FLOAT_BYTES  # a ping-pong of one float gives the latency
HOOK_OPS = {Collective.all_reduce: "ALLREDUCE", Collective.all_gather: "ALLGATHER",
            Collective.reduce_scatter: "REDUCE_SCATTER", Collective.broadcast: "BROADCAST"}
TORCH_DTYPES = {MathDtype.fp32: torch.float32, MathDtype.tf32: torch.float32, MathDtype.bf16: torch.bfloat16,
                MathDtype.fp16: torch.float16}


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes."""
    if min_bytes < FLOAT_BYTES or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"message sizes {min_bytes}..{max_bytes} by x{factor}: need 4 <= min <= max and factor >= 2")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def bus_bandwidth(op: Collective, algbw: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth (doc/PERFORMANCE.md): the algorithm bandwidth times the share of the buffer
    each rank sends with a ring, 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for
    broadcast (suite.runtime.metrics counts communication with the same factors); comparable with a link's peak."""
    return algbw * SHARE_SENT[HOOK_OPS[op]](ranks, False)


def default_dtypes(device_type: str, capability: tuple[int, int] | None = None) -> list[str]:
    """The math dtypes measured unless configured: bf16 on a GPU only where it is native (compute capability 8.0,
    Ampere, on), as a V100's bf16 is emulated and its rate no peak."""
    if device_type == "cuda":
        native_bf16 = [MathDtype.bf16] if capability >= (8, 0) else []
        return [MathDtype.fp32, MathDtype.tf32, *native_bf16, MathDtype.fp16]
    return [MathDtype.fp32, MathDtype.bf16]


def collective_runs(api, group, whole: torch.Tensor, part: torch.Tensor) -> dict[Collective, Callable[[], object]]:
    """Each collective on `whole` (the all-gather's output, the reduce-scatter's input) and `part` (one rank's
    share) in `group`, through `api` (torch.distributed): with the names of the torch at hand, as the oldest the
    suite runs on lacks `all_gather_single`, `reduce_scatter_single` and broadcast's `group_src`."""
    all_gather = getattr(api, "all_gather_single", None) or api.all_gather_into_tensor
    reduce_scatter = getattr(api, "reduce_scatter_single", None) or api.reduce_scatter_tensor
    if "group_src" in inspect.signature(api.broadcast).parameters:
        source = {"group_src": 0}
    else:
        source = {"src": api.get_global_rank(group, 0)}
    return {
        Collective.all_reduce: lambda: api.all_reduce(whole, group=group),
        Collective.all_gather: lambda: all_gather(whole, part, group=group),
        Collective.reduce_scatter: lambda: reduce_scatter(part, whole, group=group),
        Collective.broadcast: lambda: api.broadcast(whole, group=group, **source),
    }


@dataclass(frozen=True)
class Scope:
    """Ranks measured together: the ranks of each node, or all of them."""

    name: str  # intra_node | inter_node
    group: dist.ProcessGroup  # this rank's group in the scope
    ranks: int
    pair: tuple[int, int] | None  # the two ranks of the send/recv ping-pong (None: no two ranks in the scope)


def scopes(env: DistEnv) -> list[Scope]:
    """`intra_node` (the ranks of each node; every rank calls this), and `inter_node` on several nodes."""
    per_node = env.local_world_size
    nodes = env.world_size // per_node
    if nodes == 1:
        node_group = dist.group.WORLD
    else:
        node_group, _ = dist.new_subgroups(group_size=per_node)
    found = [Scope("intra_node", node_group, per_node, (0, 1) if per_node > 1 else None)]
    if nodes > 1:
        found.append(Scope("inter_node", dist.group.WORLD, env.world_size, (0, per_node)))
    return found


class Calibration:
    def __init__(self, settings, env: DistEnv) -> None:
        self.settings, self.env = settings, env

    def _slowest(self, seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64, device=self.env.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return value.item()

    def _clock(self, run: Callable[[], object], iterations: int, together: bool = True) -> float:
        """Seconds `iterations` calls of `run` take here; `together`: every rank starts at once."""
        synchronize(self.env.device)
        if together:
            dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            run()
        synchronize(self.env.device)
        return time.perf_counter() - start

    def _iterations(self, trial_s: float, seconds: float) -> int:
        s = self.settings
        return max(s.min_iterations, min(s.max_iterations, math.ceil(seconds / max(trial_s, 1e-9))))

    def timed(self, run: Callable[[], object]) -> tuple[float, int]:
        """Seconds per call of `run` (the slowest rank's) and the calls timed; every rank calls it, each with its
        own part (a no-op on ranks that take no part)."""
        for _ in range(self.settings.warmup_iterations):
            run()
        iterations = self._iterations(self._slowest(self._clock(run, 1)), self.settings.seconds)
        return self._slowest(self._clock(run, iterations)) / iterations, iterations

    def matmul(self, dtype: str, n: int) -> float:
        """TFLOP/s of an n x n x n product on this rank's device (2 n^3 FLOPs)."""
        kind = TORCH_DTYPES[dtype]
        a, b = (torch.randn(n, n, device=self.env.device).to(kind) for _ in range(2))
        out = torch.empty(n, n, dtype=kind, device=self.env.device)
        with matmuls_in_tf32(dtype == MathDtype.tf32):
            for _ in range(self.settings.warmup_iterations):
                torch.mm(a, b, out=out)
            trial = self._clock(lambda: torch.mm(a, b, out=out), 1, together=False)
            iterations = max(1, min(self.settings.max_iterations,
                                    math.ceil(self.settings.matmul_seconds / max(trial, 1e-9))))
            seconds = self._clock(lambda: torch.mm(a, b, out=out), iterations, together=False) / iterations
        tflops = 2 * n**3 / seconds / 1e12
        log.info("calibrate: matmul %s n=%d: %.4g TFLOP/s (%d iterations)", dtype, n, tflops, iterations)
        return tflops

    def matmuls(self) -> dict:
        """Rank 0's device, every math dtype (the other ranks wait). On CPU the device is the node: rank 0 runs
        with the threads of all its ranks (at most the node's cores), as a point's ranks on a node share its cores (see
        suite.runtime.metrics)."""
        s = self.settings
        n = s.matmul_n or (8192 if self.env.device.type == "cuda" else 2048)
        cpu = self.env.device.type == "cpu"
        threads = node_threads(torch.get_num_threads(), self.env.local_world_size) if cpu else None
        result = {"n": n, "threads": threads, "tflops": {}}
        if self.env.is_main:
            kept = torch.get_num_threads()
            if threads:
                torch.set_num_threads(threads)
            try:
                device = self.env.device
                capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
                dtypes = s.dtypes or default_dtypes(device.type, capability)
                result["tflops"] = {dtype: self.matmul(dtype, n) for dtype in dtypes}
            finally:
                torch.set_num_threads(kept)
        dist.barrier()
        return result

    def collective(self, op: Collective, scope: Scope, size: int) -> dict:
        """One collective of `size` bytes (rounded down to whole floats per rank) in every group of the scope."""
        p = scope.ranks
        elements = size // FLOAT_BYTES // p * p
        device = self.env.device
        whole = torch.zeros(elements, device=device)
        part = torch.zeros(elements // p, device=device)
        run = collective_runs(dist, scope.group, whole, part)[op]
        seconds, iterations = self.timed(run)
        nbytes = elements * FLOAT_BYTES
        algbw = nbytes / seconds / GB
        busbw = bus_bandwidth(op, algbw, p)
        log.info("calibrate: %s %s %s: %.4g ms, algbw %.4g GB/s, busbw %.4g GB/s (%d iterations)", scope.name, op,
                 readable(nbytes), seconds * 1e3, algbw, busbw, iterations)
        return {"bytes": nbytes, "time_s": seconds, "algbw_gbs": algbw, "busbw_gbs": busbw, "iterations": iterations}

    def ping_pong(self, scope: Scope, size: int) -> dict:
        """One-way time of `size` bytes between the scope's pair: half a send/recv round trip."""
        first, second = scope.pair
        buffer = torch.zeros(size // FLOAT_BYTES, device=self.env.device)
        size = buffer.numel() * FLOAT_BYTES
        rank = self.env.rank

        def run() -> None:
            if rank == first:
                dist.send(buffer, second)
                dist.recv(buffer, second)
            elif rank == second:
                dist.recv(buffer, first)
                dist.send(buffer, first)

        round_trip, iterations = self.timed(run)
        seconds = round_trip / 2
        bandwidth = size / seconds / GB
        log.info("calibrate: %s send/recv %d<->%d %s: %.4g ms one way, %.4g GB/s (%d iterations)", scope.name,
                 first, second, readable(size), seconds * 1e3, bandwidth, iterations)
        return {"bytes": size, "time_s": seconds, "bandwidth_gbs": bandwidth, "iterations": iterations}

    def p2p(self, scope: Scope, sizes: list[int]) -> dict:
        latency = self.ping_pong(scope, LATENCY_BYTES)["time_s"]
        curve = [self.ping_pong(scope, size) for size in sizes]
        return {"ranks": list(scope.pair), "latency_s": latency,
                "bandwidth_gbs": max(point["bandwidth_gbs"] for point in curve), "curve": curve}

    def run(self) -> dict:
        s = self.settings
        sizes = message_sizes(s.min_bytes, s.max_bytes, s.size_factor)
        result = {"device": rank_info(self.env.device)["device"], "backend": self.env.backend,
                  "world_size": self.env.world_size, "ranks_per_node": self.env.local_world_size,
                  "nodes": self.env.world_size // self.env.local_world_size, "matmul": self.matmuls(),
                  "collectives": {}, "p2p": {}}
        for scope in scopes(self.env):
            if scope.ranks > 1:
                result["collectives"][scope.name] = {"ranks": scope.ranks, **{
                    op: [self.collective(op, scope, size) for size in sizes] for op in Collective}}
            if scope.pair:
                result["p2p"][scope.name] = self.p2p(scope, sizes)
        return result


def readable(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
