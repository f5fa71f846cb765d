"""Where the suite keeps its configs and results (relative to the repository, not the working directory)."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"


def results_dir() -> Path:
    """results/ of the repository, or $SUITE_RESULTS_DIR (e.g. a shared filesystem on a cluster)."""
    return Path(os.environ.get("SUITE_RESULTS_DIR", REPO_ROOT / "results"))
