"""Context parallelism (`strategy=fsdp strategy.cp=N`, suite.strategies.context_parallel): where the ranks sit, which
tokens each holds, what its queries attend to, what is refused before launch, and how it is priced. That it trains
to single's losses and weights is test_equivalence's `fsdp_x_cp` and `fsdp_x_cp_x_tp`."""

import pytest
import torch

from suite.errors import ConfigError
from suite.layout import Layout, RankPosition
from suite.predict.predictor import predict, workload
from suite.predict.step import gathered_keys_values
from suite.strategies.context_parallel import SequenceShard
from suite.sweep.plan import plan

LLAMA = ["dataset=tokens", "dataset.seq_len=32", "dataset.vocab_size=512", "network=llama3_tiny"]


def test_fsdp_lays_out_replicas_of_context_x_tensor_ranks_and_shards_over_the_context_ranks():
    (point,) = plan([[*LLAMA, "strategy=fsdp", "workers=8", "strategy.cp=2", "strategy.tp=2", "batch_size=4"]])
    assert point.layout == Layout(dp=2, cp=2, tp=2, mini_batch=4, shard=4)
    assert (point.processes, point.global_batch_size, point.layout.params()["cp"]) == (8, 8, 2)


def test_megatron_lays_out_context_ranks_beside_its_tensor_parallel_groups():
    (point,) = plan([[*LLAMA, "strategy=megatron", "workers=8", "strategy.cp=2", "strategy.tp=2", "batch_size=4"]])
    assert point.layout == Layout(dp=2, cp=2, tp=2, mini_batch=8)


def test_ranks_sit_row_major_in_dp_x_cp_x_tp_and_a_replicas_context_ranks_read_its_batch():
    layout = Layout(dp=2, cp=2, tp=2, mini_batch=4)
    places = [layout.position(rank) for rank in range(layout.processes)]
    assert places[:4] == [RankPosition(0, 0, 0, 0), RankPosition(0, 0, 1, 0), RankPosition(0, 0, 0, 1),
                          RankPosition(0, 0, 1, 1)]
    assert places[6] == RankPosition(1, 0, 0, 1)
    assert [layout.rank_of(place) for place in places] == list(range(8))
    assert [layout.data_shard(rank) for rank in (0, 2, 3, 4, 7)] == [(0, 2)] * 3 + [(1, 2)] * 2
    with pytest.raises(ValueError, match="without pipeline stages"):
        Layout(dp=1, pp=2, cp=2, mini_batch=4)


@pytest.mark.parametrize("cp", [2, 4])
def test_each_rank_holds_a_head_and_a_tail_chunk_and_attends_to_as_many_keys(cp):
    """16 tokens over cp ranks: rank r holds chunks r and 2 cp - 1 - r of 2 cp; together every position once, and under
    the causal mask each rank's queries see the same number of (query, key) pairs (the load is balanced)."""
    time, local = 16, 16 // cp
    shards = [SequenceShard(None, r, cp) for r in range(cp)]
    held = [shard.positions(local, torch.device("cpu")) for shard in shards]
    assert sorted(torch.cat(held).tolist()) == list(range(time))
    chunk = time // (2 * cp)
    assert held[0].tolist() == [*range(chunk), *range(time - chunk, time)]
    masks = [shard.causal_mask(local, torch.device("cpu")) for shard in shards]
    assert {tuple(mask.shape) for mask in masks} == {(local, time)}
    assert {int(mask.sum()) for mask in masks} == {time * (time + 1) // 2 // cp}
    # a query attends to the gathered keys at or before its own position, wherever a rank holds them
    gathered = torch.cat(held)
    assert torch.equal(masks[0], held[0][:, None] >= gathered[None, :])
    sequences = torch.arange(2 * time).view(2, time)
    assert torch.equal(shards[1].take(sequences), sequences[:, held[1]])


@pytest.mark.parametrize("overrides, message", [
    (["network=gpt2_tiny", "strategy.cp=2"], "cp=2 splits the sequences of a network with rotary positions (Llama 3); "
                                             "network gpt2_tiny (gpt2) has none"),
    (["strategy.cp=2", "dataset.seq_len=30"], "cp=2 cuts each sequence into 2 x cp = 4 equal chunks; "
                                              "dataset.seq_len=30 is not a multiple of 4"),
    (["strategy.cp=3"], "cp=3 does not divide the 4 ranks of each tensor-parallel index"),
    (["strategy.cp=2", "network.attention=flash"], "the flash kernel does not take"),
    (["strategy=megatron", "strategy.tp=2", "strategy.cp=4"], "cp=4 does not divide the 2 ranks of each "
                                                              "tensor-parallel index"),
    (["strategy=1f1b", "strategy.pp=2", "strategy.cp=2"], "cp=2: context parallelism is not run with pipeline "
                                                          "stages here"),
])
def test_a_context_split_that_cannot_run_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        plan([[*LLAMA, "strategy=fsdp", "workers=4", *overrides]])
    assert message in str(info.value) and "\n" not in str(info.value)


H100_8B = ["dataset=tokens", "network=llama3_8b", "dataset.seq_len=32768", "dataset.vocab_size=128256",
           "precision=bf16", "optimizer.name=adamw", "activation_checkpointing=every", "cluster=dgx_h100",
           "cluster.job.account=x", "strategy=fsdp", "workers=8", "batch_size=1"]


def test_a_context_rank_is_priced_for_its_share_of_the_tokens_and_the_whole_sequences_keys():
    """Llama 3 8B at 32k tokens on 8 H100s, FSDP2 x CP2 against FSDP2 on a replica's same sequence: half of every
    layer's tokens, but attention under the suite's mask computes each rank's whole (queries x keys) block (twice the
    causal share torch's ring attention, torchtitan's, computes); each block's keys and values gathered in forward,
    again in its recomputed forward, and their gradients reduce-scattered."""
    torchtitan = ["framework=torchtitan"]  # its torch's attention kernel on both sides (FlashAttention-2)
    (whole,), (split,), (ring,), (whole_ring,) = (
        plan([[*H100_8B, *extra]], runs_here=False)
        for extra in ([], ["strategy.cp=2"], ["strategy.cp=2", *torchtitan], torchtitan))
    whole_p, split_p, ring_p = predict(whole), predict(split), predict(ring)
    assert ring_p.step.compute < split_p.step.compute
    whole_ring = predict(whole_ring).step.compute
    assert 0.45 * whole_ring < ring_p.step.compute < 0.55 * whole_ring
    assert split_p.memory.activations < 0.6 * whole_p.memory.activations
    keys_values = 2 * 1 * 32768 * 1024 * 2  # keys and values: 8 kv heads of 128, bf16, the rank's one sequence
    assert gathered_keys_values(workload(split)[0]) == keys_values
    # 32 blocks: gathered in forward and in the recomputed forward, reduce-scattered in backward; a rank sends half
    assert split_p.step.sent - whole_p.step.sent == pytest.approx((32 + 32 + 32) * keys_values / 2)
