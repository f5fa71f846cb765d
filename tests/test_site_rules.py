"""A site's rules, checked before anything is submitted: the queue by a job's nodes and time (or the one named, if it
takes the job), jobs packed where a queue lets a user have few at once, retired ThetaGPU pointing to Sophia, the
job's files on file systems the compute nodes mount; and Sophia's and Polaris's scripts as text. Nothing here starts
a process: points are planned and their scripts written by the functions `make sweep` calls."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import DIGITS
from launchers import site_rules
from launchers.batch import Job
from suite.__main__ import main
from suite.errors import ConfigError
from suite.sweep.jobs import point_queue, submit
from suite.sweep.plan import plan
from suite.tools.calibrate import check as check_calibration
from suite.tools.calibrate import compose_config

POINT = [*(o for o in DIGITS if not o.startswith("batch_size=")), "batch_size=1", "strategy=ddp"]


def points(cluster: str, *workers: int, overrides: tuple[str, ...] = ()) -> list:
    return plan([[*POINT, f"cluster={cluster}", f"workers={w}", "cluster.job.account=acct", *overrides]
                 for w in workers])


def scripts(items: list, capsys) -> dict[str, str]:
    """Job script texts by their points' labels (joined by ' '), as `make sweep DRY_RUN=1` writes them."""
    submit([(str(i), p) for i, p in enumerate(items)], None, dry_run=True)
    written = {}
    for line in capsys.readouterr().out.splitlines():
        if "job script: " in line:
            labels = " ".join(re.findall(r"\[\d+ (\S+)\]", line))
            path = line.split("job script: ")[1]
            assert subprocess.run(["bash", "-n", path]).returncode == 0
            written[labels] = Path(path).read_text()
    return written


def refused(argv: list[str], capsys) -> str:
    """The one line `python -m suite` answers with, exit 2, for a sweep refused before anything is submitted."""
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.mark.parametrize("cluster, queues", [
    # Polaris: debug 1-2 nodes, debug-scaling 1-10 (one job per user), prod 10-496 (4 GPUs per node)
    ("polaris", {1: "debug", 8: "debug", 12: "debug-scaling", 40: "debug-scaling", 64: "prod", 200: "prod"}),
    # Sophia: by-gpu takes 1, 2, 4 or 8 GPUs of one node, by-node whole nodes (8 GPUs each), up to 8
    ("sophia", {1: "by-gpu", 2: "by-gpu", 3: "by-node", 4: "by-gpu", 8: "by-gpu", 16: "by-node", 64: "by-node"}),
])
def test_the_queue_is_picked_by_the_jobs_nodes_when_none_is_named(cluster, queues):
    assert {p.cfg.workers: point_queue(p).name for p in points(cluster, *queues)} == queues


def test_a_process_driving_several_gpus_gets_a_whole_sophia_node(results, capsys):
    (gpipe,) = plan([[*POINT, "cluster=sophia", "strategy=gpipe", "workers=4", "batch_size=16",
                      "cluster.job.account=acct"]])
    assert (gpipe.processes, point_queue(gpipe).name) == (1, "by-node")
    (text,) = scripts([gpipe], capsys).values()
    assert "#PBS -q by-node\n" in text and "#PBS -l select=1:ncpus=256:ngpus=8:mpiprocs=1\n" in text


def test_a_named_queue_is_kept_and_a_cluster_without_queue_rules_is_not_checked():
    (lassen,) = points("lassen", 8)  # pbatch, its configured default: LLNL's limits could not be retrieved
    (slurm,) = points("slurm", 8, overrides=("cluster.job.queue=gpu",))
    (prod,) = points("polaris", 120, overrides=("cluster.job.queue=prod", "cluster.job.time_limit_min=300"))
    assert (point_queue(lassen).name, point_queue(slurm), point_queue(prod).name) == ("pbatch", None, "prod")
    assert (point_queue(prod).min_nodes, point_queue(prod).max_time_min) == (25, 360)  # prod's `medium`


def test_polaris_scripts_ask_for_their_queue_whole_nodes_and_alcfs_nccl_network(results, capsys):
    written = scripts(points("polaris", 2, 64), capsys)
    small, large = written["digits/resnet18/ddp/w2"], written["digits/resnet18/ddp/w64"]
    for option in ("-q debug", "-l select=1:system=polaris", "-l filesystems=home:eagle", "-k doe", "-A acct"):
        assert f"#PBS {option}\n" in small
    assert "#PBS -q prod\n" in large and "#PBS -l select=16:system=polaris\n" in large
    assert 'NCCL_NET="AWS Libfabric"' in small and "/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib" in small


@pytest.mark.parametrize("overrides, expected", [
    (["cluster=polaris", "workers=16", "cluster.job.queue=debug"],
     "digits/resnet18/ddp/w16: 4 node(s) x 4 rank(s) (4 GPU(s)) for 60 min does not fit queue debug of cluster polaris "
     "(its queues: debug (1-2 nodes, 5-60 min); debug-scaling (1-10 nodes, 5-60 min, 1 job(s) at once); "),
    # prod routes 10-24 nodes to `small`, 3 hours at most
    (["cluster=polaris", "workers=64", "cluster.job.queue=prod", "cluster.job.time_limit_min=240"],
     "digits/resnet18/ddp/w64: 16 node(s) x 4 rank(s) (4 GPU(s)) for 240 min does not fit queue prod of cluster "
     "polaris"),
    (["cluster=sophia", "workers=3", "cluster.job.queue=by-gpu"],
     "digits/resnet18/ddp/w3: 1 node(s) x 3 rank(s) (3 GPU(s)) for 60 min does not fit queue by-gpu of cluster sophia "
     "(its queues: by-gpu (1/2/4/8 GPUs of one node, 5-1440 min, 20 job(s) at once); by-node (1-8 nodes"),
    (["cluster=lassen", "workers=8", "cluster.job.queue=pbtach"],  # LLNL's limits unknown: only the names
     "digits/resnet18/ddp/w8: queue pbtach is not one of cluster lassen's: pbatch; pdebug"),
    (["cluster=polaris", "workers=8", "cluster.job.queue=debugg"],
     "digits/resnet18/ddp/w8: queue debugg is not one of cluster polaris's: debug (1-2 nodes, 5-60 min); "),
    (["cluster=polaris", "workers=8", "cluster.job.time_limit_min=120"],
     "digits/resnet18/ddp/w8: 2 node(s) x 4 rank(s) (4 GPU(s)) for 120 min fits none of the queues cluster polaris "
     "picks from (debug (1-2 nodes, 5-60 min); debug-scaling (1-10 nodes, 5-60 min, 1 job(s) at once); "
     "prod (10-24 nodes, 5-180 min, 100 job(s) at once); prod (25-99 nodes, 5-360 min, 100 job(s) at once); "
     "prod (100-496 nodes, 5-1440 min, 100 job(s) at once)); name one with QUEUE= (preemptable (1-10 nodes, "
     "5-4320 min, 20 job(s) at once); "),
    (["cluster=sophia", "workers=72"],
     "digits/resnet18/ddp/w72: 9 node(s) x 8 rank(s) (8 GPU(s)) for 60 min fits none"),
    # a by-gpu chunk is one GPU for one rank: torchgpipe's one process driving 4 GPUs is not one
    (["cluster=sophia", "strategy=gpipe", "workers=4", "batch_size=16", "cluster.job.queue=by-gpu"],
     "digits/resnet18/gpipe/w4: 1 node(s) x 1 rank(s) (4 GPU(s)) for 60 min does not fit queue by-gpu"),
])
def test_a_job_no_queue_takes_is_refused_before_anything_is_submitted(overrides, expected, results, capsys):
    line = refused(["-m", *POINT, "cluster.job.account=acct", *overrides, "--dry-run"], capsys)
    assert line.startswith(f"error: {expected}")
    assert not results.exists()  # no script, no point directory, no store


def test_a_queue_that_allows_one_job_per_user_gets_the_sweeps_points_in_one_job(results, capsys):
    """debug-scaling: "max 1 job running/accruing/queued per-user": 3 points of 3-5 nodes go in one job, one after
    another; the 1- and 2-node points go to debug, one job each as configured."""
    written = scripts(points("polaris", 4, 8, 12, 16, 20), capsys)
    packed = written["digits/resnet18/ddp/w12 digits/resnet18/ddp/w16 digits/resnet18/ddp/w20"]
    assert packed.count("\nrun_point ") == 3 and "#PBS -q debug-scaling\n" in packed
    assert "#PBS -l select=5:system=polaris\n" in packed  # the largest point's nodes
    assert {"digits/resnet18/ddp/w4", "digits/resnet18/ddp/w8"} < set(written)
    queue = point_queue(points("sophia", 16)[0])  # 20 jobs queued or running per project
    assert [site_rules.points_per_job(queue, configured, 45) for configured in (1, 4)] == [3, 4]


def test_sophia_scripts_ask_for_gpus_or_whole_nodes_and_forward_the_rendezvous_to_every_rank(results, capsys):
    written = scripts(points("sophia", 2, 16), capsys)
    gpus, nodes = written["digits/resnet18/ddp/w2"], written["digits/resnet18/ddp/w16"]
    # by-gpu: chunks are GPUs, all on one node (no place=scatter); by-node: whole nodes, one nodefile line per rank
    assert "#PBS -l select=2\n#PBS" in gpus and "place=" not in gpus and "#PBS -q by-gpu\n" in gpus
    assert "#PBS -l select=2:ncpus=256:ngpus=8:mpiprocs=8\n#PBS -l place=scatter\n" in nodes
    assert "#PBS -q by-node\n" in nodes
    for text in (gpus, nodes):
        assert "#PBS -l filesystems=home:eagle\n" in text and "#PBS -A acct\n" in text
        assert "module load compilers/openmpi" in text
    (step,) = re.findall(r"^run_point .*$", nodes, re.MULTILINE)
    # 16 cores per rank (2 x 64-core Rome over 8 GPUs), bound; Open MPI's own mapping, no --npernode beside it
    assert " 16 mpiexec -n 16 --hostfile $PBS_NODEFILE --map-by ppr:8:node:PE=16 --bind-to core " in step
    # Open MPI starts remote ranks with only the variables named by -x: every one the script exports, the
    # rendezvous (exported per point by the script) and what run_point sets for the ranks.
    forwarded = set(re.findall(r"-x (\w+)", step))
    exported = {name for line in re.findall(r"^\s*export (.*)$", nodes, re.MULTILINE)
                for name in re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)(?==|\s|$)", line)}
    assert {"SUITE_RESULTS_DIR", "MLFLOW_TRACKING_URI"} <= exported
    assert exported | {"MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "SUITE_POINT_LABEL"} <= forwarded


def test_thetagpu_is_priced_and_reported_but_takes_no_job_not_even_a_dry_runs(results, capsys):
    (point,) = points("thetagpu", 16)  # Study N's machine still plans (the performance model, reports)
    assert (point.cfg.cluster.hardware.cores_per_node, point.cfg.cluster.workers_per_node) == (128, 8)
    expected = ("cluster thetagpu is retired and takes no jobs (its config stays for pricing and reports): submit to "
                "its successor, CLUSTER=sophia")
    assert refused(["-m", *POINT, "cluster=thetagpu", "workers=16", "--dry-run"], capsys) == \
        f"error: digits/resnet18/ddp/w16: {expected}"
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        check_calibration(compose_config(["cluster=thetagpu", "nodes=2"]), dry_run=True)
    assert not results.exists()


def site_job(cluster_cfg, python: str, workdir: str, results_dir: str, uri: str) -> Job:
    return Job("j", cluster_cfg, (), Path("j.sh"), Path("j.out"), python, Path(workdir),
               {"SUITE_RESULTS_DIR": results_dir, "MLFLOW_TRACKING_URI": uri})


def test_a_job_whose_files_the_compute_nodes_cannot_see_is_refused(results, capsys, tmp_path, monkeypatch):
    cluster = points("polaris", 4)[0].cfg.cluster
    home, eagle = "/home/ada/suite", "/lus/eagle/projects/p/results"
    assert site_rules.unshared_path(site_job(cluster, f"{home}/.venv/bin/python", home, eagle,
                                             f"sqlite:///{eagle}/mlflow.db")) is None
    assert site_rules.unshared_path(site_job(cluster, f"{home}/.venv/bin/python", home, eagle,
                                             "http://polaris-login-01:5000")) is None  # a server: no file
    cases = {"python": ("/tmp/venv/bin/python", home, eagle, f"sqlite:///{eagle}/mlflow.db"),
             "working directory": (f"{home}/.venv/bin/python", "/homework/suite", eagle, f"sqlite:///{eagle}/m.db"),
             "results directory": (f"{home}/.venv/bin/python", home, "/local/scratch/r", f"sqlite:///{eagle}/m.db"),
             "sqlite store": (f"{home}/.venv/bin/python", home, eagle, "sqlite:////tmp/mlflow.db")}
    for what, paths in cases.items():
        problem = site_rules.unshared_path(site_job(cluster, *paths))
        assert problem.startswith(f"the job's {what} ") and problem.endswith(
            "is on no file system the compute nodes of cluster polaris mount (/home, /lus/agile/home, /eagle, "
            "/lus/eagle/projects): put it under one (VENV=, SUITE_RESULTS_DIR=, the checkout)"), problem
    # This checkout and its .venv are on no ALCF file system. On a login node (a `qsub` on PATH, which must not be
    # called) the submission is refused; a dry run writes its scripts and says so.
    login = tmp_path / "login-node"
    login.mkdir()
    (login / "qsub").write_text(f"#!/bin/sh\ntouch {login}/called\nexit 1\n")
    (login / "qsub").chmod(0o755)
    monkeypatch.setenv("PATH", f"{login}:{os.environ['PATH']}")
    argv = ["-m", *POINT, "cluster=polaris", "workers=4", "cluster.job.account=acct"]
    line = refused(argv, capsys)
    assert line.startswith("error: the job's python ") and not (login / "called").exists() and not results.exists()
    assert main([*argv, "--dry-run"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].endswith("(a submission is refused)")
    assert list((results / "jobs").glob("*/*.sh"))
