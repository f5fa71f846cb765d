"""A cluster's calibration record: what `make calibrate` measured (suite.worker.calibrate), kept twice.

- One MLflow run in the experiment `calibration`: params cluster, backend, world size, nodes and the
  settings; metrics `matmul_tflops_<dtype>`, and per scope (`intra_node`, `inter_node`) the curves
  `<scope>_<collective>_{time_s,algbw_gbs,busbw_gbs}` and `<scope>_p2p_{time_s,bandwidth_gbs}` with step = message
  size in bytes, `<scope>_p2p_latency_s`, `<scope>_p2p_bandwidth_gbs_max`; the record below as an artifact.
- results/calibration/<cluster>.yaml, the latest calibration of the cluster, for MFU's peak
  (suite.runtime.utilisation), the performance model, and `make calibrate APPLY=1` (which copies its
  bandwidths and latencies into conf/cluster/<cluster>.yaml): `provenance` (date, hosts, git sha, torch,
  backend, device, ranks, MLflow run), `matmul` (n, threads on CPU, TFLOP/s per math dtype), `collectives`
  (per scope and collective, per size: bytes, time_s, algbw_gbs, busbw_gbs) and `p2p` (per scope: the two ranks,
  latency_s, bandwidth_gbs, the curve). Beside it results/calibration/<cluster>.w<ranks>.yaml, the latest
  calibration among each number of ranks: the performance model prices a point's links from the one nearest its
  ranks (suite.predict.links). Earlier records stay in their job directories and runs.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from suite.errors import ConfigError
from suite.paths import results_dir
from suite.records.point_dir import PointDir
from suite.vocabulary import Collective, Status

if TYPE_CHECKING:  # ranks read the record (MFU's peak): they need not import MLflow, which only the driver writes to
    from mlflow.entities import Metric

    from suite.records.store import Store

RECORD_FILE = "calibration.yaml"  # the record, in its job directory
HEADER = ("# A calibration record, written by `make calibrate` (suite/records/calibration.py). Units: bytes, seconds,\n"
          "# GB/s (1e9 bytes/s), TFLOP/s; busbw is nccl-tests' bus bandwidth.\n")


def record_path(cluster: str, ranks: int | None = None) -> Path:
    """The cluster's latest record, or with `ranks` the latest of those taken among that many ranks."""
    return results_dir() / "calibration" / (f"{cluster}.yaml" if ranks is None else f"{cluster}.w{ranks}.yaml")


def calibration_files(cluster: str, kind: str = "") -> list[Path]:
    """The cluster's files of one kind that exist (records; `kind` "overhead": the library overhead's fits), those
    of each number of ranks (`<cluster>.w<ranks>[.kind].yaml`) first, then the latest (`<cluster>[.kind].yaml`)."""
    suffix = f".{kind}.yaml" if kind else ".yaml"
    per_ranks = re.compile(rf"{re.escape(cluster)}\.w\d+{re.escape(suffix)}")  # not the other kinds beside them
    directory = results_dir() / "calibration"
    latest = directory / f"{cluster}{suffix}"
    return [*sorted(p for p in directory.glob(f"{cluster}.w*{suffix}") if per_ranks.fullmatch(p.name)),
            *([latest] if latest.exists() else [])]


def jobs_dir(cluster: str) -> Path:
    """Where the calibration jobs of a cluster keep their directories (not results/points: not a sweep's)."""
    return results_dir() / "calibration" / "jobs" / cluster


class DamagedRecord(ConfigError):
    """A file under results/calibration/ that is not what its writer wrote (cut short, edited, another file's
    content): said in one line naming it, as a point that cannot be priced; never a traceback."""

    def __init__(self, path: Path, problem: str | Exception) -> None:
        if isinstance(problem, KeyError):
            problem = f"no {problem}"
        elif isinstance(problem, Exception):
            problem = f"{type(problem).__name__}: {problem}"
        writer = ("make bench-model" if path.name.endswith(".correction.yaml")
                  else f"make calibrate CLUSTER={path.name.split('.')[0]}")
        super().__init__(f"{path} is damaged ({problem}): delete it, or `{writer}` writes it again")
        self.path = path


def read_record(path: Path) -> dict[str, Any]:
    """The mapping a calibration file holds (a record, the library overhead's or a fitted correction's)."""
    try:
        record = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        raise DamagedRecord(path, "not YAML" + (f": line {mark.line + 1}, column {mark.column + 1}" if mark else "")
                            ) from e
    if not isinstance(record, dict):
        raise DamagedRecord(path, f"not a mapping but {type(record).__name__}")
    return record


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Around reading a calibration file's fields: a field it lacks, or one of another kind, is damage."""
    try:
        yield
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DamagedRecord(path, e) from e


def load_record(cluster: str) -> dict[str, Any] | None:
    path = record_path(cluster)
    return read_record(path) if path.exists() else None


def curve_metrics(measured: dict[str, Any]) -> list[Metric]:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(f"matmul_tflops_{dtype}", value, now, 0) for dtype, value in measured["matmul"]["tflops"].items()]
    for scope, collectives in measured["collectives"].items():
        for op in Collective:
            metrics += [Metric(f"{scope}_{op}_{key}", point[key], now, point["bytes"])
                        for point in collectives[op] for key in ("time_s", "algbw_gbs", "busbw_gbs")]
    for scope, p2p in measured["p2p"].items():
        metrics += [Metric(f"{scope}_p2p_latency_s", p2p["latency_s"], now, 0),
                    Metric(f"{scope}_p2p_bandwidth_gbs_max", p2p["bandwidth_gbs"], now, 0)]
        metrics += [Metric(f"{scope}_p2p_{key}", point[key], now, point["bytes"])
                    for point in p2p["curve"] for key in ("time_s", "bandwidth_gbs")]
    return metrics


def build_record(out: PointDir, run_id: str, tracking_uri: str) -> dict[str, Any]:
    measured, manifest, point = out.summary(), out.manifest(), out.point()
    provenance = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(out.summary_file.stat().st_mtime)),
        "hosts": manifest["hosts"],
        "git_sha": point["git_sha"],
        "torch": manifest["packages"]["torch"],
        "backend": measured["backend"],
        "device": measured["device"],
        "world_size": measured["world_size"],
        "nodes": measured["nodes"],
        "ranks_per_node": measured["ranks_per_node"],
        "mlflow_run_id": run_id,
        "tracking_uri": tracking_uri,
        "job_dir": str(out.path),
    }
    return {"cluster": point["params"]["cluster"], "provenance": provenance,
            **{key: measured[key] for key in ("matmul", "collectives", "p2p")}}


def write_calibration(out: PointDir, store: Store, tags: dict[str, str], start: float, end: float) -> str:
    """A calibration job's run and, when it finished, its record (in its directory and as the cluster's latest)."""
    point, measured = out.point(), out.summary()
    finished = tags["suite.status"] == Status.finished
    params = {**point["params"], **({"backend": measured["backend"], "device": measured["device"]} if finished else {})}
    run_id = store.write_run(point["experiment"], point["label"], params, tags,
                             curve_metrics(measured) if finished else [], out.artifacts(), start, end)
    if finished:
        record = out.path / RECORD_FILE
        record.write_text(HEADER + yaml.safe_dump(build_record(out, run_id, store.uri), sort_keys=False))
        store.client.log_artifact(run_id, str(record))
        for latest in (record_path(point["params"]["cluster"]),
                       record_path(point["params"]["cluster"], measured["world_size"])):
            latest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record, latest)
    return run_id
