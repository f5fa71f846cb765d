"""Claims evaluated from rows as the store gives them: Study N's Megatron-intra communication share."""

from analysis.claims import FAILS, HOLDS, check_comm_share, load_claims
from analysis.runs import Row
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
