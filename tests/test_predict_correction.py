"""The per-strategy correction fitted on measured points: both forms by hand, leave-one-network-out, its file, and
the predictor applying it."""

import pytest

from suite.errors import ConfigError
from suite.predict import correction
from suite.predict.correction import Correction, Fit, Observed, correction_key, correction_path, fit
from suite.predict.costs import StepTime
from suite.predict.memory import Memory
from suite.predict.predictor import Prediction, with_correction
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
