"""What is added to the model per strategy from measurements: the library overhead measured on probe networks (its
line by hand, its file, the predictor adding it), and the correction fitted on measured points (both forms by hand,
leave-one-network-out, its file, the predictor applying it)."""

import pytest

from suite.errors import ConfigError
from suite.predict import correction, overhead
from suite.predict.correction import Correction, Fit, Observed, correction_key, correction_path, fit
from suite.predict.costs import StepTime
from suite.predict.memory import Memory
from suite.predict.overhead import Overhead, Probe
from suite.predict.predictor import Prediction, with_correction, with_library_overhead
from suite.strategies.ddp import DDP
from suite.strategies.zero import Zero
from suite.sweep.plan import plan

# Per step: ddp measured 1.2, 1.1 and 1.5 x its prediction, 0.2, 0.2 and 0.5 s above it.
DDP_POINTS = [Observed("ddp", "gpt2", 1.0, 1.2), Observed("ddp", "gpt2", 2.0, 2.2), Observed("ddp", "resnet", 1.0, 1.5)]


def test_factor_is_the_median_ratio_and_per_step_the_median_difference():
    factor = fit(DDP_POINTS, "factor").fits["ddp"]
    assert (factor.value, factor.points, factor.networks) == (pytest.approx(1.2), 3, ("gpt2", "resnet"))
    assert factor.step_s(2.0) == pytest.approx(2.4)
    per_step = fit(DDP_POINTS, "per_step").fits["ddp"]
    assert per_step.value == pytest.approx(0.2)
    assert per_step.step_s(2.0) == pytest.approx(2.2)


def test_leave_one_network_out_fits_on_the_other_networks_only():
    points = [*DDP_POINTS, Observed("zero3", "resnet", 1.0, 3.0)]
    held_out = fit(points, "factor", leave_out="resnet")
    assert held_out.fits["ddp"] == Fit("factor", pytest.approx(1.15), 2, ("gpt2",))
    assert "zero3" not in held_out.fits  # measured on resnet only: nothing to correct it with
    assert held_out.step_s(Zero(zero_stage=3), 1.0) == 1.0
    assert held_out.step_s(DDP(), 2.0) == pytest.approx(2.3)


def test_zero_3_is_corrected_apart_from_stages_1_and_2():
    assert [correction_key(Zero(zero_stage=s)) for s in (1, 2, 3)] == ["zero", "zero", "zero3"]
    assert correction_key(DDP()) == "ddp"


def prediction(*overrides: str) -> Prediction:
    (point,) = plan([["dataset=tokens", "network=gpt2_tiny", "cluster=local", "workers=2", "optimizer.name=adam",
                      *overrides]])
    return Prediction(point, StepTime(compute=0.1, comm=0.05), 8, Memory(0, 0, 0, 0, 0, 0), None, "test", "test")


def test_the_predictor_applies_its_clusters_correction_file(results):
    plain = prediction("strategy=zero", "strategy.zero_stage=3")
    with pytest.raises(ConfigError, match="no fitted correction for cluster local .* `make bench-model` fits one"):
        with_correction(plain)
    path = correction_path("local")
    correction.save(Correction({"zero3": Fit("per_step", 0.25, 2, ("gpt2_tiny", "resnet18"))}, "2026-11-23"), path)
    assert correction.load(path) == Correction({"zero3": Fit("per_step", 0.25, 2, ("gpt2_tiny", "resnet18"))},
                                               "2026-11-23")
    corrected = with_correction(plain)
    assert corrected.step.fitted == pytest.approx(0.25)
    assert corrected.epoch_s == pytest.approx(8 * (0.15 + 0.25))
    assert corrected.corrected_by == "local.correction.yaml (fitted on 2 points of gpt2_tiny, resnet18, 2026-11-23)"
    stage_1 = prediction("strategy=zero")
    assert with_correction(stage_1) == stage_1  # no fit for its strategy


def test_the_library_overhead_is_the_line_through_the_narrow_and_the_wide_probe():
    # ddp's measured step is 10 ms above the model's at 1 MB of parameters, 30 ms above at 5 MB
    (ddp,) = overhead.fit([Probe("ddp", 1e6, 0.10, 0.11), Probe("ddp", 5e6, 0.20, 0.23)]).values()
    assert (ddp.fixed_s, ddp.per_byte_s) == (pytest.approx(0.005), pytest.approx(5e-9))
    assert ddp.step_s(3e6) == pytest.approx(0.02)


def test_a_wide_probe_that_costs_less_than_the_narrow_one_gives_a_flat_overhead():
    fits = overhead.fit([Probe("zero3", 1e6, 0.1, 0.15), Probe("zero3", 5e6, 0.2, 0.23),
                         Probe("1f1b", 1e6, 0.1, 0.08), Probe("1f1b", 5e6, 0.2, 0.15)])
    assert fits["zero3"] == Overhead(pytest.approx(0.04), 0.0)
    assert fits["1f1b"] == Overhead(pytest.approx(-0.035), 0.0)  # signed: the model prices 1f1b too dearly


def test_the_predictor_adds_its_clusters_library_overhead(results):
    plain = prediction("strategy=zero", "strategy.zero_stage=3")
    assert with_library_overhead(plain, 4e6) == plain  # nothing measured for cluster local
    path = overhead.save("local", [Probe("zero3", 1e6, 0.1, 0.15), Probe("zero3", 5e6, 0.2, 0.27)], ["a", "b"])
    assert path == overhead.overhead_path("local") and path.name == "local.overhead.yaml"
    measured = overhead.load("local")
    assert measured.fits == {"zero3": Overhead(pytest.approx(0.045), pytest.approx(5e-9))}  # 50 and 70 ms above
    added = with_library_overhead(plain, 4e6)
    assert added.step.library == pytest.approx(0.065)
    assert added.epoch_s == pytest.approx(8 * (0.15 + 0.065))
    assert added.library_by.startswith("local.overhead.yaml (probes of 20")
    stage_1 = prediction("strategy=zero")
    assert with_library_overhead(stage_1, 4e6).step.library == 0.0  # no probe of its strategy
