"""Both timing protocols compare epochs as one pass over the whole training set: a large batch that drops more of
the last partial batch (GPipe's 3072 on MNIST) does not time fewer samples than a small one."""

import pytest

from analysis.measure import epoch_time, speedup
from analysis.runs import Row


class Histories:
    def __init__(self, epochs: dict[str, dict[str, list[float]]]) -> None:
        self.epochs = epochs

    def get(self, run_id: str, metric: str):
        return tuple(enumerate(self.epochs[run_id][metric], 1))


def mnist(run_id: str, trained: int, whole: int | None) -> Row:
    metrics = {"samples_per_epoch": trained, **({"train_set_samples": whole} if whole else {})}
    return Row(run_id=run_id, dataset="mnist", network="resnet18", strategy=run_id, workers=4, status="finished",
               epoch_time_s=None, throughput=None, peak_memory_mb=None, val_metric=None, val_value=None,
               start_time=0, params={"warmup_steps": "0"}, metrics=metrics)


def test_epoch_times_are_scaled_to_the_whole_training_set_under_either_protocol():
    # Both trained at 1000 samples/s: Horovod 117 steps of 512 (59,904 samples), GPipe 19 of 3072 (58,368).
    horovod, gpipe = mnist("horovod", 59_904, 60_000), mnist("gpipe", 58_368, 60_000)
    histories = Histories({r.run_id: {"epoch_time_s": [r.metrics["samples_per_epoch"] / 1000] * 3,
                                      "throughput_samples_s": [1000.0] * 3} for r in (horovod, gpipe)})
    assert epoch_time([gpipe], histories, "study_j").value == pytest.approx(60.0)
    assert epoch_time([horovod], histories, "study_j").value == pytest.approx(60.0)
    assert epoch_time([gpipe], histories, "suite").value == pytest.approx(60.0)
    assert speedup([gpipe], [horovod], histories, "study_j").value == pytest.approx(1.0)


def test_a_run_recorded_without_the_training_sets_size_keeps_its_epoch_time():
    old = mnist("old", 58_368, None)
    assert epoch_time([old], Histories({"old": {"epoch_time_s": [2.0, 2.0]}}), "study_j").value == 2.0
