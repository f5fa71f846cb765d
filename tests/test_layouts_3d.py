"""`make sweep SWEEP=layouts_3d`: data x tensor, FSDP2 x TP and data x pipeline x tensor layouts (under 1F1B,
interleaved, zero-bubble, ZB-V and DualPipeV schedules, with full and selective recomputation, with sequence
parallelism) each train to single's losses, which its report says per point, beside each pipeline's bubble measured
and analytic."""

import csv

import pytest

from conftest import run_make

pytestmark = pytest.mark.slow


def test_every_layout_of_the_sweep_trains_to_singles_losses(results):
    # Over 120 s in `make test` on 2 loaded cores: 18 points of up to 8 ranks; every layout's losses are the claim.
    done = run_make("sweep", "SWEEP=layouts_3d", timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(results / "reports" / "layouts_3d" / "same_losses.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 17  # every point but single
    assert {row["same losses (rtol 0.0001)"] for row in rows} == {"same"}
    layouts = {row["layout"] for row in rows}
    assert {"dp 2 x pp 2 x tp 2", "dp 2 x pp 1 x tp 2", "dp 1 x pp 2 x tp 2"} <= layouts
    ideal = {row["strategy"]: row["bubble ideal"] for row in rows if row["workers"] == "4"}
    knobs = "sequence_parallel=False tp=2 virtual_stages={} activation_checkpointing=none"
    assert float(ideal[f"1f1b schedule=zero_bubble {knobs.format(1)}"]) == 0.077
    assert float(ideal[f"1f1b schedule=zbv {knobs.format(2)}"]) == 0.04  # a chunk's third
    assert all(float(row["bubble measured"]) > 0 for row in rows if row["micro-batches"])
