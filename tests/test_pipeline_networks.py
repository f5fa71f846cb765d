"""Every network of Study J runs under each pipeline engine (2 stages), and a hung stage ends as a
timeout instead of a deadlock: the cells the studies lost to crashes are recorded here."""

import pytest

from suite.sweep.driver import run_sweep
from suite.sweep.plan import plan

pytestmark = pytest.mark.slow  # every point is launched: gloo ranks through the local launcher

NETWORKS = ["resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenet_v2"]
# gpipe_dist differs from 1f1b only in its torch.distributed.pipelining schedule class (same stages, same
# partitioning), which its equivalence tests cover; leaving it out of this grid saves 6 launched points.
PIPELINES = ["gpipe", "1f1b", "pipedream"]
SMOKE = ["dataset=cifar10", "dataset.image_size=8", "dataset.samples=16", "dataset.val_samples=4", "batch_size=8",
         "workers=2", "epochs=1", "warmup_steps=0", "eval_batches=1", "timeout_s=300"]


@pytest.mark.parametrize("strategy", PIPELINES)
def test_every_study_j_network_runs_as_a_2_stage_pipeline(store, strategy):
    knobs = [] if strategy == "pipedream" else ["strategy.micro_batches=2"]
    points = plan([[*SMOKE, f"network={network}", f"strategy={strategy}", *knobs] for network in NETWORKS],
                  experiment="networks")
    outcomes = run_sweep(points, store)
    assert {o.point.cfg.network.name: o.status for o in outcomes} == dict.fromkeys(NETWORKS, "finished"), \
        [o.error for o in outcomes if o.error]
    for run in store.runs("networks"):
        assert run.data.params["pipeline_stages"] == "2"
        assert {"peak_memory_mb_stage0", "bubble_fraction_ideal"} <= run.data.metrics.keys() or strategy == "gpipe"
        assert "bubble_fraction_measured" in run.data.metrics
        if strategy == "pipedream":
            assert run.data.metrics["weight_versions_max_stage0"] == 1  # one stage after it
            assert run.data.metrics["weight_versions_max_stage1"] == 0


def test_hung_stage_ends_as_timeout_not_deadlock(store):
    """Stage 1 hangs; stage 0 waits on it in a receive. The driver's timeout ends the point."""
    (point,) = plan([[*SMOKE, "network=resnet18", "strategy=1f1b", "strategy.micro_batches=2", "fault.kind=hang",
                      "fault.rank=1", "timeout_s=20"]])
    (outcome,) = run_sweep([point], store)
    assert outcome.status == "timeout"
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "timeout"
