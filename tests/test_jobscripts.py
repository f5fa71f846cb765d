"""Job scripts for LSF (Lassen), PBS (Sophia, Polaris) and Slurm, checked as text and by `bash -n`;
the schedulers' answers about job states; what is rejected before anything is submitted."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import DIGITS, run_suite
from launchers import BATCH_SCHEDULERS, jobscript
from launchers.batch import Job, Step
from launchers.lsf import job_state as lsf_state
from launchers.pbs import job_state as pbs_state
from launchers.slurm import job_state as slurm_state
from suite.config import ClusterConfig, JobConfig
from suite.errors import ConfigError
from suite.paths import REPO_ROOT
from suite.sweep.jobs import batch_job
from suite.sweep.plan import plan

pytestmark = pytest.mark.xdist_group("jobscripts")  # one worker runs the module: its fixtures run once

POINT = [*(o for o in DIGITS if not o.startswith("batch_size=")), "batch_size=1", "strategy=ddp"]


def dry_run(*overrides: str) -> dict[tuple[str, int], str]:
    """(cluster, workers) -> job script text, written by `python -m suite -m ... --dry-run` (nothing submitted)."""
    result = run_suite("-m", *POINT, *overrides, "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    scripts = {}
    for path in re.findall(r"job script: (\S+)", result.stdout):
        assert subprocess.run(["bash", "-n", path]).returncode == 0
        text = open(path).read()
        cluster = re.search(r"point\(s\) on cluster (\S+):", text).group(1)
        scripts[cluster, int(re.search(r"_w(\d+)-", path).group(1))] = text
    return scripts


@pytest.fixture(scope="module")
def site_scripts(tmp_path_factory):
    """Scripts for 2- to 32-node points on Lassen, Polaris and Sophia (its largest queue takes 8 nodes)."""
    results = tmp_path_factory.mktemp("dry") / "results"
    os.environ["SUITE_RESULTS_DIR"] = str(results)
    try:
        scripts = dry_run("cluster=lassen,polaris", "workers=8,16,64,128", "cluster.job.account=acct")
        scripts.update(dry_run("cluster=sophia", "workers=16,64", "cluster.job.account=acct"))
    finally:
        del os.environ["SUITE_RESULTS_DIR"]
    assert not (results / "points").exists()  # a dry run creates no point directories
    return scripts


@pytest.mark.slow
def test_lassen_scripts_start_one_jsrun_resource_set_per_node_with_its_gpus(site_scripts):
    """One resource set per node (NCCL keeps CUDA IPC between the node's GPUs), each rank on 10 cores packed beside
    its local rank's GPU; Spectrum MPI's CUDA hooks off."""
    for ranks, nodes in ((8, 2), (64, 16)):
        text = site_scripts["lassen", ranks]
        assert f"#BSUB -nnodes {nodes}\n" in text
        for option in ("-G acct", "-q pbatch", "-W 60", "-wa TERM", "-wt 2"):
            assert f"#BSUB {option}\n" in text
        launch = (f"jsrun --nrs {nodes} --rs_per_host 1 --tasks_per_rs 4 --cpu_per_rs 40 --gpu_per_rs 4 "
                  "--bind packed:10 --launch_distribution packed --smpiargs=-disable_gpu_hooks")
        assert re.search(rf"run_point 0 TERM \S+ \S+ 10 {re.escape(launch)} \S+/python -m suite\.worker \S+_w{ranks}-",
                         text)
        assert "RANK" not in text  # the ranks' places come from jsrun's own variables
        assert "SUITE_RESULTS_DIR=" in text and "MLFLOW_TRACKING_URI=" in text


@pytest.mark.slow
def test_sophia_and_polaris_scripts_ask_qsub_for_nodes_and_start_ranks_with_mpiexec(site_scripts):
    for ranks, nodes in ((16, 2), (64, 8)):
        text = site_scripts["sophia", ranks]
        assert f"#PBS -l select={nodes}:ncpus=256:ngpus=8:mpiprocs=8\n" in text
        for option in ("-l walltime=01:00:00", "-A acct", "-q by-node", "-l place=scatter",
                       "-l filesystems=home:eagle"):
            assert f"#PBS {option}\n" in text
        assert f"mpiexec -n {ranks} --hostfile $PBS_NODEFILE --map-by ppr:8:node:PE=16 --bind-to core" in text
        assert "-x OMP_NUM_THREADS" in text  # Open MPI passes on only what it is told to
    for ranks, nodes in ((8, 2), (64, 16)):
        text = site_scripts["polaris", ranks]
        assert f"#PBS -l select={nodes}:system=polaris\n" in text and "#PBS -l filesystems=home:eagle\n" in text
        assert f"mpiexec -n {ranks} --ppn 4 --depth 8 --cpu-bind depth" in text  # PALS: ranks from PMI_*


@pytest.mark.slow
def test_slurm_script_and_packing_points_into_one_job(results):
    """The node's cores over its GPUs, all its memory and the nodes to the job alone by default; the warning to the
    batch shell (B:); srun without an MPI plugin, so that no PMI_RANK without a local rank reaches the ranks."""
    (text,) = dry_run("cluster=slurm", "workers=8", "cluster.job.queue=gpu", "cluster.job.account=proj",
                      "cluster.hardware.cores_per_node=64").values()
    for option in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--partition=gpu", "--account=proj",
                   "--cpus-per-task=16", "--mem=0", "--exclusive", "--signal=B:USR1@120", "--time=60"):
        assert f"#SBATCH {option}\n" in text
    assert "srun --mpi=none --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=16 --kill-on-bad-exit=1" in text
    assert "\nrun_point 0 USR2 " in text  # srun hands SIGUSR2 on to the ranks; a SIGTERM it would make SIGKILL
    assert "--gpu-bind" not in text  # it would hide the node's other GPUs from each rank (NCCL's CUDA IPC)
    (shared,) = dry_run("cluster=slurm", "workers=8", "cluster.job.cores_per_worker=6", "cluster.job.exclusive=false",
                        "cluster.job.mem_per_worker_gb=7.5", "cluster.job.stop_margin_s=300").values()
    assert "--exclusive" not in shared and "#SBATCH --signal=B:USR1@300\n" in shared
    assert "#SBATCH --mem=30720M\n" in shared and "#SBATCH --cpus-per-task=6\n" in shared  # 4 ranks x 7.5 GB
    result = run_suite("-m", *POINT, "cluster=slurm", "workers=1,4,8", "cluster.job.points_per_job=3",
                       "cluster.job.cores_per_worker=8", "--dry-run")
    (path,) = set(re.findall(r"job script: (\S+)", result.stdout))
    packed = open(path).read()
    assert packed.count("\nrun_point ") == 3 and "#SBATCH --nodes=2\n" in packed


@pytest.mark.parametrize("answer, expected", [
    (slurm_state("7", "PENDING", "Resources"), ("queued", None, "PENDING (Resources)")),
    (slurm_state("7", "COMPLETING"), ("running", None, "COMPLETING")),
    (slurm_state("7", "CANCELLED by 1000", "None", "0:15"), ("ended", "failed", "CANCELLED by 1000 (exit code 0:15)")),
    (slurm_state("7", "TIMEOUT"), ("ended", "timeout", "TIMEOUT")),
    (slurm_state("7", "OUT_OF_MEMORY"), ("ended", "oom", "OUT_OF_MEMORY")),
    (lsf_state("7", "PEND"), ("queued", None, "PEND")),
    (lsf_state("7", "EXIT", "TERM_RUNLIMIT: job killed after reaching LSF run time limit"),
     ("ended", "timeout", "EXIT (TERM_RUNLIMIT: job killed after reaching LSF run time limit)")),
    (lsf_state("7", "EXIT", "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit"),
     ("ended", "oom", "EXIT (TERM_MEMLIMIT: job killed after reaching LSF memory usage limit)")),
    (lsf_state("7", "DONE", "-"), ("ended", "finished", "DONE")),
    (pbs_state("7.pbs", "Q"), ("queued", None, "Q")),
    (pbs_state("7.pbs", "F", -29), ("ended", "timeout", "F (walltime exceeded)")),
    (pbs_state("7.pbs", "F", 271, "killed by qdel"), ("ended", "failed", "F (killed by signal 15; killed by qdel)")),
])
def test_scheduler_states(answer, expected):
    assert (answer.phase, answer.status, answer.detail) == expected


REJECTED = {
    "no account on Lassen": (["cluster=lassen", "workers=4"], "cluster lassen needs an account to charge"),
    "more ranks per node than GPUs": (["cluster=lassen", "cluster.job.account=b", "workers=8", "nodes=1"],
                                      "8 per node, but cluster lassen has 4 per node"),
    "more nodes than the machine": (["cluster=thetagpu", "cluster.job.account=p", "workers=200"],
                                    "needs 25 nodes (workers=200, 8 per node), but cluster thetagpu has 24"),
    "unknown cluster": (["cluster=lassn"], "cluster=lassn: no such cluster; did you mean lassen?"),
    "fp16 on CPU ranks": (["cluster=slurm-local", "precision=fp16"], "fp16 needs a GPU"),
}


@pytest.mark.parametrize("case", REJECTED)
def test_rejected_cluster_point(case):
    overrides, expected = REJECTED[case]
    with pytest.raises(ConfigError) as info:
        plan([[*POINT, *overrides]])
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_no_submission_without_the_schedulers_command(results):
    result = run_suite("-m", *POINT, "cluster=lassen", "cluster.job.account=b", "workers=4,8")  # bsub is not here
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: bsub not found: submit from a login node of the lsf cluster "
                                          "(DRY_RUN=1 / --dry-run writes the job scripts without submitting)"]
    assert not (results / "points").exists() and not (results / "jobs").exists()


@pytest.mark.slow
def test_horovod_points_start_horovodrun_on_the_first_node_over_the_allocations_hosts(results):
    """horovodrun replaces srun, jsrun and mpiexec (even a cluster's own `job.launcher`): -H lists the
    allocation's first `nodes` hosts, rank 0's first, computed on the node when the step starts."""
    point = [o for o in POINT if o != "strategy=ddp"]
    scripts = dry_run(*point, "strategy=horovod", "cluster=slurm,lassen,sophia", "workers=8",
                      "cluster.job.account=acct", "cluster.job.cores_per_worker=8")
    hosts_commands = {}
    for cluster, per_node in (("slurm", 4), ("lassen", 4), ("sophia", 8)):
        (step,) = re.findall(r"^run_point .*$", scripts[cluster, 8], re.MULTILINE)
        hosts = rf"\S+/python -m launchers\.horovod {per_node} {8 // per_node}"
        launch = re.search(rf'\S+/horovodrun -np 8 -H "\$\(({hosts})\)" --gloo \S+/python -m suite\.worker ', step)
        assert launch and not re.search(r"\b(srun|jsrun|mpiexec)\b", step), step
        hosts_commands[cluster] = launch.group(1)
    nodefile = results.parent / "nodefile"
    nodefile.write_text("x3001\n" * 8 + "x3002\n" * 8)
    allocations = {  # what each scheduler tells the job script, and the -H that follows from it
        "slurm": ({"SLURM_JOB_NODELIST": "gpu[07-09]"}, "gpu07:4,gpu08:4"),
        "lassen": ({"LSB_MCPU_HOSTS": "batch3 1 lassen12 40 lassen13 40"}, "lassen12:4,lassen13:4"),
        "sophia": ({"PBS_NODEFILE": str(nodefile)}, "x3001:8"),
    }
    outside = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LSB_", "PBS_"))}
    for cluster, (env, expected) in allocations.items():
        substituted = subprocess.run(["bash", "-c", f'echo "$({hosts_commands[cluster]})"'], env={**outside, **env},
                                     capture_output=True, text=True)
        assert substituted.stdout.strip() == expected, substituted.stderr


@pytest.mark.slow
def test_axonn_pipelines_start_mpiexec_on_the_first_node(results):
    """AxoNN's pipelining sends over MPI: `make axonn`'s mpiexec (MPICH's Hydra, which reads the allocation of the
    scheduler it runs under) replaces srun, jsrun and the site's mpiexec; its data parallelism alone keeps the
    scheduler's launcher."""
    point = [o for o in POINT if o != "strategy=ddp"]
    common = [*point, "strategy=axonn", "cluster=slurm,lassen,sophia", "workers=8", "cluster.job.account=acct",
              "cluster.job.cores_per_worker=8"]
    pipelined = dry_run(*common, "strategy.pp=2", "batch_size=8")
    for cluster, per_node in (("slurm", 4), ("lassen", 4), ("sophia", 8)):
        (step,) = re.findall(r"^run_point .*$", pipelined[cluster, 8], re.MULTILINE)
        assert re.search(rf"^run_point \d+ TERM .*\S+/mpiexec -n 8 -ppn {per_node} -prepend-pattern '\[rank%r\]: ' "
                         r"\S+/python -m suite\.worker ", step), step
        assert not re.search(r"\b(srun|jsrun|horovodrun)\b", step), step
    data_parallel = dry_run(*common)
    assert "/mpiexec -n" not in data_parallel["slurm", 8] and " srun " in data_parallel["slurm", 8]


@pytest.mark.slow
def test_every_script_exports_the_rendezvous_and_stops_the_ranks_before_the_time_limit(site_scripts):
    """Each step exports rank 0's host and a port of its own before its ranks start (Open MPI forwards them);
    LSF warns the script with SIGTERM (-wa), PBS warns nobody, so the script's own timer does."""
    for (cluster, _), text in site_scripts.items():
        assert 'read -r MASTER_ADDR MASTER_PORT < <(' in text and '-m suite.runtime.rendezvous "$step")' in text
        assert "\n    export MASTER_ADDR MASTER_PORT\n" in text and "\nrun_point 0 " in text
        if cluster == "lassen":
            assert "\ntrap 'stop \"the time limit is near: stopping\"' TERM\n" in text
            assert "\ntrap 'ending=1; stop \"the scheduler is ending this job\"' INT USR2\n" in text
        else:  # 60 min less the 120 s margin
            assert "\n{ sleep 3480 && kill -USR1 $$; } > /dev/null 2>&1 &\n" in text
            assert "\ntrap 'stop \"the time limit is near: stopping\"' USR1\n" in text
            assert "\ntrap 'ending=1; stop \"the scheduler is ending this job\"' TERM\n" in text
        if cluster == "sophia":
            assert "-x MASTER_ADDR -x MASTER_PORT" in text  # mpirun hands remote ranks only what -x names


@pytest.mark.slow
def test_a_slurm_cluster_without_the_nodes_cores_is_refused_before_anything_is_written(results):
    result = run_suite("-m", *POINT, "cluster=slurm", "workers=4", "--dry-run")
    assert result.returncode == 2 and not (results / "jobs").exists()
    assert result.stderr.splitlines() == [
        "error: digits/resnet18/ddp/w4: cluster slurm: the CPU cores of each rank are unknown: set "
        "cluster.hardware.cores_per_node (shared out among its workers_per_node) or cluster.job.cores_per_worker"]


def test_a_stop_margin_beyond_the_time_limit_and_uneven_jsrun_nodes_are_refused():
    (point,) = plan([[*POINT, "cluster=slurm-local", "cluster.job.time_limit_min=2", "cluster.job.stop_margin_s=120"]])
    with pytest.raises(ConfigError, match=r"job.stop_margin_s=120 must be more than 0 and less than the time limit"):
        batch_job("t", point.cfg, ())
    (point,) = plan([[*POINT, "cluster=lassen", "cluster.job.account=b", "workers=5"]])  # 3 + 2 on two nodes
    job = batch_job("t", point.cfg, (Step(Path("/p"), point.label, 5, 2, 10),))
    with pytest.raises(ConfigError, match="jsrun starts as many ranks on each node .* 5 ranks do not divide over 2"):
        jobscript.render(job, BATCH_SCHEDULERS["lsf"])


# Stands in for srun, jsrun or mpiexec: notes the rendezvous the script gave it, and when it was told to stop how.
FAKE_LAUNCHER = """#!/bin/bash
dir=${@: -1}
echo "$MASTER_ADDR $MASTER_PORT" > "$dir/rendezvous"
for stop in TERM USR2; do trap "echo $stop \\$(date +%s.%N) > $dir/stopped; exit 143" $stop; done
sleep "$FAKE_SLEEP_S" & wait
"""
ALLOCATIONS = {  # what each scheduler tells the job script about its allocation
    "slurm": {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "rack[1-2]-node[01-02]"},
    "lsf": {"LSB_JOBID": "4242", "LSB_MCPU_HOSTS": "batch3 1 lassen12 40 lassen13 40"},
    "pbs": {"PBS_JOBID": "42.pbs01"},
}


def fake_job(tmp_path, scheduler: str, **job) -> tuple[list[str], dict[str, str], list[Path]]:
    """A two-point job script of `scheduler` whose steps start FAKE_LAUNCHER; the command and environment that
    run it as the scheduler would (no scheduler needed), and the points' directories."""
    launcher = tmp_path / "launcher"
    launcher.write_text(FAKE_LAUNCHER)
    launcher.chmod(0o755)
    cluster = OmegaConf.structured(ClusterConfig(name="t", scheduler=scheduler, device="cpu", workers_per_node=2,
                                                 job=JobConfig(launcher=str(launcher), cores_per_worker=1, **job)))
    dirs = [tmp_path / f"p{i}" for i in range(2)]
    for d in dirs:
        d.mkdir()
    steps = tuple(Step(d, d.name, 2, 1, 1) for d in dirs)
    script = jobscript.write(Job("t", cluster, steps, tmp_path / "t.sh", tmp_path / "t.out", sys.executable,
                                 REPO_ROOT, {"SUITE_RESULTS_DIR": str(tmp_path / "results")}),
                             BATCH_SCHEDULERS[scheduler])
    (tmp_path / "nodefile").write_text("x3001\nx3001\nx3002\nx3002\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LSB_", "PBS_", "MASTER_"))}
    env.update(ALLOCATIONS[scheduler], PBS_NODEFILE=str(tmp_path / "nodefile"), FAKE_SLEEP_S="60")
    return ["bash", str(script)], env, dirs


@pytest.mark.slow
def test_pbs_scripts_own_timer_stops_the_ranks_before_the_walltime_and_no_point_starts_after(tmp_path):
    """walltime 1 min, margin 57 s: SIGTERM reaches the first point's ranks 3 s in; its record step fails (no
    point was planned here), and still the second point does not start."""
    command, env, (first, second) = fake_job(tmp_path, "pbs", time_limit_min=1, stop_margin_s=57)
    started = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=55)
    how, when = (first / "stopped").read_text().split()
    assert how == "TERM" and 2.5 < float(when) - started < 30, done.stdout
    assert (first / "rendezvous").read_text().split()[0] == "x3001"  # the node file's first host
    assert "suite: the time limit is near: stopping" in done.stdout and "left to make collect" not in done.stdout
    assert "suite: p1 not started: the job is ending" in done.stdout and not (second / "rendezvous").exists()


@pytest.mark.slow
@pytest.mark.parametrize("scheduler, sent, ending", [
    ("slurm", signal.SIGUSR1, False),  # --signal=B:USR1@<margin>: the time limit is near
    ("slurm", signal.SIGTERM, True),  # scancel, preemption, the limit itself
    ("lsf", signal.SIGTERM, False),  # -wa TERM -wt <margin>
    ("lsf", signal.SIGUSR2, True),  # the run limit itself
])
def test_a_signal_to_the_batch_shell_stops_the_running_ranks_at_once(tmp_path, scheduler, sent, ending):
    """The launcher runs in the background, so the trap runs at once (the ranks would otherwise sleep 60 s);
    a warning records the point, the scheduler ending the job leaves it to `make collect`."""
    command, env, (first, second) = fake_job(tmp_path, scheduler)
    log = tmp_path / "job.out"
    with log.open("w") as out:
        job = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not (first / "rendezvous").exists():
            assert time.time() < deadline and job.poll() is None, log.read_text()
            time.sleep(0.1)
        job.send_signal(sent)
        assert job.wait(30) is not None
    text = log.read_text()
    assert (first / "stopped").read_text().split()[0] == {"slurm": "USR2", "lsf": "TERM"}[scheduler], text
    assert not (second / "rendezvous").exists()
    assert "suite: p1 not started: the job is ending" in text
    assert ("suite: p0 is left to make collect" in text) == ending
    assert (first / "rendezvous").read_text().split()[0] == {"slurm": "rack1-node01", "lsf": "lassen12"}[scheduler]


@pytest.mark.slow
def test_each_step_of_a_job_meets_at_the_first_host_on_a_port_of_its_own(tmp_path):
    command, env, dirs = fake_job(tmp_path, "slurm")
    done = subprocess.run(command, env={**env, "FAKE_SLEEP_S": "0"}, capture_output=True, text=True, timeout=60)
    (host0, port0), (host1, port1) = [d.joinpath("rendezvous").read_text().split() for d in dirs]
    assert host0 == host1 == "rack1-node01" and int(port1) == int(port0) + 1, done.stdout
