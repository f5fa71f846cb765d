"""`make predict`, `make recommend` and `make bench-model` as a user types them, and the predictions a sweep's runs
carry: each on a small point, with a calibration record of this machine in the test's results directory."""

import re

import pytest
from test_predict import TINY_GPT, calibration_record

from conftest import run_make, run_suite

# make, profiling interpreters, ranks; on one xdist worker, which profiles each network once for every test here
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("predict_commands")]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """The module's profile cache: profiles are named by what they measured, so tests share them as a user's
    sweeps and predictions share results/profiles."""
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture
def profiled(results, profiles):
    results.mkdir(parents=True, exist_ok=True)
    (results / "profiles").symlink_to(profiles, target_is_directory=True)
    return results


@pytest.fixture
def calibrated(profiled):
    return calibration_record(profiled / "calibration", name="local")


def test_predict_prints_each_points_prediction(calibrated):
    result = run_make("predict", f"ARGS={' '.join(TINY_GPT)} strategy=ddp,1f1b workers=2 batch_size=8")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| tokens/gpt2_nano/(ddp|1f1b)/w2 \|.*\| (\d+\.\d+) \|.*\| (\d+) \| (yes|no.*) \|$",
                      result.stdout, re.M)
    assert [row[0] for row in rows] == ["ddp", "1f1b"], result.stdout
    assert all(float(epoch) > 0 and int(peak) > 0 for _, epoch, peak, _ in rows)
    assert "Profiled on cpu:" in result.stdout and "Links: calibration local.yaml" in result.stdout


def test_predict_rejects_bad_input_with_one_line(calibrated):
    result = run_make("predict", f"ARGS={' '.join(TINY_GPT)} strategy=ddp network=nosuch")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "nosuch" in errors[0], result.stderr


def test_predict_without_link_costs_says_how_to_get_them(profiled):
    result = run_make("predict", f"ARGS={' '.join(TINY_GPT)} strategy=ddp workers=2")
    assert result.returncode != 0
    assert "error: cluster local has no link costs: run `make calibrate CLUSTER=local`" in result.stderr


def test_bench_model_without_link_costs_says_so_before_it_measures(results):
    """Its grid starts with `single` (no links needed): the check must not wait for the first point of two ranks,
    25 minutes into the grid."""
    result = run_make("bench-model", "ARGS=--strategies single,ddp")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: cluster local has no link costs"), result.stderr
    assert not (results / "points").exists()  # nothing ran


def test_recommend_ranks_the_strategies_of_a_cell(calibrated):
    result = run_make("recommend", f"ARGS={' '.join(TINY_GPT)} optimizer.name=sgd workers=2")
    assert result.returncode == 0, result.stderr[-3000:]
    columns = r"^\| (\d+) \| ([^|]+) \| [^|]+ \| \d+ \| \d+ \| (\d+\.\d+) \|" + r" ([^|]+) \|" * 9
    ranked = re.findall(columns, result.stdout, re.M)
    assert len(ranked) >= 5, result.stdout
    times = [float(row[2]) for row in ranked]
    assert times == sorted(times)
    for row in ranked:  # the step's parts add up to it: compute, comm, bubble, core wait, optimizer, data, library
        step, *parts = map(float, row[3:])
        assert sum(parts) == pytest.approx(step, abs=6e-4), row
    assert "- zero zero_stage=1: strategy zero does not train with optimizer.name=sgd" in result.stdout
    pick = re.search(r"^recommendation for 2 workers: (.+) \((\d+\.\d+) s/epoch\), (\d+\.\d+)% faster than the next "
                     r"strategy, (.+)$", result.stdout, re.M)
    assert pick and pick.group(1) == ranked[0][1].strip(), result.stdout
    assert float(pick.group(3)) >= 10 or "(within the model's typical error of 10%: measure both" in pick.group(4)


def test_a_sweeps_runs_carry_their_prediction(calibrated, store):
    result = run_suite(*TINY_GPT, "strategy=ddp", "workers=2", "epochs=1", "steps_per_epoch=2", "eval_batches=1")
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = store.runs("adhoc")
    metrics = run.data.metrics
    assert metrics["predicted_epoch_time_s"] > 0 and metrics["predicted_peak_memory_mb"] > 0
    assert metrics["predicted_fits"] == 1.0  # the report's fits / does-not-fit accuracy reads it
    assert metrics["predicted_from_profiled"] == 1.0  # this machine's CPU, profiled here
    assert metrics["epoch_time_s_mean"] > 0


def test_bench_model_prints_its_scores(calibrated, results):
    # Over 120 s in `make test` (135 s alone, about 270 on 2 loaded cores): make bench-model's 12 points and their
    # profiles (108 s alone), then one point of another sweep's grid (21 s; 29 s when it was two of `pipelines`); each
    # assertion is about a table only a grid prints.
    # a 1-block GPT-2, which the grid's 4-stage pipelines could not take: --strategies leaves them out before planning;
    # recorded under names that state their dimensions (no size of GPT-2 has one block of width 128 or 512)
    result = run_make("bench-model", "ARGS=--strategies single,ddp steps_per_epoch=1 epochs=1 warmup_steps=1 "
                                     "dataset.samples=64 network.n_layer=1 dataset.image_size=8")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^\| tokens/gpt2_L1_H4_E128 local w2 \| ddp \| finished \| \d+\.\d+ \| \d+\.\d+ \|",
                     result.stdout, re.M), result.stdout
    assert re.search(r"^\| ddp \| 7 \| \d+\.\d%", result.stdout, re.M), result.stdout  # one held to 0.8 GB a rank
    assert re.search(r"^\| tokens/gpt2_L1_H8_E512 local 0.8 GB w2 \| ddp \| (finished|oom) \|", result.stdout, re.M)
    # ddp on 4 workers, beyond the 2 ranks the links were measured among, scored apart (2 networks)
    beyond = result.stdout.split("points of more than 2 workers, held out by worker count: priced from calibrations "
                                 "of fewer ranks")[1]
    assert re.search(r"^\| ddp \| 2 \| \d+\.\d%", beyond, re.M), result.stdout
    assert re.search(r"^Top-1 right in \d of 2 cells", result.stdout, re.M), result.stdout  # w4: ddp alone
    # The correction fitted on the networks, scored on each with the others' fit, kept for --variant fitted.
    assert re.search(r"^### .*, corrected by factor, leave-one-network-out$", result.stdout, re.M), result.stdout
    corrected = (r"^### .*, corrected by factor, fitted on the points of at most 2 workers, scored on those of more "
                 r"\(priced from calibrations of fewer ranks\)$\n(.*\n){3}\| ddp \| 2 \|")
    assert re.search(corrected, result.stdout, re.M), result.stdout
    assert (results / "calibration" / "local.correction.yaml").exists()
    # The runs recorded their predictions: the sweep's report scores them (the `model` view).
    report = run_make("report", "SWEEP=model_bench")
    assert report.returncode == 0, report.stderr[-3000:]
    assert re.search(r"^\| ddp \| 7 \| \d+\.\d%", report.stdout, re.M), report.stdout
    assert (results / "reports" / "model_bench" / "model_strategies.csv").exists()
    # Another sweep's grid, its runs in its own experiment; the correction stays the one fitted on model_bench.
    written = (results / "calibration" / "local.correction.yaml").read_text()
    other = run_make("bench-model", "ARGS=--sweep digits --strategies single steps_per_epoch=1 dataset.samples=64 "
                                    "dataset.val_samples=8")
    assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
    assert re.search(r"^\| single \| 1 \| \d+\.\d%", other.stdout, re.M), other.stdout
    assert "no correction written: fitted on another grid than model_bench's" in other.stdout
    assert (results / "calibration" / "local.correction.yaml").read_text() == written
    fits = re.search(r"Fits / does not fit right in (\d+) of (\d+) points", (results / "reports" / "model_bench" /
                                                                           "report.md").read_text())
    assert fits and int(fits.group(2)) == 10  # every run recorded whether it would fit, that held to 0.8 GB too
