"""The tree passes the linter configured in pyproject.toml, as `make lint` runs it."""

import subprocess
import sys

from suite.paths import REPO_ROOT


def test_ruff_check_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
