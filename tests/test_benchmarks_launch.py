"""`make bench-launch`: a sweep of trivial points through the real driver, its fixed cost split into parts."""

import re
import subprocess

from suite.benchmarks.launch import PARTS
from suite.paths import REPO_ROOT


def test_bench_launch_splits_the_cost_of_a_point():
    result = subprocess.run(["make", "--no-print-directory", "bench-launch", "POINTS=1"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    parts = {name: [float(v) for v in re.findall(r"-?\d+\.\d\d", line[len(name):])]
             for name in [*(name for name, _ in PARTS), "total per point"]
             for line in result.stdout.splitlines() if line.startswith(name)}
    assert len(parts) == len(PARTS) + 1, result.stdout
    assert all(seconds[0] >= 0 for seconds in parts.values()), result.stdout  # every mark was made, in order
    total = parts.pop("total per point")[0]
    assert abs(sum(seconds[0] for seconds in parts.values()) - total) < 0.05, result.stdout
    cost = re.search(r"^launch cost per point: (\d+\.\d\d) s$", result.stdout, re.MULTILINE)
    assert cost and float(cost.group(1)) > total, result.stdout
