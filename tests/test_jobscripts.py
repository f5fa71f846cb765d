"""Job scripts for LSF (Lassen), PBS (ThetaGPU, Polaris) and Slurm, checked as text and by `bash -n`;
the schedulers' answers about job states; what is rejected before anything is submitted."""

import os
import re
import subprocess

import pytest

from conftest import DIGITS, run_suite
from launchers.lsf import job_state as lsf_state
from launchers.pbs import job_state as pbs_state
from launchers.slurm import job_state as slurm_state
from suite.errors import ConfigError
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
    """Scripts for a 2-node and a 16-node point on Lassen, ThetaGPU and Polaris, from one dry run."""
    results = tmp_path_factory.mktemp("dry") / "results"
    os.environ["SUITE_RESULTS_DIR"] = str(results)
    try:
        scripts = dry_run("cluster=lassen,thetagpu,polaris", "workers=8,16,64,128", "cluster.job.account=acct")
    finally:
        del os.environ["SUITE_RESULTS_DIR"]
    assert not (results / "points").exists()  # a dry run creates no point directories
    return scripts


@pytest.mark.slow
def test_lassen_scripts_ask_bsub_for_whole_nodes_and_start_one_jsrun_resource_set_per_gpu(site_scripts):
    for ranks, nodes in ((8, 2), (64, 16)):
        text = site_scripts["lassen", ranks]
        assert f"#BSUB -nnodes {nodes}\n" in text
        for option in ("-G acct", "-q pbatch", "-W 60", "-wa TERM", "-wt 2"):
            assert f"#BSUB {option}\n" in text
        launch = f"jsrun --nrs {ranks} --rs_per_host 4 --tasks_per_rs 1 --cpu_per_rs 10 --gpu_per_rs 1 --bind packed:10"
        assert re.search(rf"{re.escape(launch)} \S+/python -m suite\.worker \S+_w{ranks}-", text)
        # the ranks find each other from jsrun's own variables: nothing about ranks is set by the script
        assert "MASTER_ADDR" not in text and "RANK" not in text
        assert "SUITE_RESULTS_DIR=" in text and "MLFLOW_TRACKING_URI=" in text


@pytest.mark.slow
def test_thetagpu_and_polaris_scripts_ask_qsub_for_nodes_and_start_ranks_with_mpiexec(site_scripts):
    for ranks, nodes in ((16, 2), (128, 16)):
        text = site_scripts["thetagpu", ranks]
        assert f"#PBS -l select={nodes}:ncpus=64:ngpus=8\n" in text
        for option in ("-l walltime=01:00:00", "-A acct", "-q full-node", "-l place=scatter"):
            assert f"#PBS {option}\n" in text
        assert f"mpiexec -n {ranks} --npernode 8 --hostfile $PBS_NODEFILE" in text
        assert "-x OMP_NUM_THREADS" in text  # Open MPI passes on only what it is told to
    for ranks, nodes in ((8, 2), (64, 16)):
        text = site_scripts["polaris", ranks]
        assert f"#PBS -l select={nodes}:ncpus=32:ngpus=4\n" in text and "#PBS -l filesystems=home:eagle\n" in text
        assert f"mpiexec -n {ranks} --ppn 4 --depth 8 --cpu-bind depth" in text  # PALS: ranks from PMI_*


@pytest.mark.slow
def test_slurm_script_and_packing_points_into_one_job(results):
    (text,) = dry_run("cluster=slurm", "workers=8", "cluster.job.queue=gpu", "cluster.job.account=proj").values()
    for option in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--partition=gpu", "--account=proj",
                   "--signal=TERM@120", "--time=60"):
        assert f"#SBATCH {option}\n" in text
    assert "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=1 --kill-on-bad-exit=1" in text
    result = run_suite("-m", *POINT, "cluster=slurm", "workers=1,4,8", "cluster.job.points_per_job=3", "--dry-run")
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
    "unknown cluster": (["cluster=lassn"], "cluster/lassn"),
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
    scripts = dry_run(*point, "strategy=horovod", "cluster=slurm,lassen,thetagpu", "workers=8",
                      "cluster.job.account=acct")
    hosts_commands = {}
    for cluster, per_node in (("slurm", 4), ("lassen", 4), ("thetagpu", 8)):
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
        "thetagpu": ({"PBS_NODEFILE": str(nodefile)}, "x3001:8"),
    }
    outside = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LSB_", "PBS_"))}
    for cluster, (env, expected) in allocations.items():
        substituted = subprocess.run(["bash", "-c", f'echo "$({hosts_commands[cluster]})"'], env={**outside, **env},
                                     capture_output=True, text=True)
        assert substituted.stdout.strip() == expected, substituted.stderr
