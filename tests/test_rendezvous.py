"""Rank discovery from each launcher's variables (as srun under each MPI plugin, jsrun, PALS's mpiexec and Open
MPI's mpirun set them), Slurm's node lists, and two real ranks started with only jsrun's, PBS's or Open MPI's."""

import os
import socket
import subprocess
import sys

import pytest

from conftest import DIGITS
from launchers.local import rendezvous_store
from suite.paths import REPO_ROOT
from suite.runtime.rendezvous import allocation_hosts, allocation_master, discover, lsf_hosts, slurm_hosts, step_port
from suite.sweep.plan import new_point_dir, plan

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


# As `scontrol show hostnames` expands them (Slurm 22.05 here): every combination of the bracket groups, the first
# varying slowest; zero padding from the first bound; commas between ranges inside brackets and between hosts.
@pytest.mark.parametrize("nodelist, hosts", [
    ("vm", ["vm"]), ("tux[0-3]", ["tux0", "tux1", "tux2", "tux3"]),  # the sbatch man page's node list
    ("gpu[07-09,12],login1", ["gpu07", "gpu08", "gpu09", "gpu12", "login1"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]), ("node[003]", ["node003"]), ("n[98-101]", ["n98", "n99", "n100", "n101"]),
    ("n[09-11]", ["n09", "n10", "n11"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("n[1-2,5]x[1-2],m3", ["n1x1", "n1x2", "n2x1", "n2x2", "n5x1", "n5x2", "m3"])])
def test_slurm_hosts(nodelist, hosts):
    assert slurm_hosts(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["n[1-3", "n1-3]", "h[a]", "n[3-1]", "a,,b", "n[[1]]"])
def test_slurm_hosts_refuses_what_slurm_cannot_read(nodelist):
    with pytest.raises(ValueError, match="cannot read the Slurm node list"):
        slurm_hosts(nodelist)


SRUN = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
        "SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "rack[1-2]-node[01-02]",
        "SLURM_STEP_NODELIST": "rack1-node01", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
# What each srun MPI plugin adds to every task (Slurm's src/plugins/mpi): pmi2 (mpi_pmi2.c) sets no local rank;
# pmix hands over the PMIx server library's variables; cray_shasta emulates PALS, local rank included.
MPI_PLUGINS = {
    "none": ({}, "srun"),
    "pmi2": ({"PMI_FD": "5", "PMI_JOBID": "77.0", "PMI_RANK": "1", "PMI_SIZE": "2"}, "srun"),
    "pmix": ({"PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.77.0", "PMIX_SERVER_URI41": "pmix-server.1;tcp4://x",
              "PMIX_VERSION": "4.2.6", "PMIX_HOSTNAME": "rack1-node01", "PMIX_SECURITY_MODE": "munge,native",
              "OMPI_MCA_orte_precondition_transports": "0123-4567", "SLURM_PMIX_MAPPING_SERV": "(vector,(0,1,2))"},
             "srun"),
    "cray_shasta": ({"PALS_RANKID": "1", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "0", "PALS_APID": "77.0",
                     "PMI_RANK": "1", "PMI_SIZE": "2", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2",
                     "PMI_JOBID": "77", "PMI_UNIVERSE_SIZE": "2"}, "mpiexec/PMI"),
}


@pytest.mark.parametrize("plugin", MPI_PLUGINS)
def test_srun_places_each_rank_on_its_own_gpu_under_every_mpi_plugin(plugin):
    """Under MpiDefault=pmi2 the PMI row has no local rank: it is passed over for srun's SLURM_LOCALID, else
    every rank would take cuda:0 (the job script also runs `srun --mpi=none`)."""
    extra, source = MPI_PLUGINS[plugin]
    r = discover({**SRUN, **extra})
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.source) == (1, 2, 1, 2, source)
    assert r.master_addr == "rack1-node01"


def test_jsrun_variables_with_and_without_spectrum_mpis():
    """jsrun's own JSM_NAMESPACE_* (Lassen; set with --smpiargs=off too, where OMPI_* are not)."""
    jsm = {"JSM_NAMESPACE_RANK": "5", "JSM_NAMESPACE_SIZE": "8", "JSM_NAMESPACE_LOCAL_RANK": "1",
           "JSM_NAMESPACE_LOCAL_SIZE": "4", "LSB_JOBID": "4242", "LSB_MCPU_HOSTS": "batch3 1 lassen12 40 lassen13 40"}
    ompi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    for env in (jsm, {**jsm, **ompi}):
        r = discover(env)
        assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr, r.source) == \
            (5, 8, 1, 4, "lassen12", "jsrun")


def test_pals_mpiexec_variables(tmp_path):
    """PALS's mpiexec on Polaris: PMI_* with the local rank (ALCF names PMI_LOCAL_RANK), PALS_* beside them."""
    (tmp_path / "nodes").write_text("x3001\nx3002\n")
    env = {"PMI_RANK": "6", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "2", "PMI_LOCAL_SIZE": "4", "PALS_RANKID": "6",
           "PALS_LOCAL_RANKID": "2", "PALS_NODEID": "1", "PBS_JOBID": "42.polaris-pbs-01",
           "PBS_NODEFILE": str(tmp_path / "nodes")}
    r = discover(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr, r.source) == \
        (6, 8, 2, 4, "x3001", "mpiexec/PMI")


def test_mpichs_hydra_rank_under_slurm():
    """MPICH's mpiexec (`make axonn`'s, for AxoNN's pipelining) names the local rank MPI_LOCALRANKID, not
    PMI_LOCAL_RANK; inside a Slurm job its ranks also see the job script's SLURM_PROCID=0."""
    env = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "77"}
    r = discover(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr, r.source) == \
        (5, 8, 1, 4, "gpu07", "mpiexec/Hydra")


def test_open_mpi_rank_on_another_host_meets_at_the_job_scripts_master():
    """mpirun (Sophia) hands a remote rank only its OMPI_* and the variables named with -x: the job script's
    MASTER_ADDR and MASTER_PORT, not the scheduler's."""
    env = {"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "MASTER_ADDR": "x1001", "MASTER_PORT": "31234"}
    r = discover(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr, r.master_port, r.source) == \
        (9, 16, 1, 8, "x1001", 31234, "Open MPI")


def test_each_step_of_a_job_has_a_port_of_its_own():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    (host0, port0), (host1, port1) = allocation_master(env, 0), allocation_master(env, 1)
    assert host0 == host1 == "gpu07" and port1 == port0 + 1 or (port0, port1) == (32767, 20000)
    assert discover({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", **env}).master_port == port0


def test_a_jobs_ports_stay_below_linuxs_ephemeral_range():
    """A port the kernel may hand an outgoing connection (32768-60999 by default) can be taken before rank 0
    listens, and a rank connecting to it may be given it as its own (TCP's self-connect): the rendezvous hangs."""
    assert {20000 <= step_port(str(job), step) < 32768 for job in range(4000) for step in range(4)} == {True}


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


def launcher_env(style: str, rank: int, tmp_path, port: int) -> dict[str, str]:
    """What jsrun (under LSF), PALS's mpiexec (under PBS) or mpirun on another host gives rank `rank` of 2 on this
    host, and nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in TORCHRUN}
    host = socket.gethostname()
    if style == "jsrun":
        env.update(JSM_NAMESPACE_RANK=str(rank), JSM_NAMESPACE_SIZE="2", JSM_NAMESPACE_LOCAL_RANK=str(rank),
                   JSM_NAMESPACE_LOCAL_SIZE="2", LSB_JOBID="4242", LSB_MCPU_HOSTS=f"batch1 1 {host} 40")
    elif style == "openmpi":  # a rank mpirun started: no scheduler variable, the script's MASTER_* forwarded
        env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                   OMPI_COMM_WORLD_LOCAL_SIZE="2", MASTER_ADDR=host, MASTER_PORT=str(port))
    else:
        nodefile = tmp_path / "nodefile"
        nodefile.write_text(f"{host}\n")
        env.update(PMI_RANK=str(rank), PMI_SIZE="2", PMI_LOCAL_RANK=str(rank), PMI_LOCAL_SIZE="2",
                   PBS_JOBID="4242.pbs01", PBS_NODEFILE=str(nodefile))
    return env


@pytest.mark.slow
@pytest.mark.parametrize("style, source", [("jsrun", "jsrun"), ("pbs", "mpiexec/PMI"), ("openmpi", "Open MPI")])
def test_two_ranks_find_each_other_from_the_launchers_variables(store, tmp_path, style, source):
    (point,) = plan([[*DIGITS, "epochs=1", "steps_per_epoch=2", "strategy=ddp", "workers=2",
                      "cluster.job.record_in_job=true"]])
    out = new_point_dir(point)
    port = step_port(f"4242.{style}", 0)  # Open MPI's MASTER_PORT as a job script exports it, below the ephemeral range
    ranks = [subprocess.Popen([sys.executable, "-m", "suite.worker", str(out.path)], cwd=REPO_ROOT,
                              env=launcher_env(style, rank, tmp_path, port), stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT) for rank in range(2)]
    assert [r.wait(300) for r in ranks] == [0, 0], out.errors()
    assert f"rank 1 of 2 (local 1 of 2) from {source}" in out.rank_log(1).read_text()
    job_id = {"jsrun": "4242", "pbs": "4242.pbs01", "openmpi": None}[style]
    assert out.manifest()["scheduler_job_id"] == job_id and len(out.manifest()["ranks"]) == 2

    recorder = subprocess.run([sys.executable, "-m", "suite.records.record", str(out.path), "--exit-code", "0",
                               "--started", "0"], cwd=REPO_ROOT, env=launcher_env(style, 0, tmp_path, port),
                              capture_output=True, text=True)  # as the job's last step does
    assert recorder.returncode == 0, recorder.stdout + recorder.stderr
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "finished" and run.data.tags.get("suite.job_id") == job_id


def test_polaris_ranks_take_the_gpu_beside_their_cores(monkeypatch):
    """Polaris numbers its GPUs in reverse NUMA order: local rank i, bound to cores 8i.., takes GPU 3-i."""
    import torch

    from suite.runtime.dist import resolve_device

    (point,) = plan([[*DIGITS, "strategy=ddp", "cluster=polaris", "cluster.job.account=a", "workers=8"]])
    assert list(point.cfg.cluster.gpu_order) == [3, 2, 1, 0]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # no GPU here: the node's count, as on Polaris
    assert [resolve_device("cuda", r, point.cfg.cluster.gpu_order).index for r in range(4)] == [3, 2, 1, 0]
    assert [resolve_device("cuda", r).index for r in range(6)] == [0, 1, 2, 3, 0, 1]  # elsewhere: the local rank's


def test_the_local_launcher_holds_the_port_its_ranks_meet_at(monkeypatch):
    """The store is the launcher's, bound before any rank starts: no other process can take its port (the race of
    a free port chosen, released and bound again by rank 0), and env:// makes every rank, rank 0 too, its client."""
    import torch.distributed as dist

    store, address = rendezvous_store(2)
    with socket.socket() as s, pytest.raises(OSError):  # EADDRINUSE
        s.bind((address["MASTER_ADDR"], int(address["MASTER_PORT"])))
    for key, value in address.items():
        monkeypatch.setenv(key, value)
    rank0_store, rank, world_size = next(dist.rendezvous("env://", rank=0, world_size=2))
    rank0_store.set("joined", "rank 0")
    assert (rank, world_size) == (0, 2) and store.get("joined") == b"rank 0"
