"""Rank discovery from each launcher's variables, and two real ranks started with only jsrun's or PBS's."""

import os
import socket
import subprocess
import sys

import pytest

from conftest import DIGITS
from launchers.hosts import allocation_hosts, lsf_hosts, slurm_hosts
from suite.paths import REPO_ROOT
from suite.runtime.rendezvous import discover
from suite.sweep.plan import plan
from suite.sweep.point import new_point_dir

LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PALS_", "LSB_", "PBS_", "MPI_")
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_torchrun_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n1",
           "MASTER_PORT": "1234", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}  # torchrun inside a Slurm allocation
    r = discover(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr, r.master_port) == \
        (3, 4, 1, 2, "n1", 1234) and r.source == "torchrun"


def test_slurm_variables():
    env = {"SLURM_PROCID": "9", "SLURM_NTASKS": "11", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "4(x2),3", "SLURM_JOB_NODELIST": "gpu[07-09],login1", "SLURM_JOB_ID": "77"}
    r = discover(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr) == (9, 11, 1, 3, "gpu07")
    assert r.master_port == discover({**env, "SLURM_PROCID": "0"}).master_port  # same job, same port


@pytest.mark.parametrize("nodelist, hosts", [
    ("vm", ["vm"]), ("gpu[07-09,12],login1", ["gpu07", "gpu08", "gpu09", "gpu12", "login1"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]), ("node[003]", ["node003"]), ("n[98-101]", ["n98", "n99", "n100", "n101"])])
def test_slurm_hosts(nodelist, hosts):
    assert slurm_hosts(nodelist) == hosts


def test_lsf_skips_lassens_launch_node():
    assert lsf_hosts("batch3 1 lassen12 40 lassen13 40") == ["lassen12", "lassen13"]
    assert lsf_hosts("hostA 2 hostB 1") == ["hostA", "hostB"]
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "LSB_HOSTS": "batch3 lassen12 lassen12 lassen13 lassen13"}
    r = discover(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr) == (5, 8, 1, 4, "lassen12")


def test_pals_without_a_world_size_takes_the_points(tmp_path):
    (tmp_path / "nodes").write_text("x3001\nx3001\nx3002\nx3002\n")
    env = {"PALS_RANKID": "6", "PALS_LOCAL_RANKID": "2", "PALS_LOCAL_SIZE": "4",
           "PBS_NODEFILE": str(tmp_path / "nodes")}
    r = discover(env, expected_world_size=8)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr) == (6, 8, 2, 4, "x3001")
    assert allocation_hosts(env) == ["x3001", "x3002"]


def test_horovodrun_variables_win_over_the_job_scripts():
    """horovodrun in a Slurm job script passes the script's own SLURM_PROCID=0 on to every rank it starts."""
    env = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "4",
           "HOROVOD_HOSTNAME": "gpu08", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "gpu[07-08]",
           "SLURM_JOB_ID": "77"}
    r = discover(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr) == (5, 8, 1, 4, "gpu07")
    assert r.source == "horovodrun"
    assert r.master_port == discover({"SLURM_PROCID": "0", "SLURM_JOB_ID": "77"}).master_port


def launcher_env(style: str, rank: int, tmp_path) -> dict[str, str]:
    """What jsrun (under LSF) or PALS's mpiexec (under PBS) gives rank `rank` of 2 on this host, and nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in TORCHRUN}
    host = socket.gethostname()
    if style == "jsrun":
        env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                   OMPI_COMM_WORLD_LOCAL_SIZE="2", LSB_JOBID="4242", LSB_MCPU_HOSTS=f"batch1 1 {host} 40")
    else:
        nodefile = tmp_path / "nodefile"
        nodefile.write_text(f"{host}\n")
        env.update(PMI_RANK=str(rank), PMI_SIZE="2", PMI_LOCAL_RANK=str(rank), PMI_LOCAL_SIZE="2",
                   PBS_JOBID="4242.pbs01", PBS_NODEFILE=str(nodefile))
    return env


@pytest.mark.slow
@pytest.mark.parametrize("style, source", [("jsrun", "jsrun/Open MPI"), ("pbs", "mpiexec/PMI")])
def test_two_ranks_find_each_other_from_the_launchers_variables(store, tmp_path, style, source):
    (point,) = plan([[*DIGITS, "epochs=1", "steps_per_epoch=2", "strategy=ddp", "workers=2"]])
    out = new_point_dir(point)
    ranks = [subprocess.Popen([sys.executable, "-m", "suite.worker", str(out.path)], cwd=REPO_ROOT,
                              env=launcher_env(style, rank, tmp_path), stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT) for rank in range(2)]
    assert [r.wait(300) for r in ranks] == [0, 0], out.errors()
    assert f"rank 1 of 2 (local 1 of 2) from {source}" in out.rank_log(1).read_text()
    job_id = "4242" if style == "jsrun" else "4242.pbs01"
    assert out.manifest()["scheduler_job_id"] == job_id and len(out.manifest()["ranks"]) == 2

    recorder = subprocess.run([sys.executable, "-m", "suite.records.record", str(out.path), "--exit-code", "0",
                               "--started", "0"], cwd=REPO_ROOT, env=launcher_env(style, 0, tmp_path),
                              capture_output=True, text=True)  # as the job's last step does
    assert recorder.returncode == 0, recorder.stdout + recorder.stderr
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "finished" and run.data.tags["suite.job_id"] == job_id
