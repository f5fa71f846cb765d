"""Values a reader should not take at face value are flagged, not hidden: a superlinear speedup, a wide spread, an
interval from few samples, a phase below the timer's resolution, other work per epoch than the point's peers; a sweep
says how long it has left."""

from analysis.runs import Row
from analysis.sanity import point_flags, sanity_view
from analysis.views import Context
from suite.sweep.progress import Progress


class Histories:
    def __init__(self, epochs: dict[str, dict[str, list[float]]]) -> None:
        self.epochs = epochs

    def get(self, run_id: str, metric: str):
        return tuple(enumerate(self.epochs[run_id].get(metric, []), 1))


def run(strategy: str, workers: int, samples: int, **metrics: float) -> Row:
    return Row(run_id=strategy, dataset="tokens", network="gpt2_tiny", strategy=strategy, workers=workers,
               status="finished", epoch_time_s=1.0, throughput=1.0, peak_memory_mb=1.0, val_metric=None,
               val_value=None, start_time=0, params={"warmup_steps": "1"}, label=strategy,
               metrics={"samples_per_epoch": samples, "train_set_samples": 64, **metrics})


def test_suspect_points_are_flagged_with_the_reason(tmp_path):
    rows = [run("single", 1, 8), run("ddp", 2, 8), run("gpipe", 2, 16, time_backward_s=8e-5), run("zero", 2, 8)]
    epochs = {"single": {"epoch_time_s": [1.0] * 6, "throughput_samples_s": [8.0] * 6},
              "ddp": {"epoch_time_s": [0.3] * 6, "throughput_samples_s": [26.0] * 6},  # 3.25x on 2 workers
              "gpipe": {"epoch_time_s": [0.5, 1.5, 0.5, 1.5], "throughput_samples_s": [16.0] * 4},
              "zero": {"epoch_time_s": [1.0] * 6, "throughput_samples_s": [8.0] * 6}}
    ctx = Context("exp", rows, Histories(epochs), None, tmp_path)
    assert point_flags(ctx, [rows[0]]) == []
    assert point_flags(ctx, [rows[1]]) == ["superlinear speedup 3.25x on 2 workers"]
    gpipe = point_flags(ctx, [rows[2]])
    assert gpipe[:2] == ["CV 58%", "interval from 4 sample(s)"]
    assert gpipe[2].startswith("backward 8.0e-05 s/step, below the timer's resolution")
    assert gpipe[3] == "16 samples an epoch where its peers on 2 worker(s) train 8"
    section = sanity_view(ctx)
    assert "superlinear speedup" in section.markdown and tmp_path / "sanity_flags.csv" in section.files


def test_a_superlinear_speedup_is_flagged_over_the_baseline_the_speedup_table_takes(tmp_path):
    # No `single` point: the speedup table's baseline is the variant on its fewest workers
    rows = [run("fsdp", 1, 8), run("fsdp", 2, 8), run("fsdp", 4, 8)]
    for row, run_id in zip(rows, ("w1", "w2", "w4")):
        object.__setattr__(row, "run_id", run_id)
    epochs = {"w1": {"epoch_time_s": [1.0] * 6, "throughput_samples_s": [8.0] * 6},
              "w2": {"epoch_time_s": [0.25] * 6, "throughput_samples_s": [35.76] * 6},  # 4.47x on 2 workers
              "w4": {"epoch_time_s": [0.4] * 6, "throughput_samples_s": [20.0] * 6}}
    ctx = Context("exp", rows, Histories(epochs), None, tmp_path)
    assert point_flags(ctx, [rows[0]]) == []
    assert point_flags(ctx, [rows[1]]) == ["superlinear speedup 4.47x on 2 workers over fsdp on 1"]
    assert point_flags(ctx, [rows[2]]) == []


def test_a_sweep_says_how_far_it_is_and_how_long_is_left():
    """Unpriced points are expected to take the mean of those run; priced ones their price times how much longer
    than theirs the priced points run so far took, and no less than the quickest point so far; each line says
    which."""
    now = [0.0]
    progress = Progress([None, None, None, None], clock=lambda: now[0])
    now[0] = 30.0
    assert progress.point_done() == "1/4 run here, 30s elapsed, about 1m30s left (30s a point, as the points run so " \
                                    "far)"
    now[0] = 3700.0
    assert progress.point_done() == "2/4 run here, 1h01m elapsed, about 1h01m left (30m50s a point, as the points " \
                                    "run so far)"
    progress.point_done()
    assert progress.point_done() == "4/4 run here, 1h01m elapsed"
    now[0] = 0.0
    priced = Progress([10.0, 100.0, None], clock=lambda: now[0])
    now[0] = 20.0  # twice its price
    assert priced.point_done() == ("1/3 run here, 20s elapsed, about 3m40s left (the model's prices x 2 as the points "
                                   "run so far took, each at least 20s)")  # 2 x 100 s, and 20 s
    # Issue 59: a small GPT-2 priced at 1 s after ResNets priced at 100 s that took 120 s: not 1.2 s each
    now[0] = 0.0
    grid = Progress([100.0, 100.0, 1.0, 1.0], clock=lambda: now[0])
    now[0] = 120.0
    grid.point_done()
    now[0] = 240.0
    assert grid.point_done().endswith("about 4m00s left (the model's prices x 1.2 as the points run so far took, "
                                      "each at least 2m00s)")


def test_a_flag_every_point_carries_is_said_once_above_the_points_flagged_for_their_own(tmp_path):
    """Issue 59: a sweep of two epochs a point had every point flagged at the top of its report, before any result."""
    rows = [run("single", 1, 8), run("ddp", 2, 8), run("zero", 2, 8)]
    epochs = {"single": {"epoch_time_s": [1.0, 1.0], "throughput_samples_s": [8.0, 8.0]},
              "ddp": {"epoch_time_s": [0.5, 0.5], "throughput_samples_s": [16.0, 16.0]},
              "zero": {"epoch_time_s": [0.3, 0.3], "throughput_samples_s": [26.0, 26.0]}}  # 3.25x on 2
    section = sanity_view(Context("exp", rows, Histories(epochs), None, tmp_path))
    body = [line for line in section.markdown.splitlines() if line.startswith("| tokens")]
    assert body == ["| tokens | gpt2_tiny | zero | 2 | superlinear speedup 3.25x on 2 workers |"]
    assert "Every point: interval from 2 sample(s)." in section.markdown
