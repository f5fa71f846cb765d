"""A hung test costs its time limit, not the run (pytest-timeout, configured in pyproject.toml): it fails with where it
hung, and the tests after it still run, under pytest-xdist as `make test` runs them."""

import subprocess
import sys

import pytest

from suite.paths import REPO_ROOT

pytestmark = pytest.mark.slow  # starts pytest


def test_a_test_that_sleeps_forever_fails_with_its_stack_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        "import time\n\n\ndef test_sleeps_forever():\n    time.sleep(10**6)\n\n\ndef test_after_it():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "--timeout", "3",
                           "-c", str(REPO_ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:]
    assert "Failed: Timeout (>3.0s) from pytest-timeout." in done.stdout
    assert ">       time.sleep(10**6)" in done.stdout  # where it hung
