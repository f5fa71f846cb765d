"""The device a point's ranks run on is decided once, by the driver: `cluster.device=auto` reaches the ranks as `cuda`
where the driver planned GPUs (this machine's, or the GPUs a batch job asks for), else `cpu`. A rank meant for a
GPU that sees none (this machine has none) fails with one line, and its point is recorded invalid."""

import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import DIGITS, free_port
from launchers import LaunchResult
from suite.errors import ConfigError
from suite.paths import REPO_ROOT
from suite.records.record import ended_status
from suite.runtime.dist import resolve_device
from suite.shared_names import Status
from suite.sweep.plan import new_point_dir, plan

SLURM = ["cluster=slurm", "cluster.hardware.cores_per_node=64"]


def test_a_rank_that_sees_no_gpu_is_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        resolve_device("cuda", 0)
    line = str(refused.value)
    assert line.startswith("the point runs on GPUs (cluster.device=cuda, or auto on a machine or cluster with GPUs) "
                           f"but this rank sees none: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}, ")
    assert "NVIDIA driver" in line and " built for CUDA " in line and "\n" not in line


@pytest.mark.parametrize("cluster, device, ranks_get", [
    ([], "auto", "cpu"),  # this machine, without a GPU
    (SLURM, "auto", "cuda"),  # a batch cluster's job asks for GPUs
    (SLURM, "cpu", "cpu"),
])
def test_the_driver_decides_auto_for_the_ranks(results, cluster, device, ranks_get):
    (point,) = plan([[*DIGITS, *cluster, f"cluster.device={device}"]])
    before = point.config_hash
    out = new_point_dir(point)
    assert OmegaConf.load(out.config).cluster.device == ranks_get
    assert point.cfg.cluster.device == device and point.config_hash == before  # the point itself is as asked
    assert out.point()["params"]["cluster.device"] == device


@pytest.mark.slow  # starts a process
def test_a_batch_rank_without_its_gpu_is_recorded_invalid(results):
    (point,) = plan([[*DIGITS, *SLURM]])  # cluster.device=auto: the job asks for GPUs
    out = new_point_dir(point)
    rank = subprocess.run([sys.executable, "-m", "suite.worker", str(out.path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, env={**os.environ, "MASTER_PORT": str(free_port())})
    assert rank.returncode == 1
    status, error = ended_status(out, LaunchResult(rank.returncode, False, 1.0))
    assert status == Status.invalid
    assert error.startswith("rank 0: ConfigError: the point runs on GPUs ") and "this rank sees none" in error
    assert "Traceback" not in error
