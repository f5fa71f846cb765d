"""The files a point's workers leave in its directory: the only channel from workers to the driver.

Rank 0 appends one JSON line per finished epoch, so a point that crashes or is killed still has
the epochs it completed. Any rank that fails writes its own error file; the driver reads them all.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from suite.errors import ConfigError

STATUSES = ("finished", "oom", "timeout", "failed", "invalid")


def failure_status(exc: BaseException) -> str:
    if isinstance(exc, ConfigError):
        return "invalid"
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
