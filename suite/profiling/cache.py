"""Profiles measured once and stored: the parent of a profile, which starts its children
(suite.profiling.measure) and keeps what they print as JSON files under `results/profiles/`, named by what they
were taken on and a digest of the rest, so that a sweep or a recommendation profiles each (network, data shape,
batch, precision, optimizer, device, threads) once. The performance model (suite.predict) reads them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import OmegaConf

from suite.errors import ConfigError
from suite.paths import results_dir
from suite.point_dir import error_line
from suite.profiling.profiles import VERSION, DataProfile, Profile, WorkerThreadProfile, window_s
from suite.runtime.gpu_query import first_gpu
from suite.strategies import missing_library

# A point whose network is negligible: what its rank holds is the framework's (see `rank_base_mb`).
NEGLIGIBLE = ["dataset=tokens", "network=gpt2_nano", "dataset.vocab_size=16", "dataset.seq_len=4", "dataset.samples=8",
              "dataset.val_samples=2", "batch_size=2", "epochs=1", "steps_per_epoch=1", "warmup_steps=1",
              "eval_batches=1", "optimizer.name=adam", "workers=1", "cluster=local"]

T = TypeVar("T")  # what a cached profile is read as
# A CPU profile taken while other work kept more than this share of the machine's cores busy measured the other work
# too: issue 59's cached ResNet-18 step of 6.35 s on a machine that runs it in 0.5 s. Such a cache is taken again
# once the machine is quieter than this (taken again on a machine still busy, it would measure the same work again).
LOADED_SHARE = 0.5
LOAD_SAMPLE_S = 0.25  # how long the cores' busy time is sampled before a profile starts


def busy_share() -> float:
    """The share of the machine's cores busy with other work now: their busy time over LOAD_SAMPLE_S (/proc/stat,
    while this process waits), else the 1-minute load average per core (which the profiles just taken raise too)."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return os.getloadavg()[0] / (os.cpu_count() or 1)

    def ticks() -> tuple[int, int]:
        values = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]  # user .. steal
        return sum(values), values[3] + values[4]  # all, idle + iowait

    total, idle = ticks()
    time.sleep(LOAD_SAMPLE_S)
    total_after, idle_after = ticks()
    return 1 - (idle_after - idle) / max(total_after - total, 1)


def device_name(device: torch.device) -> str:
    """The model of this machine's device of `device`'s type, asked without a CUDA context (`first_gpu`: the GPU
    that profiles run on)."""
    if device.type == "cuda":
        return first_gpu().name
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    return names[0] if names else platform.machine()


def _key(cfg, batch: int, device: torch.device, threads: int, parts: tuple[str, ...]) -> dict[str, Any]:
    key = {part: OmegaConf.to_container(cfg[part], resolve=True) for part in parts}
    # How many samples there are, and where they are read from, changes neither shape nor cost of a batch.
    key["dataset"] = {k: v for k, v in key["dataset"].items() if k not in ("path", "samples", "val_samples")}
    if "network" in key:  # what it was chosen by: its name, architecture and dimensions say what is built
        key["network"] = {k: v for k, v in key["network"].items() if k not in ("family", "size")}
    return {**key, "batch": batch, "precision": cfg.precision, "device": f"{device.type}:{device_name(device)}",
            "threads": threads, "torch": torch.__version__, "version": VERSION}


def _path(kind: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = key.get("network", {}).get("name") or key["dataset"]["name"]
    stem = f"{kind}-{name}-b{key['batch']}-{key['precision']}-t{key['threads']}-{digest}"
    return results_dir() / "profiles" / f"{stem}.json"


def _stored(kind: str, key: dict[str, Any], parse: Callable[[dict[str, Any]], T]) -> T | None:
    """The profile of `key` (`parse`d) from results/profiles/, if there is one to use. A stored file that does not
    parse (cut short by a full disk or a killed process, edited) is said on stderr and discarded; so is one taken
    on a loaded CPU, once the machine is quieter."""
    path = _path(kind, key)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        busy = data.get("taken", {}).get("busy_share", 0.0)
        if not (key.get("device", "").startswith("cpu") and busy > LOADED_SHARE >= busy_share()):
            return parse(data)
        print(f"note: profile cache {path} was taken with {busy:.0%} of the cores busy with other work: "
              "profiling again", file=sys.stderr, flush=True)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, or not a profile of this version
        print(f"warning: profile cache {path} is damaged ({error_line(e)}): discarded, profiling again",
              file=sys.stderr, flush=True)
    path.unlink(missing_ok=True)
    return None


def _store(kind: str, key: dict[str, Any], taken: dict[str, Any], result: dict[str, Any],
           parse: Callable[[dict[str, Any]], T]) -> T:
    data = {"key": key, "taken": taken, **result}
    path = _path(kind, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return parse(data)


def _taken(key: dict[str, Any]) -> dict[str, Any]:
    """When a profile is taken, how busy the cores were with other work as it started, and its timing window."""
    return {"at": time.time(), "busy_share": busy_share() if key.get("device", "").startswith("cpu") else 0.0,
            "window_s": window_s()}


def _cached(kind: str, key: dict[str, Any], take: Callable[[], dict[str, Any]],
            parse: Callable[[dict[str, Any]], T]) -> tuple[T, bool]:
    """The profile of `key` (`parse`d) from results/profiles/, or taken now and stored; and whether it was stored
    before."""
    found = _stored(kind, key, parse)
    if found is not None:
        return found, True
    return _store(kind, key, _taken(key), take(), parse), False


def network_profile(cfg, batch: int, device: torch.device, threads: int, together: int = 1,
                    data_batch: int | None = None) -> tuple[Profile, bool]:
    """The profile of the point's network at `batch` (and whether it came from the cache), taken by `together`
    processes at once (see `_in_children`); with a `data_batch`, the same children take the data's profile at it
    where none is stored (`data_profile` then finds it: one child, not two)."""
    key = {**_key(cfg, batch, device, threads, ("network", "dataset", "optimizer")), "together": together}
    found = _stored("net", key, Profile.from_json)
    if found is not None:
        return found, True
    taken = _taken(key)
    data_key = {**_key(cfg, data_batch, device, threads, ("dataset",)), "together": together} if data_batch else None
    if data_key is None or _stored("data", data_key, DataProfile.from_json) is not None:
        return _store("net", key, taken, _in_children({"network": batch}, cfg, device, threads, together)["network"],
                      Profile.from_json), False
    both = _in_children({"network": batch, "data": data_batch}, cfg, device, threads, together)
    _store("data", data_key, taken, both["data"], DataProfile.from_json)
    return _store("net", key, taken, both["network"], Profile.from_json), False


def data_profile(cfg, batch: int, device: torch.device, threads: int, together: int = 1) -> tuple[DataProfile, bool]:
    key = {**_key(cfg, batch, device, threads, ("dataset",)), "together": together}
    return _cached("data", key, lambda: _in_children({"data": batch}, cfg, device, threads, together)["data"],
                   DataProfile.from_json)


def worker_thread_profile(cfg, batch: int, device: torch.device, threads: int,
                          together: int = 1) -> tuple[WorkerThreadProfile, bool]:
    key = {**_key(cfg, batch, device, threads, ("network", "dataset")), "together": together}  # no optimizer step
    return _cached("thread", key, lambda: _in_children({"thread": batch}, cfg, device, threads, together)["thread"],
                   WorkerThreadProfile.from_json)


def _in_children(batches: dict[str, int], cfg, device: torch.device, threads: int,
                 together: int) -> dict[str, dict[str, Any]]:
    """Profile (each of `batches`: network, data or thread, at its batch, in turn) in `together` children at once,
    forked from the fork server (launchers.fork_server) as ranks are, each with the threads a rank gets
    (OMP_NUM_THREADS): as many as the point's ranks that share this node's cores, so that what they take from each
    other (cores, caches, memory bandwidth) is in the times, and neither this process's threads nor its memory are.
    Each time is the median over the children; the rest is the first child's."""
    from launchers.fork_server import fork_server

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
        config.write(OmegaConf.to_yaml(cfg, resolve=True))
        config.flush()
        argv = ["suite.profiling.measure", ",".join(batches), ",".join(map(str, batches.values())), str(device),
                config.name]
        server = fork_server(env)
        children = []
        try:
            children = [server.start(argv, env) for _ in range(together)]
            with ThreadPoolExecutor(together) as readers:  # each child's output read as it comes: none blocks
                outputs = list(readers.map(lambda child: child.stdout.read(), children))
            codes = [child.wait() for child in children]
        except BaseException:  # Ctrl-C: the children lead process groups of their own, which the terminal's misses
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
            raise
        finally:
            for child in children:
                child.stdout.close()
    results = []
    for code, output in zip(codes, outputs):
        lines = [line for line in output.splitlines() if line.strip()]
        if code:
            batch = max(batches.values())
            raise ConfigError(f"profiling {cfg.network.name} at batch {batch} failed: {lines[-1] if lines else '?'}")
        results.append(json.loads(next(line for line in reversed(lines) if line.startswith("{"))))
    return {what: _median_times([r[what] for r in results]) for what in batches}


def _median_times(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The first result, each of its times (`*_s`, also per layer) the median over all results."""
    first = dict(results[0])
    for name in (k for k in first if k.endswith("_s")):
        first[name] = statistics.median(r[name] for r in results)
    if "layers" in first:
        first["layers"] = [{**layer, **{k: statistics.median(r["layers"][i][k] for r in results)
                                        for k in layer if k.endswith("_s")}}
                           for i, layer in enumerate(first["layers"])]
    return first


def rank_base_mb(strategy: str, threads: int) -> float:
    """Peak memory of a rank of `strategy` training a negligible network (a one-block GPT-2 of width 8), one step
    on one worker, started here as a sweep starts its ranks: what the framework, its libraries and the rank's
    own machinery hold before a model (on CPU the resident set, on GPU the CUDA context and allocator)."""
    from launchers import launch
    from suite.sweep.plan import new_point_dir, plan

    key = {"strategy": strategy, "threads": threads, "device": f"{'cuda' if torch.cuda.is_available() else 'cpu'}:"
           f"{device_name(torch.device('cuda' if torch.cuda.is_available() else 'cpu'))}", "torch": torch.__version__,
           "python": sys.version, "batch": 0, "precision": "fp32", "dataset": {"name": "rank"}, "version": VERSION}

    def take() -> dict[str, Any]:
        (point,) = plan([[*NEGLIGIBLE, f"strategy={strategy}", f"cluster.threads_per_worker={threads}"]],
                        experiment="rank-base")
        missing = missing_library(point.strategy)
        if missing:
            raise ConfigError(missing)
        out = new_point_dir(point)
        try:
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                   "SUITE_POINT_LABEL": f"[base memory of a {strategy} rank]"}
            launch("local", out.path, point.processes, point.cfg.timeout_s, env, point.rank_launcher)
            summary = out.summary()
            if not summary:
                raise ConfigError(f"a one-step {strategy} rank with a negligible network did not finish here, so its "
                                  f"base memory is unknown: see {out.path}")
            return {"peak_mb": summary["peak_memory_mb"]}
        finally:
            if out.summary():
                shutil.rmtree(out.path, ignore_errors=True)
    peak_mb, _ = _cached("base", key, take, lambda data: float(data["peak_mb"]))
    return peak_mb
