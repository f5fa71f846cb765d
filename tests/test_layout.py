"""Every strategy's Layout, as planned before launch: degrees, batches, processes, and where each rank sits."""

import pytest

from suite.layout import Layout, RankPosition
from suite.sweep.plan import plan

TOKENS = ["dataset=tokens", "network=gpt2_tiny"]
LAYOUTS = {
    "single": (["strategy=single"], Layout(dp=1, mini_batch=32)),
    "ddp": (["strategy=ddp", "workers=4"], Layout(dp=4, mini_batch=32)),
    "horovod": (["strategy=horovod", "workers=2"], Layout(dp=2, mini_batch=32)),
    "fsdp": (["strategy=fsdp", "workers=4"], Layout(dp=4, mini_batch=32, shard=4)),
    "zero": (["strategy=zero", "workers=2", "optimizer.name=adam"], Layout(dp=2, mini_batch=32, shard=2)),
    "megatron-intra": ([*TOKENS, "strategy=megatron", "workers=2"], Layout(dp=1, tp=2, mini_batch=64)),
    "megatron dp x tp": ([*TOKENS, "strategy=megatron", "workers=4", "strategy.batch_grows_with_tp=false"],
                         Layout(dp=2, tp=2, mini_batch=32)),
    "megatron-data": ([*TOKENS, "strategy=megatron", "workers=2", "strategy.tp=1"], Layout(dp=2, mini_batch=32)),
    "gpipe": (["strategy=gpipe", "workers=2", "strategy.micro_batches=4"],
              Layout(dp=1, pp=2, mini_batch=32, micro_batches=4, stages_in_one_process=True)),
    "gpipe_dist": (["strategy=gpipe_dist", "workers=2", "strategy.micro_batches=4"],
                   Layout(dp=1, pp=2, mini_batch=32, micro_batches=4)),
    "1f1b dp x pp": (["strategy=1f1b", "workers=4", "strategy.pp=2", "strategy.micro_batches=4"],
                     Layout(dp=2, pp=2, mini_batch=32, micro_batches=4)),
    "1f1b interleaved": ([*TOKENS, "strategy=1f1b", "workers=2", "strategy.virtual_stages=2",
                          "strategy.micro_batches=4"],
                         Layout(dp=1, pp=2, mini_batch=32, micro_batches=4, virtual_stages=2)),
    "pipedream": (["strategy=pipedream", "workers=2"], Layout(dp=1, pp=2, mini_batch=32)),
}


@pytest.mark.parametrize("case", LAYOUTS)
def test_every_strategy_plans_its_layout(case):
    overrides, expected = LAYOUTS[case]
    (point,) = plan([overrides])
    assert point.layout == expected
    assert point.global_batch_size == expected.dp * expected.mini_batch
    assert point.processes == (1 if case in ("single", "gpipe") else point.cfg.workers)
    assert point.layout.devices == point.cfg.workers


def test_ranks_sit_row_major_in_dp_x_pp_x_tp():
    layout = Layout(dp=2, pp=2, tp=2, mini_batch=8, micro_batches=2)
    places = [layout.position(rank) for rank in range(layout.processes)]
    assert places[:4] == [RankPosition(0, 0, 0), RankPosition(0, 0, 1), RankPosition(0, 1, 0), RankPosition(0, 1, 1)]
    assert places[5] == RankPosition(1, 0, 1)
    assert [layout.rank_of(place) for place in places] == list(range(8))
    assert [layout.data_shard(rank) for rank in (0, 3, 4, 7)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert (layout.global_batch, layout.micro_batch_size) == (16, 4)


def test_a_layout_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="micro-batches"):
        Layout(dp=1, pp=2, mini_batch=10, micro_batches=4)
    with pytest.raises(ValueError, match="positive"):
        Layout(dp=0, mini_batch=8)
