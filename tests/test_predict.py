"""The performance model's analytic pieces against hand-computed cases, its profile and its cache."""

import functools
import json
import os
from dataclasses import replace

import pytest
import yaml
from omegaconf import OmegaConf

from analysis.model_score import Scored, cell_scores, fits_accuracy, kendall_tau, strategy_errors
from suite.errors import ConfigError
from suite.layout import Layout
from suite.predict import step
from suite.predict.costs import (
    DeviceWork,
    bubble_fraction,
    buckets,
    flushed_schedule,
    prefetched_compute,
    trailing_comm,
)
from suite.predict.links import LinkModel, Measured, calibrated_links, link_model, sent_bytes
from suite.predict.memory import _input_bytes as input_bytes
from suite.predict.memory import _workspace as memory_workspace
from suite.predict.memory import rank_memory
from suite.predict.predictor import crowding, predict, workload
from suite.predict.step import OVERLAP_SLOWDOWN, Workload, step_time
from suite.profiling.cache import _median_times, network_profile
from suite.profiling.profiles import WINDOW_S, LayerProfile, Profile, window_s
from suite.strategies.ddp import DDP
from suite.strategies.fsdp import FSDP
from suite.strategies.gpipe import GPipe
from suite.strategies.horovod import Horovod
from suite.strategies.megatron import Megatron
from suite.strategies.one_f_one_b import OneFOneB
from suite.strategies.pipedream import PipeDream
from suite.strategies.zero import Zero
from suite.sweep.plan import plan

GB = 1e9
LINK = LinkModel.from_hardware(latency_us=10, bandwidth_gbs=1, where="test")  # 10 us per ring step, 1 GB/s


def test_ring_all_reduce_from_an_alpha_beta_link():
    """Ring all-reduce of S bytes among p ranks: 2(p - 1) steps of alpha + S / (p B)."""
    size = 100e6
    for p in (2, 4, 8):
        expected = 2 * (p - 1) * (10e-6 + size / p / GB)
        assert LINK.collective("all_reduce", size, p) == pytest.approx(expected)
    assert LINK.collective("all_gather", size, 4) == pytest.approx(3 * (10e-6 + size / 4 / GB))
    assert LINK.collective("all_reduce", size, 1) == 0.0
    assert LINK.send(1e6) == pytest.approx(10e-6 + 1e-3)


def test_measured_curve_interpolates_log_log_and_extrapolates_at_the_last_bandwidth():
    curve = Measured((1e3, 1e6), (1e-4, 1e-2))
    assert curve.time(10**4.5) == pytest.approx(1e-3)
    assert curve.time(1e2) == pytest.approx(1e-4)  # below the smallest: its latency
    assert curve.time(2e6) == pytest.approx(2e-2)


def calibration_record(directory, world_size: int = 2, name: str = "test"):
    """A calibration record in the schema of `make calibrate` (results/calibration/<cluster>.yaml): every
    collective at two sizes on a 10 us, 1 GB/s ring of `world_size` ranks of one node, and the send curve with one
    time below a smaller message's (noise)."""
    def rows(kind: str) -> list[dict]:
        return [{"bytes": n, "time_s": LINK.collective(kind, n, world_size), "algbw_gbs": 1.0, "busbw_gbs": 1.0,
                 "iterations": 10} for n in (1024, 2**26)]
    sends = [{"bytes": n, "time_s": t, "bandwidth_gbs": n / t / GB, "iterations": 10}
             for n, t in ((2**26, LINK.send(2**26)), (1024, LINK.send(1024)), (4096, LINK.send(1024) / 2))]
    provenance = {"world_size": world_size, "nodes": 1, "ranks_per_node": world_size, "device": "test CPU",
                  "date": "2026-11-22", "hosts": ["localhost"]}
    record = {"cluster": name, "provenance": provenance,
              "matmul": {"n": 64, "threads": 2, "tflops": {"fp32": 1.0}},
              "collectives": {"intra_node": {"ranks": world_size, **{
                  k: rows(k) for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")}}},
              "p2p": {"intra_node": {"ranks": [0, 1], "latency_s": 10e-6, "bandwidth_gbs": 1.0, "curve": sends}}}
    path = directory / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(record))
    return path


def test_link_model_reads_a_calibration_record(tmp_path):
    links = LinkModel.from_calibration(calibration_record(tmp_path, world_size=4))
    assert links.world_size == 4
    assert links.collective("all_reduce", 2**26, 4) == pytest.approx(LINK.collective("all_reduce", 2**26, 4))
    # At 8 ranks: the latency grows with the ring's steps, the rest with the bus factor.
    alpha = LINK.collective("all_reduce", 1024, 4)
    rest = LINK.collective("all_reduce", 2**26, 4) - alpha
    assert links.collective("all_reduce", 2**26, 8) == pytest.approx(alpha * 14 / 6 + rest * (14 / 8) / (6 / 4))
    assert links.send(4096) == pytest.approx(links.send(1024))  # a time below a smaller message's is noise


def test_links_come_from_the_calibration_of_ranks_nearest_the_points(tmp_path, monkeypatch):
    """`make calibrate` at 2 ranks, then at 4 (`<cluster>.w<ranks>.yaml` beside the latest): a point of 4 or 8
    ranks is priced by the 4-rank curves, one of 2 by the 2-rank ones; held out by worker count (`fewer_than`),
    the 4-rank point by the 2-rank curves. The latest record counts at its own ranks, where it is the newest."""
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(tmp_path))
    directory = tmp_path / "calibration"
    calibration_record(directory, world_size=2).rename(directory / "test.w2.yaml")
    calibration_record(directory, world_size=4).rename(directory / "test.w4.yaml")
    (directory / "test.w2.overhead.yaml").write_text("strategies: {}\n")  # beside them, not a record
    cluster = OmegaConf.create({"name": "test", "device": "cpu", "scheduler": "local", "hardware": {}})
    assert [links.world_size for links in calibrated_links("test", nodes=1)] == [2, 4]
    assert link_model(cluster, nodes=1, ranks=2).world_size == 2
    assert link_model(cluster, nodes=1, ranks=4).world_size == 4
    assert link_model(cluster, nodes=1, ranks=8).source == "calibration test.w4.yaml (intra_node, 4 ranks)"
    assert link_model(cluster, nodes=1, ranks=4, fewer_than=4).world_size == 2
    latest = calibration_record(directory, world_size=2)
    record = yaml.safe_load(latest.read_text())
    latest.write_text(yaml.safe_dump({**record, "provenance": {**record["provenance"], "date": "2026-11-23"}}))
    assert link_model(cluster, nodes=1, ranks=2).source == "calibration test.yaml (intra_node, 2 ranks)"


def test_bubble_formula():
    """GPipe and 1F1B: (p - 1) / (m + p - 1); Study J's Eq. 6.1 factor (W + m - 1) / (W m) is 0.31 for W=4, m=12."""
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(4, 12, virtual_stages=2) == pytest.approx(3 / 27)
    step = flushed_schedule([DeviceWork(1.0, 0.0)] * 4, micro_batches=12)
    assert step.total == pytest.approx(15.0) and step.bubble / step.total == pytest.approx(bubble_fraction(4, 12))
    assert step.total / (12 * 4) == pytest.approx(0.3125)
    uneven = flushed_schedule([DeviceWork(1.0, 0.1), DeviceWork(2.0, 0.1)], micro_batches=4)
    assert (uneven.compute, uneven.comm, uneven.bubble) == pytest.approx((8.0, 0.4, 1.1))
    # Zero bubble (ZB-H1): forward, inputs' and weights' gradients a third each; a fill slot costs the forward
    thirds = flushed_schedule([DeviceWork(3.0, 0.0, weight_grads=1.0)] * 4, micro_batches=12, zero_bubble=True)
    assert thirds.bubble == pytest.approx(3 * 1.0) and thirds.total == pytest.approx(12 * 3.0 + 3.0)


def test_a_zero_bubble_pipeline_is_priced_with_the_weights_gradients_in_its_bubble():
    common = ["dataset=tokens", "dataset.seq_len=128", "dataset.vocab_size=512", "network=gpt2_mini",
              "cluster=dgx_a100_80gb", "cluster.job.account=x", "precision=bf16", "strategy=1f1b", "workers=4",
              "batch_size=16", "strategy.micro_batches=8"]
    one_f_one_b, zero_bubble = (predict(plan([[*common, *extra]])[0])
                                for extra in ([], ["strategy.schedule=zero_bubble"]))
    assert zero_bubble.step.compute == pytest.approx(one_f_one_b.step.compute)
    assert 0 < zero_bubble.step.bubble < 0.6 * one_f_one_b.step.bubble


def test_overlap_of_communication_with_compute():
    assert trailing_comm([1, 2, 3], [0.5, 0.5, 2]) == pytest.approx(5.0)
    # Unit k computes once its parameters arrived; unit k+1's are fetched while unit k computes.
    assert prefetched_compute([1, 1, 1], [0.5, 2, 0.1]) == pytest.approx([1.5, 3.5, 4.5])
    mib = 2**20
    assert buckets([0.5 * mib, 0.6 * mib, mib, mib, 3 * mib], cap=2 * mib, first_cap=mib) == [[0, 1], [2, 3], [4]]


@functools.cache
def planned_cfg():
    """A planned point's config (GPT-2 of width 8, Adam), which a ZeRO point's DeepSpeed config is generated from."""
    (point,) = plan([[*TINY_GPT, "dataset.seq_len=1", "dataset.vocab_size=1"]])
    return point.cfg


def synthetic(strategy, layout: Layout, layers: list[LayerProfile], optimizer_s: float = 0.0,
              precision: str = "fp32") -> Workload:
    """A workload from a hand-made profile (no measurement), on LINK."""
    cfg = OmegaConf.merge(planned_cfg(), {"precision": precision})
    profile = Profile(key={"batch": layout.micro_batch_size, "device": "test"}, layers=tuple(layers), input_bytes=0,
                      forward_s=0.0, backward_s=0.0, optimizer_s=optimizer_s, optimizer_state_bytes=0, train_bytes=0,
                      buffer_bytes=0)
    return Workload(cfg, strategy, layout, profile, data_s=0.0, links=LINK, steps=1, stages_overlap=True)


def layer(params: float, forward: float = 0.0, backward: float = 0.0, out: int = 0, block: bool = True):
    return LayerProfile("l", forward, backward, 0, 0, out, 0, int(params), 1, 0, block)


def test_zero_volumes_per_stage():
    """Bytes one rank sends per step: ZeRO-1/2 reduce-scatter the gradients (DeepSpeed's `reduce_scatter`) and
    all-gather the parameters, (p - 1) / p of the parameters each; ZeRO-3 gathers parameters in forward (and again
    in backward beyond its reuse distance) and reduce-scatters the gradients; FSDP2 gathers its blocks again for
    backward with `reshard_after_forward`, never its root unit (the layers that are not blocks, half of them here),
    and with `reshard_after_forward=false` none."""
    params = 256e6
    for p in (2, 4):
        layout = Layout(dp=p, mini_batch=8, shard=p)
        ends = [layer(params / 4, block=False) for _ in range(2)]
        layers = [ends[0], *(layer(params / 4) for _ in range(2)), ends[1]]
        share = (p - 1) / p
        for stage in (1, 2):
            step = step_time(synthetic(Zero(zero_stage=stage), layout, layers))
            assert step.sent == pytest.approx(2 * share * params)
            # On CPU nothing hides them: a bucket per layer (the planned GPT-2's hold 8² elements), one all-gather.
            on_cpu = step_time(replace(synthetic(Zero(zero_stage=stage), layout, layers), comm_hides=False))
            assert on_cpu.comm == pytest.approx(2 * share * params / GB + 5 * (p - 1) * 10e-6)
        near = {"zero_optimization": {"stage3_max_reuse_distance": params / 4 / 2}}  # in parameters, not bytes
        assert step_time(synthetic(Zero(zero_stage=3, ds_config=near), layout, layers)).sent == pytest.approx(
            3 * share * params)
        assert step_time(synthetic(Zero(zero_stage=3), layout, layers)).sent == pytest.approx(2 * share * params)
        fsdp = step_time(synthetic(FSDP(reshard_after_forward=True), layout, layers))
        assert fsdp.sent == pytest.approx(2.5 * share * params)
        # On CPU: 3 gathers in forward (the root's with the first unit), the 2 blocks' again, 3 scatters.
        on_cpu = step_time(replace(synthetic(FSDP(reshard_after_forward=True), layout, layers), comm_hides=False))
        assert on_cpu.comm == pytest.approx(2.5 * share * params / GB + 8 * (p - 1) * 10e-6)
        kept = step_time(synthetic(FSDP(reshard_after_forward=False), layout, layers))
        assert kept.sent == pytest.approx(2 * share * params)


def test_zero_1_2_reduce_gradient_buckets_behind_backward():
    """Four layers of 8 MiB gradients, 1 s of backward each, buckets of 2 Mi elements (8 MiB in fp32): with
    `overlap_comm` each layer's bucket is reduce-scattered while backward goes on, and only the last one (the first
    layer's, at the end of backward) is exposed, and backward loses OVERLAP_SLOWDOWN of the three it hides; without
    it all four are exposed. Either way the parameters' all-gather follows the step. `reduce_scatter: false`
    all-reduces the buckets instead."""
    mib = 2**20
    layers = [layer(8 * mib, backward=1.0) for _ in range(4)]
    layout = Layout(dp=2, mini_batch=8, shard=2)
    gather = LINK.collective("all_gather", 32 * mib, 2)
    scatter = LINK.collective("reduce_scatter", 8 * mib, 2)

    def zero(stage: int, **knobs) -> Workload:
        config = {"zero_optimization": {"reduce_bucket_size": 2 * mib, **knobs}}
        return synthetic(Zero(zero_stage=stage, ds_config=config), layout, layers)

    for stage in (1, 2):
        overlapped, after = step_time(zero(stage)), step_time(zero(stage, overlap_comm=False))
        assert overlapped.comm == pytest.approx(scatter + OVERLAP_SLOWDOWN * 3 * scatter + gather)
        assert after.comm == pytest.approx(4 * scatter + gather)
        assert overlapped.sent == after.sent
        reduced = step_time(zero(stage, reduce_scatter=False))
        reduce = LINK.collective("all_reduce", 8 * mib, 2)
        assert reduced.comm == pytest.approx(reduce + OVERLAP_SLOWDOWN * 3 * reduce + gather)
        # The buckets as DeepSpeed allocates them: two with overlap_comm, one without.
        assert rank_memory(zero(stage), 0.0).transient == 2 * 8 * mib
        assert rank_memory(zero(stage, overlap_comm=False), 0.0).transient == 8 * mib


def test_fsdp_computes_slower_by_overlap_slowdown_while_its_hidden_collectives_run(monkeypatch):
    """Four blocks of 64 MiB, 1 s forward and 2 s backward each over 2 ranks: what FSDP's gathers and reduce-scatters
    do not expose (on a CPU all of them add: `comm_hides=False`) ran beside compute, which loses OVERLAP_SLOWDOWN of
    their time."""
    layers = [layer(64 * 2**20, forward=1.0, backward=2.0) for _ in range(4)]
    w = synthetic(FSDP(reshard_after_forward=True), Layout(dp=2, mini_batch=8, shard=2), layers)
    issued = step_time(replace(w, comm_hides=False)).comm
    with_slowdown = step_time(w).comm
    monkeypatch.setattr(step, "OVERLAP_SLOWDOWN", 0.0)
    exposed = step_time(w).comm
    assert 0 < exposed < issued
    assert with_slowdown == pytest.approx(exposed + OVERLAP_SLOWDOWN * (issued - exposed))


def test_zero_3_never_gathers_layers_under_the_persistence_threshold():
    """ZeRO-3 holds a layer smaller than `stage3_param_persistence_threshold` whole: it is gathered once, after the
    step, where the others are gathered in forward and (beyond the reuse distance) again in backward."""
    params = 256e6
    layout = Layout(dp=2, mini_batch=8, shard=2)
    ends = [layer(params / 8, block=False) for _ in range(2)]
    layers = [ends[0], layer(params / 4), layer(params / 4), ends[1]]
    near = {"stage3_max_reuse_distance": params / 4 / 2}
    gathered = step_time(synthetic(Zero(zero_stage=3, ds_config={"zero_optimization": near}), layout, layers))
    persistent = {**near, "stage3_param_persistence_threshold": params / 8 / 4 + 1}  # the ends, in parameters
    kept = step_time(synthetic(Zero(zero_stage=3, ds_config={"zero_optimization": persistent}), layout, layers))
    assert gathered.sent - kept.sent == pytest.approx(sent_bytes("all_gather", params / 4, 2))


def test_fsdp_gathers_half_precision_parameters_and_reduces_fp32_gradients():
    """A bf16 or fp16 point's FSDP2 (MixedPrecisionPolicy param_dtype) gathers half the bytes of an fp32 one's,
    holds its gathered units in half the memory, and reduce-scatters the same fp32 gradients."""
    params = 256e6
    layout = Layout(dp=2, mini_batch=8, shard=2)
    layers = [layer(params / 4, block=False), layer(params / 4), layer(params / 4), layer(params / 4, block=False)]
    scattered = sent_bytes("reduce_scatter", params, 2)
    for reshard in (True, False):
        fp32 = synthetic(FSDP(reshard_after_forward=reshard), layout, layers)
        for precision in ("bf16", "fp16"):
            half = synthetic(FSDP(reshard_after_forward=reshard), layout, layers, precision=precision)
            assert step_time(half).sent - scattered == pytest.approx((step_time(fp32).sent - scattered) / 2)
            assert rank_memory(half, 0.0).transient == pytest.approx(rank_memory(fp32, 0.0).transient / 2)


def test_megatron_split_loss_sends_nothing_the_size_of_the_logits():
    """tp=2, two blocks of 1 MB activations, batch 8 of 16 tokens: split by vocabulary, the embedding's output and
    the head's input gradient are all-reduced, and the loss three values per token (512 B each): what a rank sends
    does not grow with the vocabulary (nothing b x s x v is gathered). Under sequence parallelism the head's input
    is all-gathered in forward and its gradient reduce-scattered."""
    activation, tokens = 10**6, 8 * 16
    layers = [layer(4e6, block=False, out=activation), layer(4e6, out=activation), layer(4e6, out=activation),
              layer(0, block=False)]
    layout = Layout(dp=1, tp=2, mini_batch=8)

    def sent(vocab_size: int, **knobs) -> float:
        w = synthetic(Megatron(tp=2, **knobs), layout, layers)
        return step_time(replace(w, cfg=OmegaConf.merge(w.cfg, {"dataset": {"seq_len": 16,
                                                                            "vocab_size": vocab_size}}))).sent
    whole = sent(50257, vocab_parallel=False)
    batch = 16 + 2 * tokens * 8  # broadcast by the group's first rank: its shape, int64 inputs and targets
    assert whole == pytest.approx(sent_bytes("all_reduce", activation, 2) * 8 + batch)  # the blocks' four each way
    split = whole + sent_bytes("all_reduce", 2 * activation + 3 * 4 * tokens, 2)
    assert sent(50257) == sent(50) == pytest.approx(split)
    sequence = sent(50257, sequence_parallel=True) - sent(50257, vocab_parallel=False, sequence_parallel=True)
    head_input = sent_bytes("all_gather", activation, 2) + sent_bytes("reduce_scatter", activation, 2)
    assert sequence == pytest.approx(sent_bytes("all_reduce", activation + 3 * 4 * tokens, 2) + head_input)


def test_megatron_overlapped_gradient_reduction_exposes_only_what_ends_after_backward():
    """tp=1 over dp=2 replicas, four layers of 8 MiB gradients and 1 s of backward each: one all-reduce of all 32 MiB
    after backward (Megatron-LM's default), or with `overlap_grad_reduce` buckets of 2 Mi elements (8 MiB) all-reduced
    while backward goes on, of which only the last is exposed (backward slowed by the three it hides); the same bytes
    either way."""
    mib = 2**20
    layers = [layer(8 * mib, backward=1.0) for _ in range(4)]
    layout = Layout(dp=2, tp=1, mini_batch=8)
    flat = step_time(synthetic(Megatron(tp=1), layout, layers))
    overlapped = step_time(synthetic(Megatron(tp=1, overlap_grad_reduce=True, bucket_size=2 * mib), layout, layers))
    assert flat.comm == pytest.approx(LINK.collective("all_reduce", 32 * mib, 2))
    bucket = LINK.collective("all_reduce", 8 * mib, 2)
    assert overlapped.comm == pytest.approx(bucket + OVERLAP_SLOWDOWN * 3 * bucket)
    assert overlapped.sent == flat.sent


def test_megatron_accumulating_gradients_computes_each_micro_batch_and_reduces_once():
    """2 micro-batches a step: forward and backward twice, the replicas' all-reduce once (Megatron-LM's, in the last
    micro-batch's backward); exposed after it, or of the overlapped buckets only the tail of the last backward."""
    mib = 2**20
    layers = [layer(8 * mib, forward=0.5, backward=1.0) for _ in range(4)]
    for strategy in (Megatron(tp=1), Megatron(tp=1, overlap_grad_reduce=True, bucket_size=2 * mib)):
        once = step_time(synthetic(strategy, Layout(dp=2, tp=1, mini_batch=8), layers))
        twice = step_time(synthetic(strategy, Layout(dp=2, tp=1, mini_batch=16, micro_batches=2), layers))
        assert (twice.compute, twice.comm, twice.sent) == pytest.approx((2 * once.compute, once.comm, once.sent))


def test_ddp_hides_buckets_behind_backward_and_exposes_the_tail():
    """Four layers of 8 MiB gradients, 1 s of backward each, a 16 MiB bucket cap: the first bucket (1 MiB cap)
    closes on the last layer's 8 MiB, the next on two layers, the last with the first layer, at the end of
    backward, so its all-reduce (8 MiB over 1 GB/s among 2) is exposed, and backward loses OVERLAP_SLOWDOWN of the
    time of the two it hides (their kernels share the GPU with it); on CPU all three are exposed."""
    mib = 2**20
    layers = [layer(8 * mib, backward=1.0) for _ in range(4)]
    w = synthetic(DDP(bucket_cap_mb=16, forward_sync_buffers=False), Layout(dp=2, mini_batch=8), layers)
    def all_reduce(n: int) -> float:
        return 2 * 10e-6 + n * mib / GB

    assert step_time(w).comm == pytest.approx(all_reduce(8) + OVERLAP_SLOWDOWN * (all_reduce(8) + all_reduce(16)))
    # A CPU rank's all-reduces take the cores backward runs on: none of the three buckets is hidden.
    assert step_time(replace(w, comm_hides=False)).comm == pytest.approx(3 * 2 * 10e-6 + 32 * mib / GB)
    eq51 = step_time(w, "study_j").comm  # Eq. 5.1: 2 (W - 1) (L + min(G, th) / (W BW)), th = the bucket cap
    assert eq51 == pytest.approx(2 * (10e-6 + 16 * mib / 2 / GB))
    hvd = synthetic(Horovod(fusion_threshold_mb=0, cycle_time_ms=1), Layout(dp=2, mini_batch=8), layers)
    assert step_time(hvd).comm == pytest.approx(all_reduce(8) + OVERLAP_SLOWDOWN * 3 * all_reduce(8))  # a layer each


def test_loader_processes_hide_the_data_behind_a_gpus_step():
    """A step of 1 s forward, 2 s backward, 0.5 s optimizer: the batch's 1 s of loading adds to it where the rank
    loads it itself (or the loader's processes share its CPU cores); loader processes feeding a GPU make it while
    the GPU computes, so only what exceeds the rest of the step (here 4 s of loading: 0.5 s) is waited for."""
    one = synthetic(DDP(), Layout(dp=1, mini_batch=8), [layer(4, 1.0, 2.0)], optimizer_s=0.5)
    assert step_time(replace(one, data_s=1.0)).total == pytest.approx(4.5)
    assert step_time(replace(one, data_s=1.0, data_overlaps=True)).total == pytest.approx(3.5)
    assert step_time(replace(one, data_s=4.0, data_overlaps=True)).data == pytest.approx(0.5)


def test_pipeline_step_from_the_partition():
    """Two stages of two layers (explicit balance), 4 micro-batches: the busier stage works 4 times, the other
    fills and drains once; sends of the boundary activation each way are not hidden."""
    layers = [layer(4, 1.0, 2.0, out=1000), layer(4, 1.0, 2.0, out=10**6), layer(4, 0.5, 1.0, out=1000),
              layer(4, 0.5, 1.0, out=4)]
    w = synthetic(OneFOneB(balance=[2, 2], micro_batches=4), Layout(dp=1, pp=2, mini_batch=4, micro_batches=4),
                  layers)
    step = step_time(w)
    send = LINK.send(10**6)
    assert step.compute == pytest.approx(4 * 6.0)
    assert step.comm == pytest.approx(4 * send)
    assert step.bubble == pytest.approx(3.0 + send)


def test_a_frameworks_pipelines_are_cut_by_its_own_rule_not_by_time():
    """An embedding, 8 blocks and a head over 4 stages: Megatron-LM cuts 2 blocks a stage, the ends besides
    (`equal_blocks`; a count that does not divide it refuses); BLOOM's DeepSpeed counts the embedding and the head
    as a block each and fills the stages in turn with 3 (`equal_layers`: partition_balanced on equal weights). The
    suite's own pipelines are cut by the profile's times (`balance`, torchgpipe's balancer)."""
    layers = [layer(4, 0.1, 0.2, block=False), *(layer(4, 1.0, 2.0) for _ in range(8)),
              layer(4, 3.0, 6.0, block=False)]
    layout = Layout(dp=1, pp=4, mini_batch=8, micro_batches=8)

    def cut(rule: str | None, pp: int = 4) -> list[int]:
        w = synthetic(OneFOneB(balance="by_time", micro_batches=8), replace(layout, pp=pp), layers)
        if rule:
            cfg = OmegaConf.to_container(w.cfg)
            cfg["framework"]["pipeline_partition"] = {"rule": rule}
            w = replace(w, cfg=OmegaConf.create(cfg))
        return step.stage_sizes(w)

    assert cut(None) == step.balance([x.forward_s + x.backward_s for x in layers], 4)
    assert cut("equal_blocks") == [3, 2, 2, 3]
    assert cut("equal_layers") == [3, 3, 3, 1]
    assert cut("equal_layers", pp=5) == [2] * 5
    with pytest.raises(ConfigError, match="8 blocks do not split evenly into 3 pipeline chunks"):
        cut("equal_blocks", pp=3)


def test_a_pipeline_on_fewer_cores_than_ranks_lasts_at_least_its_work_shared_among_them():
    """The stages above (6 s and 3 s per micro-batch) with their ranks 2 to a core: the 4 micro-batches' work per
    stage, 24 s and 12 s, shared out, take 2 x 18 s = 36 s, longer than the schedule's 27 s and its sends: the rest
    is the ranks' wait for a core. At 1.25 ranks a core, 22.5 s: the schedule is the longer, nothing is added.
    PipeDream's step is one mini-batch per stage (6 s and 3 s), its fill spread over 1000 steps: at 2 ranks a core,
    9 s."""
    layers = [layer(4, 1.0, 2.0, out=1000), layer(4, 1.0, 2.0, out=10**6), layer(4, 0.5, 1.0, out=1000),
              layer(4, 0.5, 1.0, out=4)]
    w = synthetic(OneFOneB(balance=[2, 2], micro_batches=4), Layout(dp=1, pp=2, mini_batch=4, micro_batches=4),
                  layers)
    scheduled = step_time(w).total
    crowded = step_time(replace(w, oversubscription=2.0))
    assert crowded.total == pytest.approx(36.0)
    assert crowded.core_wait == pytest.approx(36.0 - scheduled)
    assert step_time(replace(w, oversubscription=1.25)) == step_time(w)
    pipedream = synthetic(PipeDream(balance=[2, 2]), Layout(dp=1, pp=2, mini_batch=4), layers)
    assert step_time(replace(pipedream, steps=1000, oversubscription=2.0)).total == pytest.approx(9.0)


def test_torchgpipe_on_cpu_runs_its_stages_in_turn():
    """One worker thread runs every stage's forward, slower there than on the caller (x1.5 here), the caller
    runs backward and recomputes the checkpointed micro-batches' forward (3 of 4 with `except_last`)."""
    layers = [layer(4, 1.0, 2.0, out=1000), layer(4, 1.0, 2.0, out=10**6), layer(4, 0.5, 1.0, out=1000),
              layer(4, 0.5, 1.0, out=4)]
    layout = Layout(dp=1, pp=2, mini_batch=4, micro_batches=4, stages_in_one_process=True)
    for checkpoint, recomputed in (("never", 0.0), ("except_last", 3 / 4 * 3.0)):
        w = synthetic(GPipe(balance=[2, 2], micro_batches=4, checkpoint=checkpoint), layout, layers)
        one_thread = replace(w, stages_overlap=False, worker_forward_slowdown=1.5)
        step = step_time(one_thread)
        assert (step.comm, step.bubble) == (0.0, 0.0)
        assert step.compute == pytest.approx(4 * (1.5 * 3.0 + 6.0 + recomputed))


TINY_GPT = ["dataset=tokens", "network=gpt2_nano", "dataset.vocab_size=16", "dataset.seq_len=4", "dataset.samples=64",
            "batch_size=2", "optimizer.name=adam"]


@pytest.fixture
def calibrated(results):
    """This machine's calibration record (the links of cluster=local) in the test's results directory."""
    return calibration_record(results / "calibration", name="local")


def tiny_point(*overrides: str):
    (point,) = plan([[*TINY_GPT, *overrides]])
    return point


@pytest.mark.slow  # profiles in a child interpreter
def test_memory_of_a_known_network(calibrated):
    """GPT-2 with one block of width 8, vocabulary 16, 4 tokens: 16x8 + 4x8 embeddings, 12x8^2 + 13x8 in the
    block, 2x8 in the final LayerNorm, the head tied: 1048 fp32 parameters; Adam keeps two moments each and a
    step count per tensor (16 tensors)."""
    params = 16 * 8 + 4 * 8 + 12 * 64 + 13 * 8 + 2 * 8
    w, _, _ = workload(tiny_point("strategy=single"))
    assert w.profile.param_bytes == 4 * params
    memory = rank_memory(w, base_bytes=0.0)
    assert (memory.params, memory.grads, memory.optimizer) == (4 * params, 4 * params, 8 * params + 16 * 4)
    assert memory.activations == sum(layer.saved_bytes for layer in w.profile.layers) > 0
    sharded, _, _ = workload(tiny_point("strategy=fsdp", "workers=2"))
    split = rank_memory(sharded, base_bytes=0.0)
    assert (split.params, split.grads) == (2 * params, 2 * params)
    # Tensor parallel: the peak is where backward starts, its workspace the head's (the logits' softmax and
    # gradients), whole on each rank unless the vocabulary is split.
    megatron = ["strategy=megatron", "workers=2", "network.n_head=2"]
    tp, _, _ = workload(tiny_point(*megatron, "strategy.vocab_parallel=false"))
    vocab, _, _ = workload(tiny_point(*megatron, "strategy.vocab_parallel=true"))  # split by vocabulary
    assert tp.profile.layers[-1].name == "GPT2Head"
    workspace = memory_workspace(tp)
    assert workspace > 0
    assert rank_memory(tp, 0.0).transient == pytest.approx(input_bytes(tp) + workspace)
    assert rank_memory(vocab, 0.0).transient == pytest.approx(input_bytes(vocab) + workspace / 2)


@pytest.mark.slow  # profiles in a child interpreter
def test_selective_recomputation_is_priced_from_the_attention_cores_profiled_here(calibrated, monkeypatch):
    """The profile times each block's attention core alone and finds what it keeps that nothing else does (under
    the math kernel, its scores' softmax at least: batch x heads x s^2 fp32 values); selective recomputation adds
    the cores' forward to backward and drops those bytes from what a step keeps, its workspace unchanged. The two
    points share one profile, reused as taken (a busy machine's would be taken again for the second: flaky)."""
    from suite.profiling import cache
    monkeypatch.setattr(cache, "busy_share", lambda: 0.0)
    knobs = ("strategy=single", "network.attention=math", "network.n_head=2", "dataset.seq_len=16")
    plain, _, _ = workload(tiny_point(*knobs))
    selective, _, _ = workload(tiny_point(*knobs, "activation_checkpointing=selective"))
    embedding, block, head = plain.profile.layers
    assert block.core_forward_s > 0 and block.core_forward_flops > 0
    assert block.core_saved_bytes >= 2 * 2 * 16 * 16 * 4
    assert embedding.core_saved_bytes == head.core_saved_bytes == head.core_forward_s == 0
    assert selective.profile.backward_s == pytest.approx(plain.profile.backward_s + block.core_forward_s)
    plain_memory, selective_memory = rank_memory(plain, 0.0), rank_memory(selective, 0.0)
    assert plain_memory.activations - selective_memory.activations == block.core_saved_bytes
    assert selective_memory.transient == plain_memory.transient


@pytest.mark.slow  # profiles in a child interpreter
def test_profile_is_cached(results, monkeypatch):
    """Reused as taken. The machine reads as quiet here: a profile taken while the other test workers kept the
    cores busy is taken again once they are quieter (test_damaged_state's subject), which made this test flaky."""
    import torch

    from suite.profiling import cache
    monkeypatch.setattr(cache, "busy_share", lambda: 0.0)
    point = tiny_point("strategy=single")

    first, hit = network_profile(point.cfg, 2, torch.device("cpu"), 1)
    assert not hit and len(first.layers) == 3 and first.flops > 0
    assert [layer.block for layer in first.layers] == [False, True, False]
    assert first.taken["window_s"] == 0.5  # the tests' SUITE_PROFILE_WINDOW_S (conftest), said with the profile
    again, hit = network_profile(point.cfg, 2, torch.device("cpu"), 1)
    assert hit and again == first
    assert len(list((results / "profiles").glob("net-gpt2_nano-b2-fp32-t1-*.json"))) == 1


def test_a_profile_window_that_is_not_seconds_is_one_line(monkeypatch):
    monkeypatch.setenv("SUITE_PROFILE_WINDOW_S", "5s")
    with pytest.raises(ConfigError, match=r"^SUITE_PROFILE_WINDOW_S='5s' is not a number of seconds \(0 or more\)$"):
        window_s()
    monkeypatch.setenv("SUITE_PROFILE_WINDOW_S", "-1")
    with pytest.raises(ConfigError):
        window_s()
    monkeypatch.delenv("SUITE_PROFILE_WINDOW_S")
    assert window_s() == WINDOW_S


@pytest.mark.slow  # profiles in a child interpreter
def test_gpipe_on_cpu_prices_its_forwards_on_a_worker_thread(results):
    """A CPU gpipe point's workload takes the forward's slowdown on a worker thread from a profile of its own,
    taken at the micro-batch; other strategies' do not."""
    w, _, profiled_on = workload(tiny_point("strategy=gpipe", "workers=2", "strategy.micro_batches=2"))
    (path,) = (results / "profiles").glob("thread-gpt2_nano-b1-*.json")
    taken = json.loads(path.read_text())
    assert taken["forward_s"] > 0 and taken["worker_forward_s"] > 0
    assert w.worker_forward_slowdown == pytest.approx(taken["worker_forward_s"] / taken["forward_s"])
    assert f"forward x{w.worker_forward_slowdown:.2f} on torchgpipe's worker thread" in profiled_on
    ddp, _, _ = workload(tiny_point("strategy=ddp"))
    assert ddp.worker_forward_slowdown == 1.0


@pytest.mark.slow  # profiles in a child interpreter
def test_a_pipeline_of_more_ranks_than_cores_is_profiled_at_the_ranks_they_run_at_once(calibrated):
    """A 1f1b point of 2 ranks per core: its stages are profiled with as many ranks at once as the cores run (the
    profile's `together`), and its step is bounded by the oversubscription; a ddp point's ranks all compute at
    once, so its profile is taken with all of them and it has none."""
    cores = os.cpu_count()
    w, _, _ = workload(tiny_point("strategy=1f1b", f"workers={2 * cores}", "network.n_layer=2", "batch_size=4",
                                  "strategy.micro_batches=4"))
    assert w.oversubscription == 2.0
    assert w.profile.key["together"] == cores
    ddp_point = tiny_point("strategy=ddp", f"workers={2 * cores}")
    ddp, _, _ = workload(ddp_point)
    assert (ddp.oversubscription, ddp.profile.key["together"]) == (1.0, 2 * cores)
    assert crowding(ddp_point) == 2.0  # its library overhead, a rank's CPU work, takes twice the probes'
    assert crowding(tiny_point("strategy=ddp", f"workers={cores}")) == 1.0


def scored(label: str, predicted: float, measured: float | None, status: str = "finished", fits: bool = True,
           spread: float = 0.01) -> Scored:
    return Scored(label, label.split()[0], "cell", predicted, 100.0, fits, status, measured,
                  None if measured is None else 110.0, spread)


def test_scoring_of_predictions_and_of_the_recommender():
    grid = [scored("ddp", 1.0, 1.02), scored("zero", 2.0, 1.0), scored("gpipe", 3.0, 3.0),
            scored("fsdp", 0.5, None, status="oom", fits=False)]
    assert kendall_tau([1, 2, 3], [1, 2, 3]) == 1.0 and kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    (cell,) = cell_scores(grid)
    assert (cell.pick.label, cell.best.label) == ("ddp", "zero")  # fsdp is predicted not to fit: never picked
    assert cell.regret == pytest.approx(0.02) and cell.right  # within 3% of the fastest
    assert cell.tau == pytest.approx(1 / 3)  # ddp/zero swapped, the other two pairs in order
    errors = strategy_errors(grid)
    assert errors["zero"]["median"] == pytest.approx(1.0) and errors["zero"]["bias"] == pytest.approx(1.0)
    assert errors["ddp"]["bias"] == pytest.approx(1.0 / 1.02 - 1)
    assert errors["ddp"]["memory"] == pytest.approx(1 - 100 / 110)
    assert fits_accuracy(grid) == (4, 4)  # three finished and fit, one ran out of memory and did not fit


def test_profiles_of_processes_at_once_take_the_median_time():
    results = [{"forward_s": t, "train_bytes": 7 * i, "layers": [{"name": "a", "backward_s": 2 * t}]}
               for i, t in enumerate((1.0, 3.0, 2.0))]
    merged = _median_times(results)
    assert merged == {"forward_s": 2.0, "train_bytes": 0, "layers": [{"name": "a", "backward_s": 4.0}]}


def test_a_one_rank_calibration_record_prices_one_rank_points_and_refuses_more(tmp_path, monkeypatch):
    """`make calibrate` on a machine with one GPU measures its matmul peak and no links: its record still prices a
    one-rank point; a point of more ranks needs link costs and says where to get them."""
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(tmp_path))
    path = calibration_record(tmp_path / "calibration")
    record = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**record, "collectives": {}, "p2p": {}}))
    assert LinkModel.from_calibration(path) is None
    cluster = OmegaConf.create({"name": "test", "device": "cpu", "scheduler": "local", "hardware": {}})
    links = link_model(cluster, nodes=1, ranks=2)
    assert links.collective("all_reduce", 2**20, 1) == 0.0
    with pytest.raises(ConfigError, match="cluster test has no link costs: run `make calibrate CLUSTER=test`"):
        links.collective("all_reduce", 2**20, 2)
