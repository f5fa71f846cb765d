"""A point's directory: the only channel between the driver, the ranks and whoever records the point.

The driver writes the resolved config, `point.json` (what the MLflow run will be called and carry)
and, for a batch job, `job.json` (scheduler and job id). Rank 0 appends one JSON line per finished
epoch, so a point that crashes or is killed still has the epochs it completed. Any rank that fails
writes its own error file. Whoever records the point (the driver, the job's last step or
`make collect`) claims it first and leaves `recorded.json`, so it is recorded once.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

from suite.errors import ConfigError
from suite.signals import Stopped

STATUSES = ("finished", "oom", "timeout", "failed", "invalid")


def failure_status(exc: BaseException) -> str:
    import torch  # here, so that recording a point (`suite.record`, in every batch job) does not load torch

    if isinstance(exc, ConfigError):
        return "invalid"
    if isinstance(exc, Stopped):
        return "timeout"
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return "oom"
    text = str(exc).lower()
    if "out of memory" in text or "can't allocate memory" in text:
        return "oom"
    return "failed"


def error_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class PointDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.logs = self.path / "logs"
        self.epochs_file = self.path / "epochs.jsonl"
        self.summary_file = self.path / "summary.json"
        self.manifest_file = self.path / "manifest.json"
        self.weights_file = self.path / "final_weights.pt"
        self.point_file = self.path / "point.json"
        self.job_file = self.path / "job.json"
        self.launcher_log = self.path / "launcher.log"
        self.recorded_file = self.path / "recorded.json"
        self.claim_file = self.path / "recording.claim"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def append_epoch(self, metrics: dict[str, Any]) -> None:
        with self.epochs_file.open("a") as f:
            f.write(json.dumps(metrics) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._write_json(self.summary_file, summary)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self._write_json(self.manifest_file, manifest)

    def write_error(self, rank: int, exc: BaseException) -> None:
        self._write_json(self.path / f"error.rank{rank}.json", {
            "rank": rank,
            "time": time.time(),
            "status": failure_status(exc),
            "error": error_line(exc),
            "traceback": "".join(traceback.format_exception(exc)),
        })

    def write_point(self, point: dict[str, Any]) -> None:
        self._write_json(self.point_file, point)

    def write_job(self, job: dict[str, Any]) -> None:
        self._write_json(self.job_file, job)

    def point(self) -> dict[str, Any]:
        return json.loads(self.point_file.read_text())

    def job(self) -> dict[str, Any] | None:
        return json.loads(self.job_file.read_text()) if self.job_file.exists() else None

    def recorded(self) -> dict[str, Any] | None:
        return json.loads(self.recorded_file.read_text()) if self.recorded_file.exists() else None

    def mark_recorded(self, run_id: str, tracking_uri: str, status: str) -> None:
        self._write_json(self.recorded_file, {"run_id": run_id, "tracking_uri": tracking_uri, "status": status,
                                              "time": time.time()})

    def claim(self, stale_after_s: float = 900) -> bool:
        """Take the right to record this point; False while another recorder holds it.

        A claim older than `stale_after_s` belongs to a recorder that was killed (recording takes
        seconds) and is taken over.
        """
        try:
            fd = os.open(self.claim_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                age = time.time() - self.claim_file.stat().st_mtime
            except FileNotFoundError:  # released meanwhile
                return self.claim(stale_after_s)
            if age < stale_after_s:
                return False
            self.claim_file.unlink(missing_ok=True)
            return self.claim(stale_after_s)
        with os.fdopen(fd, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
        return True

    def release(self) -> None:
        self.claim_file.unlink(missing_ok=True)

    def epochs(self) -> list[dict[str, Any]]:
        if not self.epochs_file.exists():
            return []
        return [json.loads(line) for line in self.epochs_file.read_text().splitlines() if line.strip()]

    def summary(self) -> dict[str, Any] | None:
        return json.loads(self.summary_file.read_text()) if self.summary_file.exists() else None

    def manifest(self) -> dict[str, Any]:
        return json.loads(self.manifest_file.read_text()) if self.manifest_file.exists() else {}

    def errors(self) -> list[dict[str, Any]]:
        """Error reports of all ranks, earliest first: the first is usually the root cause."""
        found = [json.loads(p.read_text()) for p in self.path.glob("error.rank*.json")]
        return sorted(found, key=lambda e: e["time"])

    @staticmethod
    def _write_json(path: Path, data: dict[str, Any]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        tmp.replace(path)
