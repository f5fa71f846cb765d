"""The report's baseline of each point and the speedup against it."""

from dataclasses import replace

from analysis.runs import Row
from analysis.speedup import baseline_for, speedup_table

CIFAR = ("cifar10", "resnet18")
TOKENS = ("tokens", "gpt2_tiny")


def row(workload: tuple[str, str], strategy: str, workers: int, throughput: float | None = 100.0,
        status: str = "finished", label: str | None = None) -> Row:
    dataset, network = workload
    return Row(run_id=f"{dataset}-{strategy}-{workers}-{label}", dataset=dataset, network=network, strategy=strategy,
               workers=workers, status=status, epoch_time_s=1.0, throughput=throughput, peak_memory_mb=900.0,
               val_metric=None, val_value=None, start_time=0, label=label or strategy)


def test_the_single_run_is_the_baseline_of_every_strategy_of_its_workload():
    single, ddp2, zero4 = row(CIFAR, "single", 1), row(CIFAR, "ddp", 2), row(CIFAR, "zero", 4)
    other = row(TOKENS, "single", 1)
    rows = [other, ddp2, zero4, single]
    assert [baseline_for(r, rows) for r in (single, ddp2, zero4)] == [single, single, single]
    assert baseline_for(other, rows) == other


def test_without_a_single_run_the_fewest_workers_of_the_same_variant():
    ddp4, ddp2, ddp8 = row(CIFAR, "ddp", 4), row(CIFAR, "ddp", 2), row(CIFAR, "ddp", 8)
    stage1 = row(CIFAR, "zero", 4, label="zero zero_stage=1")
    stage3_8 = row(CIFAR, "zero", 8, label="zero zero_stage=3")
    stage3_4 = row(CIFAR, "zero", 4, label="zero zero_stage=3")
    rows = [ddp4, ddp2, ddp8, stage1, stage3_8, stage3_4]
    assert baseline_for(ddp8, rows) == ddp2 and baseline_for(ddp2, rows) == ddp2
    assert baseline_for(stage3_8, rows) == stage3_4 and baseline_for(stage1, rows) == stage1


def test_unfinished_runs_and_runs_without_throughput_are_no_baseline():
    failed_single = row(CIFAR, "single", 1, status="oom")
    unmeasured_ddp1 = row(CIFAR, "ddp", 1, throughput=None)
    ddp2, ddp4 = row(CIFAR, "ddp", 2), row(CIFAR, "ddp", 4)
    rows = [failed_single, unmeasured_ddp1, ddp2, ddp4]
    assert baseline_for(ddp4, rows) == ddp2
    assert baseline_for(failed_single, rows) is None  # nothing finished of its variant


def test_the_table_prints_the_throughput_ratio_and_names_the_baseline():
    single, ddp2 = row(CIFAR, "single", 1, throughput=50.0), row(CIFAR, "ddp", 2, throughput=90.0)
    failed = replace(row(CIFAR, "ddp", 4, throughput=None, status="failed"), epoch_time_s=None)
    cells = [line.split("|")[1:-1] for line in speedup_table([single, ddp2, failed]).splitlines()[2:]]
    assert [(c[2].strip(), c[3].strip(), c[7].strip(), c[8].strip()) for c in cells] == [
        ("single", "1", "1.00", "single/w1"), ("ddp", "2", "1.80", "single/w1"), ("ddp", "4", "-", "single/w1")]
