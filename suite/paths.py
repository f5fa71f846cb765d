"""Where the suite keeps its configs and results, and the calibration files among the results; which commit of the
checkout runs (a run's `suite.git_sha`).

From a checkout (an editable install, `make setup`) both are the repository's: conf/ and results/, whatever the
working directory. From a wheel the configs are the package's data (suite/conf, which in the checkout links to
conf/) and results go to results/ under the working directory. $SUITE_RESULTS_DIR overrides either (e.g. a shared
filesystem on a cluster); $SUITE_CONFIG_DIR (`suite --config-dir`) adds a directory of site configs
(conf/cluster/<site>.yaml and the like, laid out as conf/ is) that Hydra searches after the suite's own.

The files under results/calibration/ (a cluster's calibration records, the library overhead's fits, a fitted
correction) are found and read here, by the ranks (MFU's peak), the performance model and the tools alike: a file
that is not what its writer wrote is one line naming it (`DamagedRecord`). What they hold: suite.records.calibration
(the record), suite.predict.library_overhead and suite.predict.correction.
"""

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from suite.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE.parent  # the checkout; site-packages under a wheel
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").exists() and (REPO_ROOT / "conf").is_dir()
CONF_DIR = REPO_ROOT / "conf" if IN_CHECKOUT else PACKAGE / "conf"
SITE_CONFIG_ENV = "SUITE_CONFIG_DIR"


def git_sha(repo: Path) -> str:
    """The checkout's commit; "unknown" outside a checkout (an installed wheel: not whatever repository encloses it)."""
    if not (repo / ".git").exists():
        return "unknown"
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def results_dir() -> Path:
    """results/ of the checkout (else of the working directory), or $SUITE_RESULTS_DIR."""
    default = REPO_ROOT / "results" if IN_CHECKOUT else Path.cwd() / "results"
    return Path(os.environ.get("SUITE_RESULTS_DIR", default))


def site_config_dirs() -> list[Path]:
    """The site config directories of $SUITE_CONFIG_DIR (os.pathsep-separated), searched after CONF_DIR."""
    return [Path(d).resolve() for d in os.environ.get(SITE_CONFIG_ENV, "").split(os.pathsep) if d]


def searchpath_overrides() -> list[str]:
    """Hydra's override that adds the site config directories to its search path (none without them); passed to
    compose beside a point's overrides, never part of them: they say where files are, not what runs."""
    site = [f"file://{d}" for d in site_config_dirs()]
    return [f"hydra.searchpath=[{','.join(site)}]"] if site else []


def config_file(relative: str) -> Path:
    """conf/<relative> (e.g. `cluster/lassen.yaml`), else the first site directory's; the conf/ path when neither
    has it (Hydra's order: the suite's own configs first)."""
    for directory in (CONF_DIR, *site_config_dirs()):
        if (directory / relative).exists():
            return directory / relative
    return CONF_DIR / relative


def config_names(group: str) -> list[str]:
    """The configs of a group (conf/<group>/*.yaml and the site directories'), by name."""
    names = {path.stem for directory in (CONF_DIR, *site_config_dirs()) for path in (directory / group).glob("*.yaml")}
    return sorted(names - {"cluster_schema"})


# A name becomes one directory or file under the results directory (points/<experiment>/, reports/<sweep>/,
# calibration/<cluster>.yaml): with room left in the file system's 255 bytes for the suffixes the suite adds.
NAME_MAX_BYTES = 200


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a directory of its own under the results directory (a separator or `..` would put it
    elsewhere), or None."""
    if not name or name in (".", ".."):
        return "is empty or a relative directory"
    if "/" in name or "\\" in name or "\0" in name:
        return "holds a path separator (it names one directory under the results directory)"
    if len(name.encode()) > NAME_MAX_BYTES:
        return f"is {len(name.encode())} bytes long, over the {NAME_MAX_BYTES} a name may have"
    return None


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
