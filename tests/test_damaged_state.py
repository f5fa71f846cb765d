"""Damaged state a sweep finds and a library the environment lacks (issue 30, cases 11, 12 and 18): a profile cache
cut short is said, discarded and taken again; a damaged calibration file is one line naming it, which `predict`
refuses with and a sweep says once while its points run without a prediction; a strategy whose library is not
installed is refused before anything is launched."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import ClassVar

import pytest
from test_predict import TINY_GPT, calibration_record, tiny_point

from conftest import run_suite
from suite.paths import REPO_ROOT, DamagedRecord, record_path
from suite.predict import correction, library_overhead
from suite.predict.links import calibrated_links, matmul_tflops
from suite.predict.predictor import recorded_prediction
from suite.profiling.cache import _cached
from suite.profiling.profiles import DataProfile
from suite.runtime.metrics import Device, NoPeak, calibrated_peak
from suite.shared_names import Status
from suite.strategies import missing_library
from suite.strategies.base import Library, Strategy
from suite.sweep.plan import prediction_for

TINY_RUN = [*TINY_GPT, "strategy=single", "workers=1", "epochs=1", "steps_per_epoch=2", "eval_batches=1"]


# Case 11: a damaged profile cache.

def data_profile_cached(batch_s: float) -> tuple[DataProfile, bool]:
    """A data profile through the cache, `batch_s` what taking it measures."""
    key = {"dataset": {"name": "digits"}, "batch": 2, "precision": "fp32", "threads": 1}
    return _cached("data", key, lambda: {"batch_s": batch_s}, DataProfile.from_json)


def cut_to_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def lose_a_key(path: Path) -> None:
    data = json.loads(path.read_text())
    del data["batch_s"]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage", [cut_to_half, lose_a_key], ids=["truncated", "lacks_a_key"])
def test_a_damaged_profile_is_said_discarded_and_taken_again(results, capsys, damage):
    first, hit = data_profile_cached(0.5)
    assert (first.batch_s, hit) == (0.5, False)
    (path,) = (results / "profiles").glob("data-digits-*.json")
    damage(path)
    profile, hit = data_profile_cached(0.25)
    assert (profile.batch_s, hit) == (0.25, False)
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: profile cache {path} is damaged ("), warnings
    assert warnings[0].endswith("): discarded, profiling again")
    assert data_profile_cached(0.125)[0].batch_s == 0.25  # stored again, whole


def test_a_profile_taken_on_a_loaded_machine_is_taken_again_once_it_is_quiet(results, capsys, monkeypatch):
    """Issue 59: a CPU profile taken while the machine was busy was reused from then on, 12x too slow. The share of
    the cores busy is set here as the machine would report it."""
    from suite.profiling import cache
    key = {"dataset": {"name": "digits"}, "batch": 2, "precision": "fp32", "threads": 1, "device": "cpu:this"}

    def cached(batch_s: float) -> tuple[DataProfile, bool]:
        return _cached("data", key, lambda: {"batch_s": batch_s}, DataProfile.from_json)

    monkeypatch.setattr(cache, "busy_share", lambda: 0.9)
    assert cached(6.35) == (DataProfile(key, 6.35), False)
    assert cached(0.5)[0].batch_s == 6.35  # still busy: taken again it would measure the other work again
    monkeypatch.setattr(cache, "busy_share", lambda: 0.1)
    assert cached(0.5) == (DataProfile(key, 0.5), False)
    assert "was taken with 90% of the cores busy with other work: profiling again" in capsys.readouterr().err
    assert cached(0.25) == (DataProfile(key, 0.5), True)


def test_the_cores_busy_share_is_sampled_from_the_kernels_counters():
    from suite.profiling.cache import busy_share
    assert 0.0 <= busy_share() <= 1.0


@pytest.mark.slow  # profiles in child interpreters, then the driver and a rank
def test_a_sweep_over_truncated_profiles_profiles_again_and_records_its_point(results, store):
    calibration_record(results / "calibration", name="local")
    assert recorded_prediction(tiny_point("strategy=single", "workers=1"))  # the point's profiles, cached
    (path,) = (results / "profiles").glob("net-gpt2_nano-*.json")
    cut_to_half(path)
    result = run_suite(*TINY_RUN)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: profile cache {path} is damaged (JSONDecodeError: ")
    json.loads(path.read_text())  # taken again
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == Status.finished
    assert run.data.metrics["predicted_epoch_time_s"] > 0


# Case 12: a damaged calibration file.

GARBAGE = {"not_yaml": "collectives: {intra_node: [unclosed\n", "not_a_mapping": "- 1\n- 2\n",
           "lacks_keys": "cluster: local\ndate: 2026-11-22\n"}


def links_of(cluster: str) -> object:
    return calibrated_links(cluster, nodes=1)


# Each calibration file, and a reader of it that the model prices a point with.
READERS = {"local.yaml": links_of, "local.w2.yaml": links_of, "local.overhead.yaml": library_overhead.load,
           "local.correction.yaml": lambda cluster: correction.load(correction.correction_path(cluster))}


@pytest.mark.parametrize("garbage", GARBAGE)
@pytest.mark.parametrize("name", READERS)
def test_a_damaged_calibration_file_is_one_line_naming_it(results, name, garbage):
    path = results / "calibration" / name
    path.parent.mkdir(parents=True)
    path.write_text(GARBAGE[garbage])
    with pytest.raises(DamagedRecord) as damaged:
        READERS[name]("local")
    assert damaged.value.path == path
    writer = "make bench-model" if name.endswith(".correction.yaml") else "make calibrate CLUSTER=local"
    assert re.fullmatch(rf"{re.escape(str(path))} is damaged \(.+\): delete it, or `{writer}` writes it again",
                        str(damaged.value)), str(damaged.value)


def test_a_truncated_calibration_record_is_damage_to_the_model_and_no_peak_to_a_rank(results):
    path = calibration_record(results / "calibration", name="local")
    cut_to_half(path)
    with pytest.raises(DamagedRecord, match=re.escape(str(path))):
        links_of("local")
    path.write_text(GARBAGE["not_yaml"])
    with pytest.raises(DamagedRecord, match=r"\(not YAML: line 2, column 1\)"):
        matmul_tflops("local", "fp32")
    peak = calibrated_peak("local", "fp32", Device("test CPU", 2))
    assert isinstance(peak, NoPeak) and peak.reason.startswith(f"{path} is damaged (not YAML")


@pytest.fixture
def damaged(results) -> Path:
    path = record_path("local")
    path.parent.mkdir(parents=True)
    path.write_text(GARBAGE["not_a_mapping"])
    return path


@pytest.mark.slow  # the predict command, which fails before profiling
def test_predict_refuses_a_damaged_calibration_record_with_one_line(damaged):
    result = subprocess.run([sys.executable, "-m", "suite.tools.predict", *TINY_GPT, "strategy=ddp", "workers=2"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {damaged} is damaged (not a mapping but list): delete it, or "
                      "`make calibrate CLUSTER=local` writes it again"], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # the driver and ranks
def test_a_sweep_records_its_points_without_a_prediction_and_says_why_once(damaged, store):
    result = run_suite("-m", *TINY_RUN, "seed=1,2")
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "recorded without a prediction" in line]
    assert len(said) == 1 and f": {damaged} is damaged (not a mapping but list)" in said[0], result.stderr
    runs = store.runs("adhoc")
    assert len(runs) == 2
    for run in runs:
        assert run.data.tags["suite.status"] == Status.finished
        assert "predicted_epoch_time_s" not in run.data.metrics
        assert run.data.tags["suite.mfu_missing"].startswith(f"{damaged} is damaged")  # the ranks went on


def test_the_model_failing_never_stops_a_sweep_and_is_said_once(results, capsys):
    """Not damage the model knows: a directory where the calibration record should be."""
    record_path("local").mkdir(parents=True)
    said: set[str] = set()
    for position in ("1/2", "2/2"):
        assert prediction_for(recorded_prediction, tiny_point("strategy=single", "workers=1"), position, said) == {}
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: [1/2 tokens/gpt2_nano/single/w1] recorded without a prediction: the performance "
                           "model failed: IsADirectoryError: "), line


# Case 18: a strategy whose library is not installed.

@dataclass(frozen=True)
class Unavailable(Strategy):
    """A strategy whose library no environment has."""

    name: str = "unavailable"
    requires: ClassVar[tuple[Library, ...]] = (Library("Nothing", "suite_test_no_such_module", "setup"),)


@dataclass(frozen=True)
class WithoutItsScript(Strategy):
    """A strategy whose library is installed, but not the script that starts its ranks."""

    name: str = "without_its_script"
    requires: ClassVar[tuple[Library, ...]] = (Library("Torch's launcher", "torch", "launcher", ("no-such-run",)),)


def test_a_strategy_whose_library_is_missing_says_how_to_install_it():
    venv = ".venv" if Path(sys.prefix) == REPO_ROOT / ".venv" else re.escape(sys.prefix)
    make_venv = "" if venv == ".venv" else f" VENV={venv}"
    assert re.fullmatch(rf"Nothing is not installed in {venv}: run `rm -f {venv}/\.installed-\* && make setup"
                        rf"{make_venv}`", missing_library(Unavailable()))
    assert re.fullmatch(rf"Torch's launcher is not installed in {venv}: run `make launcher{make_venv}`",
                        missing_library(WithoutItsScript()))
    assert missing_library(tiny_point("strategy=zero", "optimizer.name=adam").strategy) is None  # `make setup`'s


def venv_without(tmp_path: Path, left_out: str) -> Path:
    """This environment as another venv made by `make setup` alone: its interpreter, and links to the packages
    installed here but those whose names match `left_out`; none of the scripts beside the interpreter."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv)
    site = Path(sysconfig.get_path("purelib"))
    linked = venv / site.relative_to(sys.prefix)
    linked.mkdir(parents=True)
    for entry in site.iterdir():
        if not fnmatch(entry.name.lower(), left_out):
            (linked / entry.name).symlink_to(entry)
    return venv


@pytest.mark.slow  # the driver, in another environment
@pytest.mark.parametrize("strategy,left_out,library", [
    ("horovod", "horovod*", "Horovod horovod"), ("horovod", "nothing", "Horovod horovod"),
    ("axonn", "axonn*", "AxoNN axonn"), ("axonn", "nothing", "AxoNN axonn")],
    ids=["without_horovod", "without_horovodrun", "without_axonn", "without_mpiexec"])
def test_a_point_without_its_library_is_refused_before_launch(tmp_path, results, strategy, left_out, library):
    """Horovod (its package, or horovodrun beside the interpreter), AxoNN (its package, or MPICH's mpiexec)."""
    venv = venv_without(tmp_path, left_out)
    result = subprocess.run([str(venv / "bin" / "python"), "-m", "suite", *TINY_GPT, f"strategy={strategy}",
                             "workers=2"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    name, target = library.split()
    assert (result.returncode, result.stderr) == (
        2, f"error: {name} is not installed in {venv}: run `make {target} VENV={venv}`\n"), result.stderr[-3000:]
    assert not (results / "mlflow.db").exists() and not (results / "points").exists()
