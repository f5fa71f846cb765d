"""How `make test` runs its tests: a hung test costs its time limit, not the run (pytest-timeout, configured in
pyproject.toml): it fails with where it hung, and the tests after it still run; a module's xdist group stays on one
worker (--dist loadgroup)"""

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


def test_tests_of_one_xdist_group_run_on_one_worker(tmp_path):
    """`make test`'s --dist loadgroup keeps a module's tests, and the fixture they share, on one worker. pytest 9.2
    took the group out of the test ids that pytest-xdist 3.8 schedules by (Node.nodeid no longer reads the `_nodeid`
    xdist writes), so every group was spread over the workers and each re-made its module fixtures (the calibration,
    126 s, twice a run): constraints.txt pins pytest 9.1.1."""
    (tmp_path / "test_grouped.py").write_text(
        "import os\n\nimport pytest\n\npytestmark = pytest.mark.xdist_group('together')\n\n\n"
        + "".join(f"def test_{i}():\n    print(os.environ['PYTEST_XDIST_WORKER'])\n\n\n" for i in range(6)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider", "-c", str(REPO_ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    workers = {line.split("]")[0] for line in done.stdout.splitlines() if "PASSED" in line and line.startswith("[gw")}
    assert len(workers) == 1, done.stdout[-3000:]
    assert "test_0@together" in done.stdout
