"""`make sweep` with the Makefile's variables, combined as a cluster user types them (dry runs: nothing is
submitted, the job scripts are written)."""

import re

import pytest

from conftest import run_make

pytestmark = pytest.mark.slow  # `make sweep`, as users type it

LASSEN_DRY_RUN = ("sweep", "CLUSTER=lassen", "DRY_RUN=1")
SMOKE_POINTS = 6

COMBINATIONS = {
    "account": (["ACCOUNT=bank"], ["-G bank", "-q pbatch", "-W 60"], SMOKE_POINTS),
    "queue, time limit, force": (["ACCOUNT=bank", "QUEUE=pdebug", "TIME_LIMIT=30", "FORCE=1"],
                                 ["-G bank", "-q pdebug", "-W 30"], SMOKE_POINTS),
    "retry, args": (["ACCOUNT=bank", "RETRY_FAILED=1", "ARGS=cluster.job.points_per_job=6 epochs=1"],
                    ["-G bank"], 1),
}


@pytest.mark.parametrize("case", COMBINATIONS)
def test_sweep_variables_combine(results, case):
    variables, directives, scripts = COMBINATIONS[case]
    result = run_make(*LASSEN_DRY_RUN, *variables)
    assert result.returncode == 0, result.stderr[-2000:]
    paths = sorted(set(re.findall(r"job script: (\S+)", result.stdout)))
    assert len(paths) == scripts
    for path in paths:
        bsub = {line.removeprefix("#BSUB ") for line in open(path).read().splitlines() if line.startswith("#BSUB ")}
        assert set(directives) <= bsub


def test_lassen_without_an_account_is_one_line(results):
    result = run_make(*LASSEN_DRY_RUN)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("make: ***")]
    assert errors == [f"error: cluster lassen needs an account to charge: add ACCOUNT=<name> "
                      f"(or cluster.job.account=<name>) (all {SMOKE_POINTS} points)"]
    assert not (results / "jobs").exists()
