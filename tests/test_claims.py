"""Claims evaluated from rows as the store gives them: Study N's Megatron-intra communication share, and its
ZeRO-vs-DDP ratios parted by the DDP+Adam control; verdicts from intervals, on equal work, and only where the runs
hold the evidence a claim needs."""

import pytest

import analysis.claims as claims_module
from analysis.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_TESTABLE,
    check_comm_share,
    check_constant_ratio,
    claims_view,
    combined,
    compared,
    evaluate,
    judged,
    load_claims,
    separated,
)
from analysis.runs import Row
from analysis.stats import Estimate
from analysis.study_n import frameworks
from analysis.views import Context


def megatron(workers: int, tp: int, comm_fraction: float | None, status: str = "finished") -> Row:
    measured = {} if comm_fraction is None else {"comm_fraction": comm_fraction}
    return Row(run_id=f"m{workers}-{tp}-{comm_fraction}", dataset="tokens", network="gpt2_medium",
               strategy="megatron", workers=workers, status=status, epoch_time_s=1.0, throughput=1.0,
               peak_memory_mb=1.0, val_metric=None, val_value=None, start_time=0, settings={"tp": str(tp)},
               params={"strategy.tp": str(tp)}, metrics=measured)


def verdict(rows: list[Row]):
    (claim,) = [c for c in load_claims("study_n") if c["id"] == "megatron_intra_comm_share"]
    return check_comm_share(Context("study_n", rows, None, None, None), claim)


def test_megatron_intra_comm_share_at_16_gpus():
    assert verdict([megatron(16, 4, 0.50), megatron(16, 1, 0.05)]).verdict == HOLDS  # Megatron-data is not read
    assert verdict([megatron(16, 4, 0.20)]).verdict == FAILS
    assert verdict([megatron(8, 4, 0.50)]) is None  # not measured at 16 GPUs
    assert verdict([megatron(16, 4, None)]) is None  # not profiled


class EpochTimes:
    """Histories whose every run took its Row's epoch_time_s in each of two epochs."""

    def __init__(self, rows: list[Row]) -> None:
        self.times = {r.run_id: r.epoch_time_s for r in rows}

    def get(self, run_id: str, metric: str):
        return tuple((epoch, self.times[run_id]) for epoch in (1, 2)) if metric == "epoch_time_s" else ()


def gpt2(strategy: str, optimizer: str, seconds: float, memory_mb: float, **params: str) -> Row:
    return Row(run_id=f"{strategy}-{optimizer}-{params}", dataset="tokens", network="gpt2_medium", strategy=strategy,
               workers=2, status="finished", epoch_time_s=seconds, throughput=1.0, peak_memory_mb=memory_mb,
               val_metric=None, val_value=None, start_time=0, params={"optimizer.name": optimizer, **params})


def test_zero_vs_ddp_ratios_are_parted_into_sharding_and_optimizer_by_the_ddp_adam_control(tmp_path):
    rows = [gpt2("ddp", "lamb", 10.0, 1000.0), gpt2("ddp", "adam", 12.0, 1200.0),
            gpt2("zero", "adam", 11.0, 600.0, **{"strategy.zero_stage": "1"})]
    ctx = Context("study_n", rows, EpochTimes(rows), None, tmp_path, claims="study_n")
    assert frameworks(rows[1], ctx) == ["DDP+Adam"] and frameworks(rows[0], ctx) == ["DDP"]
    claims = load_claims("study_n")
    verdicts = {c["id"]: v for c, v in evaluate(ctx, claims)}
    assert verdicts["zero1_memory_vs_ddp"].measured == "memory ratio 0.6 (gpt2_medium w2)"  # as the study states it
    assert verdicts["zero1_time_vs_ddp"].measured == "time ratio 1.1 (gpt2_medium w2)"
    parts = {(r[3], r[2]): r for r in separated(ctx, claims)}
    assert parts["memory ratio", "ZeRO-1 / DDP+Adam"][1] == "sharding"
    assert parts["memory ratio", "ZeRO-1 / DDP+Adam"][4] == "memory ratio 0.5 (gpt2_medium w2)"
    assert parts["memory ratio", "DDP+Adam / DDP"][1:] == ["optimizer", "DDP+Adam / DDP", "memory ratio",
                                                           "memory ratio 1.2 (gpt2_medium w2)"]
    assert parts["time ratio", "ZeRO-1 / DDP+Adam"][4] == "time ratio 0.917 (gpt2_medium w2)"
    assert parts["time ratio", "DDP+Adam / DDP"][4] == "time ratio 1.2 (gpt2_medium w2)"
    assert parts["time ratio", "ZeRO-2 / DDP+Adam"][4] == NOT_MEASURED  # no ZeRO-2 point
    assert len(parts) == 8  # ZeRO-1..3 over the control and the control over DDP, for time and memory
    section = claims_view(ctx)
    assert "the claims' ratios parted by a control" in section.markdown
    assert "DDP+Adam: DDP with Adam" in section.markdown
    assert tmp_path / "claims_separated.tex" in section.files


def test_a_control_needs_a_ratio_claim_and_a_named_control(tmp_path, monkeypatch):
    (tmp_path / "broken.yaml").write_text(
        "controls: {X: a control}\nclaims:\n  - {id: c, source: s, claim: c, check: epoch_time, needs: {}, control: X, "
        "effects: [a, b]}\n")
    monkeypatch.setattr(claims_module, "PUBLISHED_DIR", tmp_path)
    with pytest.raises(ValueError, match="claim c: a control needs a ratio check"):
        load_claims("broken")


def interval(low: float, high: float) -> Estimate:
    return Estimate((low + high) / 2, low, high, 0.1, 5)


def test_a_verdict_holds_only_when_the_whole_interval_is_inside_the_band():
    band = {"min": 0.85, "max": 1.15}
    assert judged(interval(0.9, 1.1), band) == HOLDS
    assert judged(interval(1.2, 1.4), band) == FAILS
    assert judged(interval(1.0, 1.3), band) == INCONCLUSIVE  # straddles the edge
    assert judged(interval(95, 104), {"published": 100, "tolerance": 0.05}) == HOLDS
    assert compared(interval(1, 2), interval(3, 4)) == HOLDS and compared(interval(3, 4), interval(1, 2)) == FAILS
    assert compared(interval(1, 3), interval(2, 4)) == INCONCLUSIVE
    assert combined([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE and combined([INCONCLUSIVE, FAILS]) == FAILS


class Epochs:
    """Histories from a table of per-run epoch times."""

    def __init__(self, times: dict[str, list[float]]) -> None:
        self.times = times

    def get(self, run_id: str, metric: str):
        return tuple(enumerate(self.times[run_id], 1)) if metric == "epoch_time_s" else ()


def gpt2_run(strategy: str, samples_per_epoch: int, **params: str) -> Row:
    return Row(run_id=strategy, dataset="tokens", network="gpt2_medium", strategy=strategy, workers=2,
               status="finished", epoch_time_s=1.0, throughput=1.0, peak_memory_mb=100.0, val_metric=None,
               val_value=None, start_time=0, params={"warmup_steps": "1", "optimizer.name": "lamb", **params},
               metrics={"samples_per_epoch": samples_per_epoch, "train_set_samples": 64})


def test_time_claims_compare_equal_work_and_say_when_the_runs_cannot_test_them(tmp_path):
    """ZeRO-1 trains 16 samples an epoch (its batch rule), DDP 8, each in about 1 s: per pass over the 64-sample
    training set ZeRO-1 takes half DDP's time, which raw epoch times would call equal. Memory measured on CPU does
    not test a GPU-memory claim; too few epochs do not test a time claim."""
    rows = [gpt2_run("ddp", 8), gpt2_run("zero", 16, **{"strategy.zero_stage": "1", "optimizer.name": "adam"})]
    times = {"ddp": [1.0, 1.02, 0.98, 1.01, 0.99], "zero": [1.0, 1.01, 0.99, 1.02, 0.98]}
    ctx = Context("study_n", rows, Epochs(times), None, tmp_path, claims="study_n")
    verdicts = {c["id"]: v for c, v in evaluate(ctx, load_claims("study_n"))}
    zero1 = verdicts["zero1_time_vs_ddp"]
    assert zero1.verdict == FAILS and zero1.measured.startswith("time ratio 0.5")
    memory = verdicts["zero1_memory_vs_ddp"]
    assert memory.verdict == NOT_TESTABLE and "CPU process's resident set" in memory.note
    short = Context("study_n", rows, Epochs({k: v[:2] for k, v in times.items()}), None, tmp_path, claims="study_n")
    verdicts = {c["id"]: v for c, v in evaluate(short, load_claims("study_n"))}
    assert verdicts["zero1_time_vs_ddp"].verdict == NOT_TESTABLE
    assert "2 sample(s), fewer than the 3" in verdicts["zero1_time_vs_ddp"].note


def test_a_full_size_claim_is_not_testable_on_a_miniature(tmp_path):
    (claim,) = [c for c in load_claims("study_j") if c["id"] == "table6_1_resnet18_config_a"]
    ctx = Context("study_j", [], None, None, tmp_path, claims="study_j", miniature="2 CPU workers")
    measured = claims_module.Verdict("1 s", FAILS, estimates=(Estimate(1.0, 0.9, 1.1, 0.05, 3, "t", "repeats"),))
    assert claims_module.untestable(ctx, claim, measured) == ("a claim on the study's full sizes: this sweep is a "
                                                              "miniature (2 CPU workers)")


def gpt2_at(strategy: str, workers: int) -> Row:
    return Row(run_id=f"{strategy}-{workers}", dataset="tokens", network="gpt2_medium", strategy=strategy,
               workers=workers, status="finished", epoch_time_s=1.0, throughput=1.0, peak_memory_mb=100.0,
               val_metric=None, val_value=None, start_time=0, params={"warmup_steps": "1", "optimizer.name": "lamb"},
               metrics={"samples_per_epoch": 64, "train_set_samples": 64})


def test_a_constant_offset_is_a_time_ratio_that_stays_near_its_median_over_the_gpu_counts(tmp_path):
    """AxoNN against DDP at 1, 2 and 4 GPUs (five epochs each): 1.2x at every count holds (a constant offset, not
    equal times); 1.2x, 1.2x and 1.6x fails; a ratio whose interval reaches past the 10% band is inconclusive; one
    GPU count measures nothing."""
    (claim,) = [c for c in load_claims("study_n") if c["id"] == "axonn_constant_offset_from_ddp"]
    rows = [gpt2_at(s, w) for s in ("ddp", "axonn") for w in (1, 2, 4)]

    def verdict(axonn_times: list[float], spread: float = 0.01, keep=rows):
        times = {r.run_id: [r.workers * (1 + spread * (i - 2)) for i in range(5)] for r in keep}
        times.update({f"axonn-{w}": [w * t * (1 + spread * (i - 2)) for i in range(5)]
                      for w, t in zip((1, 2, 4), axonn_times)})
        return check_constant_ratio(Context("study_n", keep, Epochs(times), None, tmp_path, claims="study_n"), claim)

    held = verdict([1.2, 1.2, 1.2])
    assert held.verdict == HOLDS and held.measured.startswith("time ratio 1.2 [")
    assert verdict([1.2, 1.2, 1.6]).verdict == FAILS
    assert verdict([1.2, 1.2, 1.3], spread=0.02).verdict == INCONCLUSIVE
    assert verdict([1.2], keep=[r for r in rows if r.workers == 1]) is None
