"""The report's baseline of each point and the speedup against it, the point's repeats aggregated once."""

import io

import pandas as pd
import pytest

from analysis.measure import cell_key, cells
from analysis.runs import Row
from analysis.speedup import baseline_of, cell_speedups, point_speedups, speedup_table

CIFAR = ("cifar10", "resnet18")
TOKENS = ("tokens", "gpt2_tiny")


class Histories:
    """Recorded per-epoch values, as the store's metric histories give them."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = {r.run_id: r for r in rows}

    def get(self, run_id: str, metric: str):
        row = self.rows[run_id]
        value = row.throughput if metric == "throughput_samples_s" else row.epoch_time_s
        return () if value is None else tuple((epoch, value * (1 + 0.01 * epoch)) for epoch in range(1, 4))


def row(workload: tuple[str, str], strategy: str, workers: int, throughput: float | None = 100.0,
        status: str = "finished", label: str | None = None, repeat: int = 0) -> Row:
    dataset, network = workload
    return Row(run_id=f"{dataset}-{strategy}-{workers}-{label}-{repeat}", dataset=dataset, network=network,
               strategy=strategy, workers=workers, status=status, epoch_time_s=None if throughput is None else
               100.0 / throughput, throughput=throughput, peak_memory_mb=900.0, val_metric=None, val_value=None,
               start_time=repeat, label=label or strategy, repeat=repeat, params={"warmup_steps": "1"})


def base(r: Row, rows: list[Row]) -> tuple | None:
    return baseline_of(cell_key(r), cells(rows))


def test_the_single_point_is_the_baseline_of_every_strategy_of_its_workload():
    single, ddp2, zero4 = row(CIFAR, "single", 1), row(CIFAR, "ddp", 2), row(CIFAR, "zero", 4)
    other = row(TOKENS, "single", 1)
    rows = [other, ddp2, zero4, single]
    assert [base(r, rows) for r in (single, ddp2, zero4)] == [cell_key(single)] * 3
    assert base(other, rows) == cell_key(other)


def test_without_a_single_point_the_fewest_workers_of_the_same_variant():
    ddp4, ddp2, ddp8 = row(CIFAR, "ddp", 4), row(CIFAR, "ddp", 2), row(CIFAR, "ddp", 8)
    stage1 = row(CIFAR, "zero", 4, label="zero zero_stage=1")
    stage3_8 = row(CIFAR, "zero", 8, label="zero zero_stage=3")
    stage3_4 = row(CIFAR, "zero", 4, label="zero zero_stage=3")
    rows = [ddp4, ddp2, ddp8, stage1, stage3_8, stage3_4]
    assert base(ddp8, rows) == cell_key(ddp2) and base(ddp2, rows) == cell_key(ddp2)
    assert base(stage3_8, rows) == cell_key(stage3_4) and base(stage1, rows) == cell_key(stage1)


def test_unfinished_runs_and_runs_without_throughput_are_no_baseline():
    failed_single = row(CIFAR, "single", 1, status="oom")
    unmeasured_ddp1 = row(CIFAR, "ddp", 1, throughput=None)
    ddp2, ddp4 = row(CIFAR, "ddp", 2), row(CIFAR, "ddp", 4)
    rows = [failed_single, unmeasured_ddp1, ddp2, ddp4]
    assert base(ddp4, rows) == cell_key(ddp2)
    assert base(failed_single, rows) is None  # nothing finished of its variant


def test_repeats_are_one_point_and_the_baseline_is_the_aggregated_baseline_point():
    singles = [row(CIFAR, "single", 1, throughput=t, repeat=i) for i, t in enumerate((50.0, 55.0, 45.0))]
    ddps = [row(CIFAR, "ddp", 2, throughput=t, repeat=i) for i, t in enumerate((90.0, 100.0))]
    rows = singles + ddps
    speedups = cell_speedups(rows, Histories(rows), "suite")
    assert speedups[cell_key(singles[0])].value == 1.0 and speedups[cell_key(singles[0])].high == 1.0
    assert speedups[cell_key(ddps[0])].value == pytest.approx(95.0 / 50.0)
    per_run = point_speedups(rows)
    assert [per_run[r.run_id] for r in singles] == pytest.approx([1.0, 1.1, 0.9])  # against the point, not repeat 0
    table = speedup_table(rows, Histories(rows), "suite", "t")
    frame = pd.read_csv(io.StringIO(table.csv()))
    assert list(frame["strategy"]) == ["single", "ddp"] and list(frame["repeats"]) == [3, 2]
    single, ddp = frame.to_dict("records")
    assert (single["speedup"], single["speedup low"], single["speedup high"]) == (1.0, 1.0, 1.0)  # itself: exactly
    assert ddp["speedup low"] < ddp["speedup"] < ddp["speedup high"] and ddp["speedup"] == pytest.approx(95.0 / 50.0,
                                                                                                       rel=0.02)
    assert ddp["baseline"] == "single/w1" and single["samples/s n"] == 3
    assert "over 2 repeats" in table.markdown() and "over 3 repeats" in table.markdown()


def test_a_failed_point_has_no_speedup_and_names_its_baseline():
    single, ddp2 = row(CIFAR, "single", 1, throughput=50.0), row(CIFAR, "ddp", 2, throughput=90.0)
    failed = row(CIFAR, "ddp", 4, throughput=None, status="failed")
    frame = pd.read_csv(io.StringIO(speedup_table([single, ddp2, failed], Histories([single, ddp2, failed]), "suite",
                                                  "t").csv()))
    assert list(frame["workers"]) == [1, 2, 4] and list(frame["baseline"]) == ["single/w1"] * 3
    assert frame["speedup"].tolist()[:2] == pytest.approx([1.0, 90.0 / 50.0]) and pd.isna(frame["speedup"][2])
    assert frame["status"].tolist() == ["finished", "finished", "failed"]
