"""A cluster's calibration record: what `make calibrate` measured (suite.worker.calibration_rank), kept twice.

- One MLflow run in the experiment `calibration`: params cluster, backend, world size, nodes and the
  settings; metrics `matmul_tflops_<dtype>`, and per scope (`intra_node`, `inter_node`) the curves
  `<scope>_<collective>_{time_s,algbw_gbs,busbw_gbs}` and `<scope>_p2p_{time_s,bandwidth_gbs}` with step = message
  size in bytes, `<scope>_p2p_latency_s`, `<scope>_p2p_bandwidth_gbs_max`; the record below as an artifact.
- results/calibration/<cluster>.yaml, the latest calibration of the cluster, for MFU's peak
  (suite.runtime.metrics), the performance model, and `make calibrate APPLY=1` (which copies its
  bandwidths and latencies into conf/cluster/<cluster>.yaml): `provenance` (date, hosts, git sha, torch,
  backend, device, ranks, MLflow run), `matmul` (n, threads on CPU, TFLOP/s per math dtype), `collectives`
  (per scope and collective, per size: bytes, time_s, algbw_gbs, busbw_gbs) and `p2p` (per scope: the two ranks,
  latency_s, bandwidth_gbs, the curve). Beside it results/calibration/<cluster>.w<ranks>.yaml, the latest
  calibration among each number of ranks: the performance model prices a point's links from the one nearest its
  ranks (suite.predict.links). Earlier records stay in their job directories and runs.
"""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

import yaml

from suite.paths import record_path
from suite.point_dir import PointDir
from suite.shared_names import Collective, Status

if TYPE_CHECKING:  # ranks read the record (MFU's peak): they need not import MLflow, which only the driver writes to
    from mlflow.entities import Metric

    from suite.records.store import Store

RECORD_FILE = "calibration.yaml"  # the record, in its job directory
HEADER = ("# A calibration record, written by `make calibrate` (suite/records/calibration.py). Units: bytes, seconds,\n"
          "# GB/s (1e9 bytes/s), TFLOP/s; busbw is nccl-tests' bus bandwidth.\n")


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


def build_record(point_dir: PointDir, run_id: str, tracking_uri: str) -> dict[str, Any]:
    measured, manifest, point = point_dir.summary(), point_dir.manifest(), point_dir.point()
    provenance = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(point_dir.summary_file.stat().st_mtime)),
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
        "job_dir": str(point_dir.path),
    }
    return {"cluster": point["params"]["cluster"], "provenance": provenance,
            **{key: measured[key] for key in ("matmul", "collectives", "p2p")}}


def write_calibration(point_dir: PointDir, store: Store, tags: dict[str, str], start: float, end: float) -> str:
    """A calibration job's run and, when it finished, its record (in its directory and as the cluster's latest)."""
    point, measured = point_dir.point(), point_dir.summary()
    finished = tags["suite.status"] == Status.finished
    params = {**point["params"], **({"backend": measured["backend"], "device": measured["device"]} if finished else {})}
    run_id = store.write_run(point["experiment"], point["label"], params, tags,
                             curve_metrics(measured) if finished else [], point_dir.artifacts(), start, end)
    if finished:
        record = point_dir.path / RECORD_FILE
        record.write_text(HEADER + yaml.safe_dump(build_record(point_dir, run_id, store.uri), sort_keys=False))
        store.client.log_artifact(run_id, str(record))
        for latest in (record_path(point["params"]["cluster"]),
                       record_path(point["params"]["cluster"], measured["world_size"])):
            latest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record, latest)
    return run_id
