"""The files under results/calibration/ (a cluster's calibration records, the library overhead's fits, a fitted
correction) found and read in one place, by the ranks (MFU's peak), the performance model and the tools alike: a file
that is not what its writer wrote is one line naming it (`DamagedRecord`). What they hold: suite.records.calibration
(the record), suite.predict.library_overhead and suite.predict.correction."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from suite.errors import ConfigError
from suite.paths import results_dir


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
