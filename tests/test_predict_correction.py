"""What is added to the model per strategy from measurements: the library overhead measured on probe networks (its
fit by hand, its file, the predictor adding it), and the correction fitted on measured points (both forms by hand,
leave-one-network-out, its file, the predictor applying it)."""

from dataclasses import replace

import pytest

from suite.errors import ConfigError
from suite.predict import correction, library_overhead
from suite.predict.correction import Correction, Fit, Observed, correction_path, fit
from suite.predict.costs import StepTime
from suite.predict.library_overhead import Overhead, Probe
from suite.predict.memory import Memory
from suite.predict.predictor import Prediction, crowding, with_correction, with_library_overhead
from suite.profiling.profiles import LayerProfile, Profile
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
    assert [Zero(zero_stage=s).overhead_key for s in (1, 2, 3)] == ["zero", "zero", "zero3"]
    assert DDP().overhead_key == "ddp"


def prediction(*overrides: str, workers: int = 2) -> Prediction:
    (point,) = plan([["dataset=tokens", "network=gpt2_tiny", "cluster=local", f"workers={workers}",
                      "optimizer.name=adam", *overrides]])
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


def test_the_library_overhead_is_solved_from_the_narrow_wide_and_deep_probes():
    # 5 ms + 5 ms per MB + 0.1 ms per tensor: 12 ms above the model at 1 MB in 20 tensors, 32 ms at 5 MB in 20,
    # 25 ms at 2 MB in 100
    (ddp,) = library_overhead.fit([Probe("ddp", 1e6, 20, 0.100, 0.112), Probe("ddp", 5e6, 20, 0.200, 0.232),
                           Probe("ddp", 2e6, 100, 0.150, 0.175)]).values()
    assert ddp == Overhead(pytest.approx(0.005), pytest.approx(5e-9), pytest.approx(1e-4))
    assert ddp.step_s(3e6, 50) == pytest.approx(0.025)
    # A rank's CPU work: twice as long where two ranks share each core the probes' ranks had to themselves.
    assert ddp.step_s(3e6, 50, crowding=2.0) == pytest.approx(0.050)
    (crowded,) = library_overhead.fit([replace(p, crowding=2.0) for p in (Probe("ddp", 1e6, 20, 0.100, 0.112),
                                                                  Probe("ddp", 5e6, 20, 0.200, 0.232))]).values()
    assert crowded.step_s(3e6, 20, crowding=1.0) == pytest.approx(0.022 / 2)


def test_a_term_the_probes_cannot_tell_apart_is_left_out():
    # two probes of one tensor count: the line through them
    (ddp,) = library_overhead.fit([Probe("ddp", 1e6, 20, 0.10, 0.11), Probe("ddp", 5e6, 20, 0.20, 0.23)]).values()
    assert ddp == Overhead(pytest.approx(0.005), pytest.approx(5e-9), 0.0)


def test_a_wider_or_deeper_probe_that_costs_less_gets_no_term_for_it():
    fits = library_overhead.fit([Probe("zero3", 1e6, 20, 0.1, 0.15), Probe("zero3", 5e6, 20, 0.2, 0.23),
                         Probe("1f1b", 1e6, 20, 0.1, 0.08), Probe("1f1b", 5e6, 20, 0.2, 0.15),
                         Probe("megatron", 1e6, 20, 0.1, 0.112), Probe("megatron", 5e6, 20, 0.2, 0.232),
                         Probe("megatron", 2e6, 100, 0.1, 0.110)])
    assert fits["zero3"] == Overhead(pytest.approx(0.04), 0.0, 0.0)
    assert fits["1f1b"] == Overhead(pytest.approx(-0.035), 0.0, 0.0)  # signed: the model prices 1f1b too dearly
    # the deep probe is cheaper: per byte alone, the least-squares line through residuals 12, 32, 10 ms at 1, 5, 2 MB
    slope_ms_per_mb = 48 / (78 / 9)
    assert fits["megatron"] == Overhead(pytest.approx((18 - slope_ms_per_mb * 8 / 3) * 1e-3),
                                        pytest.approx(slope_ms_per_mb * 1e-9), 0.0)


def profile_of(param_bytes: int, param_tensors: int) -> Profile:
    layer = LayerProfile("l", 0.0, 0.0, 0, 0, 0, 0, param_bytes=param_bytes, param_tensors=param_tensors, tied_bytes=0,
                         block=True)
    return Profile(key={}, layers=(layer,), input_bytes=0, forward_s=0.0, backward_s=0.0, optimizer_s=0.0,
                   optimizer_state_bytes=0, train_bytes=0, buffer_bytes=0)


def test_the_predictor_adds_its_clusters_library_overhead(results):
    plain = prediction("strategy=zero", "strategy.zero_stage=3")
    profile = profile_of(4_000_000, 1)
    assert with_library_overhead(plain, profile) == plain  # nothing measured for cluster local
    probes = [Probe("zero3", 1e6, 1, 0.1, 0.15), Probe("zero3", 5e6, 1, 0.2, 0.27), Probe("zero3", 1e6, 11, 0.1, 0.16)]
    path = library_overhead.save("local", probes, ["a", "b", "c"], workers=2)
    assert path == library_overhead.overhead_path("local") and path.name == "local.overhead.yaml"
    assert library_overhead.overhead_path("local", 2).read_text() == path.read_text()
    measured = library_overhead.load("local")
    # 50 and 70 ms above at 1 and 5 MB, 10 ms more at ten more tensors
    assert measured.fits.keys() == {"zero3"}
    found, source = measured.measured(Zero(zero_stage=3), workers=2)
    assert found == Overhead(pytest.approx(0.044), pytest.approx(5e-9), pytest.approx(1e-3))
    assert source.startswith("local.w2.overhead.yaml (probes of 20")
    added = with_library_overhead(plain, profile)
    assert added.step.library == pytest.approx(0.065)
    assert added.epoch_s == pytest.approx(8 * (0.15 + 0.065))
    assert added.library_by == source
    stage_1 = prediction("strategy=zero")
    assert with_library_overhead(stage_1, profile).step.library == 0.0  # no probe of its strategy


def test_the_library_overhead_comes_from_the_probes_of_workers_nearest_the_points(results):
    """Probed on 2 workers (10 ms above the model), then on 4 (30 ms): a point of 4 workers takes the 4-worker fit;
    held out by worker count (`fewer_ranks`), the 2-worker fit, grown by as many more ranks to a core as it has
    beyond the probes' (2 on a machine of 2 cores); a point of 2 workers the 2-worker fit."""
    four = prediction("strategy=ddp", workers=4)
    crowded = crowding(four.point)
    library_overhead.save("local", [Probe("ddp", 1e6, 1, 0.1, 0.11), Probe("ddp", 5e6, 1, 0.2, 0.21)], ["a"], workers=2)
    library_overhead.save("local", [Probe("ddp", 1e6, 1, 0.1, 0.13, crowding=crowded, workers=4),
                            Probe("ddp", 5e6, 1, 0.2, 0.23, crowding=crowded, workers=4)], ["b"], workers=4)
    profile = profile_of(4_000_000, 1)
    own = with_library_overhead(four, profile)
    assert own.step.library == pytest.approx(0.03) and own.library_by.startswith("local.w4.overhead.yaml")
    held = with_library_overhead(four, profile, fewer_ranks=True)
    assert held.step.library == pytest.approx(0.01 * crowded) and held.library_by.startswith("local.w2.overhead.yaml")
    assert with_library_overhead(prediction("strategy=ddp"), profile).step.library == pytest.approx(0.01)


