"""The `suite` command: its help, `--cfg job`, site config directories, and a wheel of the package installed outside
the repository running a point."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from conftest import DIGITS, run_make
from suite.cli import main as suite
from suite.paths import CONF_DIR, REPO_ROOT, SITE_CONFIG_ENV, config_names

SITE_CLUSTER = {"defaults": ["cluster_schema", {"gpu": "h100_sxm5_80gb"}, "_self_"], "name": "mysite",
                "scheduler": "local", "workers_per_node": 4, "device": "cpu"}


def test_help_lists_the_commands_every_config_group_with_its_options_and_the_sweeps(capsys):
    assert suite(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("run", "sweep", "status", "report", "predict", "recommend", "calibrate"):
        assert f"\n  {command} " in text
    for group in ("dataset", "network", "strategy", "cluster"):
        listed = re.search(rf"^  {group}: (.*?)\n(?=\S|  \S)", text, re.M | re.S)[1]
        assert [name.strip() for name in listed.split(",")] == config_names(group)
    assert "study_j_mini" in text and "layouts_3d" in text and "--config-dir" in text


def test_cfg_job_prints_the_composed_config_and_creates_no_store(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(tmp_path / "results"))
    assert suite(["--cfg", "job", "dataset=digits"]) == 0
    out = capsys.readouterr().out
    config = yaml.safe_load(out.split("\n", 1)[1])
    assert out.startswith("# digits/resnet18/single/w1 (") and config["dataset"]["name"] == "digits"
    assert not (tmp_path / "results").exists()


def test_a_site_cluster_file_outside_the_repository_is_found_with_config_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(SITE_CONFIG_ENV, raising=False)
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mysite.yaml").write_text(yaml.safe_dump(SITE_CLUSTER))
    assert suite(["--cfg", "job", "cluster=mysite"]) == 2  # not found without it
    assert "mysite" in capsys.readouterr().err
    assert suite(["--config-dir", str(tmp_path), "--cfg", "job", "cluster=mysite"]) == 0
    cluster = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])["cluster"]
    assert cluster["workers_per_node"] == 4 and cluster["hardware"]["peak_tflops"]["bf16"] == 989.4  # the catalog's
    assert os.environ[SITE_CONFIG_ENV] == str(tmp_path)  # what the ranks and jobs inherit
    assert "mysite" in config_names("cluster") and not (CONF_DIR / "cluster" / "mysite.yaml").exists()


def test_a_word_that_is_neither_a_command_nor_an_override_is_one_line_and_exit_2(capsys):
    assert suite(["swep", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'swep' is not a command" in err
    with pytest.raises(SystemExit) as exited:
        suite(["--config-dir", "/nonexistent/site", "x=1"])
    assert exited.value.code == 2 and "is not a directory" in capsys.readouterr().err


@pytest.mark.slow  # runs make
def test_make_help_lists_every_target_with_what_it_does():
    made = run_make("help")
    listed = {line.split()[1] for line in made.stdout.splitlines()}
    assert made.returncode == 0 and {"sweep", "test", "report", "predict", "calibrate", "help"} - listed == {"help"}
    assert all(len(line.split(None, 2)) == 3 for line in made.stdout.splitlines())


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> Path:
    """A wheel built from the repository, installed into a fresh environment outside it; the dependencies come from
    this environment's site-packages (a path, so that its editable install of the suite is not seen)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy: a build leaves build/ and *.egg-info in the tree it builds
    shutil.copytree(REPO_ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "results", "build", "*.egg-info", "__pycache__", "wheelhouse"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(root / "dist"), str(source)], check=True, capture_output=True, cwd=root)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True)
    python = root / "env" / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (wheel,) = (root / "dist").glob("suite-*.whl")
    # The environment's own interpreter runs pip (found through that path), so that the `suite` script is its.
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)], check=True,
                   capture_output=True)
    return root / "env" / "bin" / "suite"


@pytest.mark.slow  # builds a wheel and runs a point with it
def test_a_wheel_installed_outside_the_repository_runs_help_cfg_and_a_point(installed_wheel, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SUITE_RESULTS_DIR", "PYTHONPATH", SITE_CONFIG_ENV,
                                                               "MLFLOW_TRACKING_URI")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(installed_wheel), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)

    where = subprocess.run([installed_wheel.parent / "python", "-c", "import suite; print(suite.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env).stdout
    assert not where.startswith(str(REPO_ROOT)), where  # the wheel's copy, not the checkout
    helped = run("--help")
    assert helped.returncode == 0 and "digits" in helped.stdout and "study_n_mini" in helped.stdout
    shown = run("--cfg", "job", "dataset=digits")
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout.split("\n", 1)[1])["dataset"]["name"] == "digits"
    assert not (tmp_path / "results").exists()
    done = run(*DIGITS, "epochs=1", "steps_per_epoch=2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| digits | resnet18 | single | 1 | 1 | finished |" in done.stdout
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    (run_record,) = client.search_runs([client.get_experiment_by_name("adhoc").experiment_id])
    tags = run_record.data.tags
    assert tags["mlflow.source.name"] == "suite" and "mlflow.source.git.commit" not in tags  # no checkout, no commit
    assert (tmp_path / "results" / "reports" / "adhoc" / "report.md").exists()


def test_calibrate_apply_writes_into_a_site_clusters_own_file(tmp_path, monkeypatch, capsys):
    from test_calibration import record

    monkeypatch.delenv(SITE_CONFIG_ENV, raising=False)
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(tmp_path / "results"))
    site = tmp_path / "site"
    (site / "cluster").mkdir(parents=True)
    (site / "cluster" / "mysite.yaml").write_text(yaml.safe_dump(SITE_CLUSTER))
    (tmp_path / "results" / "calibration").mkdir(parents=True)
    (tmp_path / "results" / "calibration" / "mysite.yaml").write_text(yaml.safe_dump(
        record({"intra_node": (1e-5, 10.0)})))
    assert suite(["--config-dir", str(site), "calibrate", "--apply", "cluster=mysite"]) == 0, capsys.readouterr().err
    hardware = yaml.safe_load((site / "cluster" / "mysite.yaml").read_text())["hardware"]
    assert (hardware["intra_node_bandwidth_gbs"], hardware["intra_node_latency_us"]) == (10.0, 10.0)
    assert not (CONF_DIR / "cluster" / "mysite.yaml").exists()
