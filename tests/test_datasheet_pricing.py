"""Pricing a GPU cluster from its datasheet, with nothing calibrated or profiled on a GPU: the kernels a step
launches counted on the meta device (suite.profiling.counted), priced by a roofline (suite.predict.roofline),
links by NCCL's own cost model of the catalog fabric (suite.predict.fabric), and `make predict` answering for a
catalog cluster on a fresh clone."""

import json
import math

import pytest
import torch

from conftest import edit_catalog_entry, run_make
from suite.errors import ConfigError
from suite.predict import fabric, roofline
from suite.predict.predictor import predict, workload
from suite.predict.recommend import rank_cell, strategy_overrides
from suite.predict.step import devices, pipeline_sends, split_block_collectives
from suite.profiling.cores import CoreWatch
from suite.profiling.counted import ATTENTION, CONV, MATMUL, MEMORY, Kernel, _Kernels, count_network
from suite.sweep.plan import plan
from suite.tools.benchmarks.kernels import profiled_kind

TOKENS = ["dataset=tokens", "dataset.seq_len=128", "dataset.vocab_size=512", "dataset.samples=4096"]


def point(*overrides: str, cluster: str = "dgx_a100_80gb", runs_here: bool = False):
    """A point priced (as `make predict` plans it), or, `runs_here`, planned to run (as a sweep plans it)."""
    (p,) = plan([[*TOKENS, "network=gpt2_tiny", f"cluster={cluster}", "cluster.job.account=x", *overrides]],
                runs_here=runs_here)
    return p


def kernels(layers, phase: str) -> list[Kernel]:
    return [k for layer in layers for k in getattr(layer, phase)]


def test_a_gpt2s_counted_flops_are_its_closed_form():
    """Forward: 2 FLOPs per multiply-add of every linear layer (12 d^2 per block and token, and the LM head's V d)
    and causal attention's half of the 2 s^2 d per block and sample of its two products; backward twice the
    linear layers' and 2.5 times attention's (FlashAttention-2)."""
    cfg = point().cfg
    b, s, v = 4, cfg.dataset.seq_len, cfg.dataset.vocab_size
    d, n = cfg.network.n_embd, cfg.network.n_layer
    counted = count_network(cfg, b)
    linear = 2 * b * s * (n * 12 * d * d + v * d)
    attention = n * 2 * 2 * b * s * s * d * 0.5
    forward = sum(k.flops for k in kernels(counted.layers, "forward"))
    backward = sum(k.flops for k in kernels(counted.layers, "backward"))
    assert forward == pytest.approx(linear + attention)
    assert backward == pytest.approx(2 * linear + 2.5 * attention)
    assert [k.kind for k in kernels(counted.layers, "forward") if k.kind == ATTENTION] == [ATTENTION] * n
    assert counted.layers[0].name == "embedding" or counted.layers[0].param_bytes == 4 * (v * d + s * d)


def test_a_transformer_block_keeps_the_activations_korthikanti_et_al_count():
    """Korthikanti et al. (2022), per block and token of width h, in 2-byte activations: 34 s b h, less the two
    residual dropout masks (dropout 0 here; the attention-score terms 5 a s^2 b go with fused attention): 32, i.e. 64
    bytes in fp32. Under bf16 autocast the residual stream and layer-norm inputs stay fp32 (+4), and the attention
    output is kept twice, by fused attention and, made contiguous, by the output projection (+4): 40."""
    for precision, per_token in (("fp32", 64), ("bf16", 40)):
        (p,) = plan([["dataset=tokens", "dataset.seq_len=256", "network=gpt2_small", "cluster=dgx_a100_80gb",
                      f"precision={precision}"]])
        block = count_network(p.cfg, 2).layers[1]
        assert block.saved_bytes / (2 * 256 * p.cfg.network.n_embd) == pytest.approx(per_token, rel=1e-3)


def test_dropout_on_a_gpu_is_cudas_one_kernel_with_a_one_byte_mask():
    """ATen's dropout on a CUDA tensor is native_dropout, one kernel: it reads the input and writes the output and a
    bool mask (2 + 2 + 1 bytes an element in half precision); a CPU draws a mask in the input's dtype, scales it and
    multiplies by it (bernoulli_, div_, mul: 4 + 4 + 6). Megatron-LM's block (half precision, the scores
    materialised, dropout on both residual branches and on the scores) then keeps Korthikanti et al.'s (2022)
    34 s b h + 5 a s^2 b bytes (the masks at one byte an element) and its LayerNorms' statistics."""
    def block(cluster: str, dropout: float):
        cfg = point("framework=megatron_lm", "network.attention=math", f"network.dropout={dropout}", "precision=bf16",
                    cluster=cluster).cfg
        return cfg, count_network(cfg, 2).layers[1]

    for cluster, bytes_per_element in (("dgx_a100_80gb", 5), ("local", 14)):
        cfg, dropped = block(cluster, 0.1)
        _, kept = block(cluster, 0.0)
        b, s, h, a = 2, cfg.dataset.seq_len, cfg.network.n_embd, cfg.network.n_head
        elements = 2 * s * b * h + a * s * s * b  # the two residual branches' and the scores'
        forward = sum(k.bytes for k in dropped.forward) - sum(k.bytes for k in kept.forward)
        assert forward == bytes_per_element * elements, cluster
    beyond = block("dgx_a100_80gb", 0.1)[1].saved_bytes - (34 * s * b * h + 5 * a * s * s * b)
    assert 0 <= beyond <= 2 * 2 * s * b * 4  # and the two LayerNorms' mean and rstd of each token


def test_an_allocation_is_no_kernel_and_filling_it_is_one():
    """The caching allocator hands out memory without a kernel: autograd's `new_empty_strided` for a gradient laid out
    as its parameter is, and so are `new_empty` and `empty`; the `copy_` that fills it is a kernel, which reads its
    source and writes its destination."""
    kernels = _Kernels(False, set(), CoreWatch(torch.nn.Identity()), None, cuda=True)
    with torch.device("meta"), kernels:
        grad = torch.ones(64, 32)
        weight = grad.new_empty_strided((32, 64), (1, 32))
        weight.copy_(grad.t())
        grad.new_empty((8, 8))
        torch.empty(8)
    assert [k.bytes for k in kernels.kernels] == [64 * 32 * 4, 2 * 64 * 32 * 4]  # ones; copy_: read, written


def test_layer_norms_backward_on_a_gpu_reads_its_input_again_for_the_parameters_gradients():
    """ATen's CUDA LayerNorm backward is two kernels: the input's gradient, then GammaBetaBackward's for the weight
    and bias, which reads the output's gradient, the input and its statistics again; a CPU's is counted as one."""
    rows, width, stats = 64 * 32 * 4, 32 * 4, 2 * 64 * 4  # bytes: a [64, 32] fp32 tensor, a row of it, mean and rstd
    with torch.device("meta"):
        x, weight, bias = (torch.ones(*shape, requires_grad=True) for shape in ((64, 32), (32,), (32,)))
        y = torch.nn.functional.layer_norm(x, (32,), weight, bias)
        grad = torch.ones_like(y)
    for cuda, moved in ((True, [3 * rows + stats + width, 2 * rows + stats + 2 * width]),
                        (False, [3 * rows + stats + 4 * width])):
        kernels = _Kernels(False, set(), CoreWatch(torch.nn.Identity()), None, cuda=cuda)
        with kernels:
            torch.autograd.grad(y, (x, weight, bias), grad, retain_graph=True)
        assert [k.bytes for k in kernels.kernels] == moved and all(k.row_reduction for k in kernels.kernels)


def test_half_precision_keeps_and_moves_fewer_bytes_than_fp32():
    fp32 = count_network(point().cfg, 4)
    bf16 = count_network(point("precision=bf16").cfg, 4)
    kept = sum(layer.saved_bytes for layer in bf16.layers) / sum(layer.saved_bytes for layer in fp32.layers)
    assert 0.5 <= kept < 0.8  # matmul and attention tensors in bf16; normalisation, softmax and the loss in fp32
    moved = sum(k.bytes for k in kernels(bf16.layers, "forward") if k.kind == MATMUL)
    assert moved < 0.6 * sum(k.bytes for k in kernels(fp32.layers, "forward") if k.kind == MATMUL)


def test_a_cnns_convolutions_are_counted_as_convolutions():
    (p,) = plan([["dataset=cifar10", "network=resnet18", "cluster=dgx_a100_80gb", "cluster.job.account=x"]])
    counted = count_network(p.cfg, 8)
    kinds = {k.kind for k in kernels(counted.layers, "forward")}
    assert {CONV, MATMUL, MEMORY} <= kinds  # convolutions, the classifier, batch norm and ReLU


def test_the_roofline_prices_a_kernel_at_its_compute_or_its_traffic_whichever_is_longer():
    gpu = roofline.gpu_of(point("precision=bf16").cfg)
    assert gpu.matmul_tflops == pytest.approx(312 * roofline.GEMM_EFFICIENCY)  # the A100's dense bf16
    m = n = k = 8192
    moved = 2 * (m * k + k * n + m * n)
    gemm = Kernel(MATMUL, 2 * m * n * k, moved, m, n)
    waves = math.ceil(64 * 64 / 108)
    assert gpu.seconds(gemm) == pytest.approx(2 * m * n * k / (312e12 * 0.8 * 64 * 64 / (waves * 108)))  # compute
    thin = Kernel(MATMUL, 2 * m * 8 * k, 2 * (m * k + 8 * k + m * 8), m, 8)  # a matrix times 8 vectors: its traffic
    assert gpu.seconds(thin) == pytest.approx(thin.bytes / (2039e9 * roofline.MEMORY_EFFICIENCY))
    copy = Kernel(MEMORY, 0, 2 * 2**30)
    assert gpu.seconds(copy) == pytest.approx(2 * 2**30 / (2039e9 * roofline.MEMORY_EFFICIENCY))
    assert gpu.seconds(Kernel(MEMORY, 0, 1024)) == roofline.KERNEL_FLOOR_S


def test_layernorm_and_softmax_stream_at_the_share_of_the_bandwidth_atens_kernels_reach():
    """GPT-2's LayerNorms and its loss's log-softmax, forward and backward, are the kernels that reduce rows; the rest
    of its memory-bound kernels stream at the share copies and adds reach."""
    cfg = point("precision=bf16").cfg
    network = count_network(cfg, 4)
    memory = [k for layer in network.layers for k in (*layer.forward, *layer.backward) if k.kind == MEMORY]
    blocks = cfg.network.n_layer
    # 2 LayerNorms a block and the last one, forward, and backward in two kernels on a GPU; the loss's log-softmax,
    # forward and backward
    assert sum(k.row_reduction for k in memory) == 3 * (2 * blocks + 1) + 2
    gpu = roofline.gpu_of(cfg)
    norm, add = Kernel(MEMORY, 0, 2**30, row_reduction=True), Kernel(MEMORY, 0, 2**30)
    assert gpu.seconds(norm) == pytest.approx(2**30 / (2039e9 * roofline.ROW_REDUCTION_EFFICIENCY))
    assert gpu.seconds(add) == pytest.approx(2**30 / (2039e9 * roofline.MEMORY_EFFICIENCY))


def attention_seconds(gpu, keys: int, head_dim: int, causal: bool = True) -> float:
    flops = 4 * keys * keys * head_dim * (0.5 if causal else 1)  # one head of one sequence, forward
    return gpu.seconds(Kernel(ATTENTION, flops, 0, keys, head_dim, keys=keys, causal=causal)) / flops


def test_fused_attention_runs_at_its_kernels_published_share_of_the_peak():
    """FlashAttention-2's forward + backward TFLOP/s in its paper's A100 and H100 figures (on Hopper, 0.89 of it:
    torch's build as the H200 lease timed it; cuDNN's kernel, torch's choice there, 1.62 times it); torch's
    memory-efficient kernel (xformers' in the A100 figure) on a GPU without FlashAttention-2 or in fp32."""
    a100 = roofline.gpu_of(point("precision=bf16").cfg)
    assert a100.attention.kernel == "flash"
    assert 1 / attention_seconds(a100, 16384, 64) == pytest.approx(171e12)  # the A100 figure's label
    assert 1 / attention_seconds(a100, 2048, 128, causal=False) == pytest.approx(187e12)
    assert 1 / attention_seconds(a100, 4096, 96) == pytest.approx((156 + 173) / 2 * 1e12)  # between head dims
    assert 1 / attention_seconds(a100, 2**15, 64) == pytest.approx(171e12)  # past 16k tokens: the 16k label
    assert 1 / attention_seconds(a100, 2**11 * 2**0.5, 64) == pytest.approx((140 + 156) / 2 * 1e12)  # log2 steps
    h100 = roofline.gpu_of(point("precision=bf16", "network.attention=flash", cluster="dgx_h100").cfg)
    assert 1 / attention_seconds(h100, 8192, 128) == pytest.approx(308e12 * 0.89)  # torch's build, as timed on an H200
    # torch's own choice on Hopper from 2.11 (this environment's torch) is cuDNN's kernel; the torch of torchtitan's
    # benchmarks (2.6, conf/framework/torchtitan.yaml) chose FlashAttention-2
    hopper_auto = roofline.gpu_of(point("precision=bf16", cluster="dgx_h100").cfg)
    assert hopper_auto.attention.kernel == "cudnn" and "cuDNN's fused attention" in hopper_auto.priced_from
    assert 1 / attention_seconds(hopper_auto, 8192, 128) == pytest.approx(308e12 * 1.62)
    torchtitan = roofline.gpu_of(point("precision=bf16", "framework=torchtitan", cluster="dgx_h100").cfg)
    assert torchtitan.attention.kernel == "flash"
    v100 = roofline.gpu_of(point("precision=fp16", cluster="lassen").cfg)  # no FlashAttention-2 before Ampere
    assert v100.attention.kernel == "efficient"
    assert 1 / attention_seconds(v100, 16384, 64) == pytest.approx(125 * 67 / 312 * 1e12)
    fp32 = roofline.gpu_of(point().cfg)  # the memory-efficient kernel on the FP32 units
    assert 1 / attention_seconds(fp32, 16384, 64) == pytest.approx(19.5 * 67 / 312 * 1e12)
    hopper_efficient = roofline.gpu_of(point("precision=bf16", "network.attention=efficient",
                                             cluster="dgx_h100").cfg)
    assert 1 / attention_seconds(hopper_efficient, 16384, 64) == pytest.approx(67 * 284 / 171 * 1e12)
    assert "FlashAttention-2 at its published A100 share" in a100.priced_from


def test_llm_foundrys_triton_flashattention_is_priced_at_its_own_bars():
    """llm-foundry ran Tri Dao's Triton FlashAttention (conf/framework/llm_foundry.yaml, `attention.rates`): its
    "FlashAttention Triton" bars of the FlashAttention-2 paper's A100 figure, not torch's kernel it is planned with."""
    foundry = roofline.gpu_of(point("precision=bf16", "network.attention=efficient", "framework=llm_foundry").cfg)
    assert foundry.attention.kernel == "flash_triton" and "Triton FlashAttention" in foundry.priced_from
    assert 1 / attention_seconds(foundry, 16384, 64) == pytest.approx(80e12)  # the bar's label, causal
    assert 1 / attention_seconds(foundry, 8192, 128, causal=False) == pytest.approx(95e12)
    torch_kernel = roofline.gpu_of(point("precision=bf16", "network.attention=efficient").cfg)
    assert 1 / attention_seconds(torch_kernel, 16384, 64) == pytest.approx(67e12)  # xformers' bar


def test_math_attention_is_counted_as_the_gemms_and_materialised_softmax_torch_runs():
    fused, math_kernel = (count_network(point(*o).cfg, 4) for o in ([], ["network.attention=math"]))
    block = 1  # layer 0 is the embeddings
    assert any(k.kind == ATTENTION for k in fused.layers[block].forward)
    assert not any(k.kind == ATTENTION for k in math_kernel.layers[block].forward)
    scores = 4 * 2 * 128 * 128  # batch x heads x s x s
    assert math_kernel.layers[block].saved_bytes - fused.layers[block].saved_bytes >= 4 * scores  # fp32 scores kept
    matmul_flops = (sum(k.flops for k in math_kernel.layers[block].forward if k.kind == MATMUL)
                    - sum(k.flops for k in fused.layers[block].forward if k.kind == MATMUL))
    assert matmul_flops == 2 * 2 * scores * 32  # Q K^T and P V over the whole score matrix, head dim 32


def test_materialised_attention_runs_the_kernels_of_its_framework():
    """Megatron-LM from 2021 on: the scores by one GEMM that scales them, FusedScaleMaskSoftmax's one kernel (mask and
    softmax), dropout, the GEMM with the values. Its 2020 code: torch's kernels (the scale, masking, softmax), as
    torch's math attention runs them but for the softmax, where torch's `_safe_softmax` adds five kernels on a GPU
    (two scalar fills, the comparison with -inf, each row's all(), the where() zeroing rows masked whole), none on a
    CPU."""
    def block(framework: str, cluster: str = "dgx_a100_80gb", *overrides: str):
        cfg = point(f"framework={framework}", "network.attention=math", "network.dropout=0.1", "precision=bf16",
                    *overrides, cluster=cluster).cfg
        return cfg, count_network(cfg, 2).layers[1]

    cfg, fused = block("megatron_lm")
    n = 2 * cfg.network.n_head * cfg.dataset.seq_len ** 2  # the score matrix's elements
    assert [(k.kind, k.row_reduction) for k in fused.core_forward] == \
        [(MATMUL, False), (MEMORY, True), (MEMORY, False), (MATMUL, False)]
    # past 2048 keys FusedScaleMaskSoftmax takes torch's softmax, the scores masked first
    assert len(block("megatron_lm", "dgx_a100_80gb", "dataset.seq_len=4096")[1].core_forward) == 5
    assert [k.bytes for k in fused.core_forward if k.kind == MEMORY] == [2 * 2 * n, (2 + 2 + 1) * n]
    _, plain = block("megatron_lm_2020")
    _, torch_math = block("suite")
    assert len(torch_math.core_forward) == len(plain.core_forward) + 5
    assert len(block("suite", "local")[1].core_forward) == len(block("megatron_lm_2020", "local")[1].core_forward)
    for other in (plain, torch_math):
        assert sum(k.row_reduction for k in other.core_forward) == 1  # the softmax
        assert sum(k.flops for k in other.forward) == sum(k.flops for k in fused.forward)
        assert sum(k.flops for k in other.backward) == sum(k.flops for k in fused.backward)


def test_a_gemm_one_tile_past_a_full_wave_runs_a_second_wave():
    gpu = roofline.gpu_of(point("precision=bf16").cfg)  # 108 SMs
    full = Kernel(MATMUL, 1e11, 0, 108 * 128, 128)
    one_more = Kernel(MATMUL, 1e11 * 109 / 108, 0, 109 * 128, 128)
    assert gpu.waves(full) == 1 and gpu.waves(one_more) == pytest.approx(109 / 216)
    assert gpu.seconds(one_more) > 1.9 * gpu.seconds(full)


def test_under_autocast_batch_norm_keeps_half_activations_beside_its_fp32_weights_and_statistics():
    """What a CNN keeps for backward in bf16 is half what it keeps in fp32: batch norm computes in its input's dtype,
    whatever the dtype of its weights and running statistics (counted as fp32, ResNet-50's bf16 peak on an H200 was
    predicted 44% over NVML's)."""
    def saved(precision: str) -> int:
        (p,) = plan([["dataset=cifar10", "network=resnet18", f"precision={precision}", "cluster=dgx_a100_80gb",
                      "cluster.job.account=x"]])
        return sum(layer.saved_bytes for layer in count_network(p.cfg, 8).layers)

    assert saved("bf16") / saved("fp32") == pytest.approx(0.5, abs=0.02)


def test_adamws_step_streams_what_torchs_foreach_kernels_stream_as_measured_on_an_h200():
    """GPT-2 medium's AdamW step (355 M parameters) took 7.8 ms on an H200 (docs/measurements.md): one pass over
    the state per foreach operation, not the one pass of a fused kernel (2.4 ms)."""
    (p,) = plan([["dataset=tokens", "dataset.seq_len=1024", "network=gpt2_medium", "precision=bf16",
                  "optimizer.name=adamw", "optimizer.weight_decay=0.01", "cluster=dgx_h200", "cluster.job.account=x"]])
    assert roofline.datasheet_profile(p.cfg, 8).optimizer_s * 1e3 == pytest.approx(7.8, rel=0.15)


def test_a_one_machine_gpu_cluster_is_priced_here_though_a_sweep_could_not_run_it_here():
    """`cluster=h200` starts its ranks with the local launcher, on this machine's GPUs: a sweep of it is refused where
    torch sees none, a prediction is not (the datasheet prices it; test_gpu.py runs the sweep on a GPU)."""
    overrides = [*TOKENS, "network=gpt2_tiny", "cluster=h200", "precision=bf16"]
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            plan([overrides])
    (p,) = plan([overrides], runs_here=False)
    assert predict(p).step.total > 0 and roofline.gpu_of(p.cfg).name == "NVIDIA H200"


def test_a_gemm_off_the_tensor_cores_alignment_runs_at_the_unaligned_share_of_the_rate():
    """GPT-2's head over its 50257-token vocabulary: slow unaligned kernels on the tensor cores (bf16, TF32), the
    same FP32 units as any other GEMM without TF32; padded to 50304 (as Megatron-LM and nanoGPT pad it), aligned."""
    def head(vocab: int, *overrides: str) -> tuple[roofline.Gpu, list[Kernel]]:
        (p,) = plan([["dataset=tokens", f"dataset.vocab_size={vocab}", "network=gpt2_tiny", "dataset.seq_len=64",
                      *overrides, "cluster=dgx_a100_80gb", "cluster.job.account=x"]])
        counted = count_network(p.cfg, 8)
        gemms = [k for k in (*counted.layers[-1].forward, *counted.layers[-1].backward) if k.kind == MATMUL]
        return roofline.gpu_of(p.cfg), gemms

    gpu, unaligned = head(50257, "precision=bf16")
    _, aligned = head(50304, "precision=bf16")
    assert len(unaligned) == 3 and not any(k.aligned for k in unaligned) and all(k.aligned for k in aligned)
    big = Kernel(MATMUL, 1e12, 0, 8192, 50257, aligned=False)
    assert gpu.seconds(big) == pytest.approx(gpu.seconds(Kernel(MATMUL, 1e12, 0, 8192, 50257))
                                             / roofline.UNALIGNED_GEMM_SHARE)
    fp32, _ = head(50257, "precision=fp32", "math.tf32=false")
    assert fp32.seconds(big) == fp32.seconds(Kernel(MATMUL, 1e12, 0, 8192, 50257))


def test_fp32_runs_on_tf32_tensor_cores_only_where_asked_and_convolutions_by_torchs_default():
    default, tf32, strict = (roofline.gpu_of(point(*o).cfg) for o in ([], ["math.tf32=true"], ["math.tf32=false"]))
    assert (default.matmul_tflops, default.conv_tflops) == pytest.approx((19.5 * 0.8, 156 * 0.8))
    assert tf32.matmul_tflops == pytest.approx(156 * 0.8) and strict.conv_tflops == pytest.approx(19.5 * 0.8)


def test_a_gpu_without_the_points_dtype_is_refused_and_a_missing_number_is_named(conf_copy):
    (p,) = plan([[*TOKENS, "network=gpt2_tiny", "cluster=lassen", "cluster.job.account=x", "precision=fp16"]])
    p.cfg.precision = "bf16"  # what the sweep's own check refuses first
    with pytest.raises(ConfigError, match="has no bf16 peak"):
        roofline.gpu_of(p.cfg)
    edit_catalog_entry(conf_copy / "cluster" / "gpu" / "v100_sxm2_16gb.yaml", sm_count=None)
    (p,) = plan([[*TOKENS, "network=gpt2_tiny", "cluster=lassen", "cluster.job.account=x"]])
    with pytest.raises(ConfigError, match=r"fill cluster.hardware.sm_count \(its GPU file"):
        roofline.gpu_of(p.cfg)


def links(cluster: str, nodes: int, ranks: int) -> fabric.NcclLinks:
    cfg = point(cluster=cluster).cfg
    made = fabric.nccl_links(cfg.cluster, nodes, ranks)
    assert not isinstance(made, str), made
    return made


def test_an_nvswitch_all_reduce_is_nccls_ring_simple_at_80_percent_of_nvlink():
    nvswitch = links("dgx_a100_80gb", 1, 8)
    bus = 300 * 0.8
    latency = 8.4 + 2 * 7 * 3.4
    expected = latency * 1e-6 + 2**30 / (bus * 8 / 14 * 1e9)
    assert nvswitch.collective("all_reduce", 2**30, 8) == pytest.approx(expected)


def test_a_small_message_takes_the_low_latency_protocol_and_many_nodes_the_network():
    """NCCL 2.30.7's tuning.cc: LL at half the bus bandwidth, capped at Ampere's 87.7 GB/s on one node; across nodes
    the ring pays a network hop per node (14 us under Simple) and LL128 or the tree may win."""
    one_node = links("dgx_a100_80gb", 1, 8)
    ll = (6.6 + 14 * 0.6) * 1e-6 + 1024 / (87.7 * 8 / 14 * 1e9)
    assert one_node.collective("all_reduce", 1024, 8) == pytest.approx(ll)
    many = links("dgx_a100_80gb", 8, 64)
    assert many.collective("all_reduce", 2**30, 64) > 1.1 * one_node.collective("all_reduce", 2**30, 8)
    ring_bus = 8 * 25 * 0.96  # eight HDR NICs per node
    ring = (8.4 + (126 - 14) * 3.4 + 14 * 14.0) * 1e-6 + 2**30 / (ring_bus * 64 / 126 * 1e9)
    ring_ll128 = (14.0 + (126 - 14) * 1.9 + 14 * 4.0) * 1e-6 + 2**30 / (ring_bus * 0.92 * 64 / 126 * 1e9)
    tree = (8.4 + 2 * (7 * 4.0 + 3 * 14.0)) * 1e-6 + 2**30 / (80 * 0.5 * 1e9)
    assert many.collective("all_reduce", 2**30, 64) == pytest.approx(min(ring, ring_ll128, tree)) == ring


def test_a_medium_message_on_nvlink_takes_ll128_and_over_pcie_cannot():
    nvlink = links("dgx_a100_80gb", 1, 8)
    ll128 = (14.0 + 14 * 1.9) * 1e-6 + 2**24 / (240 * 0.92 * 8 / 14 * 1e9)
    assert nvlink.collective("all_reduce", 2**24, 8) == pytest.approx(ll128)
    pcie = links("lisa", 1, 4)  # Titan RTXs, NVLink in pairs: a group of four rings over PCIe Gen3
    simple = (8.4 + 6 * 5.7) * 1e-6 + 2**24 / (pcie.fabric.intra_gbs * 4 / 6 * 1e9)
    assert pcie.collective("all_reduce", 2**24, 4) == pytest.approx(simple)


def test_hopper_nvswitch_nodes_all_reduce_with_nvlink_sharp_and_amperes_cannot():
    """NVLS: the NVSwitch reduces, at 0.85 x 7/8 x twice a GPU's NVLink (NCCL's nvlsEfficiency for Hopper, 8 GPUs a
    channel each) after one 25 us NVLS hop; NCCL counts an H100's NVLink at 20.6 GB/s of every 25."""
    h100 = links("dgx_h100", 1, 8)
    nvlink = 450 * 20.6 / 25
    nvls = 25e-6 + 2**30 / (nvlink * 0.85 * 7 / 8 * 2 * 8 / 14 * 1e9)
    assert h100.collective("all_reduce", 2**30, 8) == pytest.approx(nvls)
    ring = (8.4 + 14 * 3.4) * 1e-6 + 2**30 / (nvlink * 8 / 14 * 1e9)
    assert nvls < ring / 1.4
    a100 = links("dgx_a100_80gb", 1, 8)
    a100_ring = (8.4 + 14 * 3.4) * 1e-6 + 2**30 / (240 * 8 / 14 * 1e9)
    assert a100.collective("all_reduce", 2**30, 8) == pytest.approx(a100_ring)
    gather = (8.4 + 7 * 3.4) * 1e-6 + 2**30 / (nvlink * 8 / 7 * 1e9)  # NCCL's model never prefers NVLS for it
    assert h100.collective("all_gather", 2**30, 8) == pytest.approx(gather)


def test_a_group_of_one_gpu_a_node_has_one_nics_share_of_the_network():
    """A data-parallel group of a 3D layout (one GPU a node, every 8th rank) all-reduces over its GPUs' own NICs,
    beside the other seven groups of its nodes: one HDR NIC each, not the node's eight; its every hop is the network
    tree's (NCCL: with one GPU a node, latencies are fully exposed); a send between stages goes out through its GPU's
    NIC."""
    many = links("dgx_a100_80gb", 8, 64)
    ring = (8.4 + 14 * 14.0) * 1e-6 + 2**30 / (25 * 0.96 * 8 / 14 * 1e9)
    ring_ll128 = (14.0 + 14 * 8.5) * 1e-6 + 2**30 / (25 * 0.96 * 0.92 * 8 / 14 * 1e9)
    tree = (8.4 + 2 * (3 * 14.0)) * 1e-6 + 2**30 / (25 * 0.96 * 0.92 * 0.5 * 1e9)
    assert many.collective("all_reduce", 2**30, 8, stride=8) == pytest.approx(min(ring, ring_ll128, tree))
    assert many.collective("all_reduce", 2**30, 8) == links("dgx_a100_80gb", 1, 8).collective("all_reduce", 2**30, 8)
    assert many.send(2**30) == pytest.approx((8.4 + 14.0) * 1e-6 + 2**30 / (25 * 0.96 * 1e9))
    assert many.send(2**30, senders=8) == pytest.approx(many.send(2**30))


def test_a_3d_layouts_stages_split_their_layers_and_wait_for_their_collectives(results):
    """1F1B over 2 stages, each split over 2 tensor-parallel ranks (Megatron-LM's 3D layout), against the same
    pipeline unsplit: half the parameters a rank keeps, its activations halved but for the blocks' LayerNorm and
    linear inputs that every tp rank keeps whole (Korthikanti et al. 2022), less compute but more than half (the split
    blocks' all-reduces on the critical path), more bytes sent."""
    common = ("strategy=1f1b", "strategy.pp=2", "strategy.micro_batches=4", "precision=bf16", "optimizer.name=adam")
    whole, split = predict(point("workers=2", *common)), predict(point("workers=4", "strategy.tp=2", *common))
    assert split.point.layout.tp == 2 and split.point.layout.dp == 1
    assert split.memory.params == pytest.approx(whole.memory.params / 2)
    assert whole.memory.activations / 2 < split.memory.activations < whole.memory.activations
    assert whole.step.compute / 2 < split.step.compute < whole.step.compute
    assert split.step.sent > whole.step.sent


def test_fsdp_over_tensor_parallel_groups_shards_one_ranks_share_and_waits_for_its_collectives(results):
    """FSDP2 x TP on 8 GPUs (4 replicas of 2 tensor-parallel ranks) against FSDP on 4, each replica on the same
    batch: half the parameters and optimizer states a rank keeps (its tp share, sharded alike), less compute but
    more than half (the split layers' all-reduces on the critical path)."""
    common = ("strategy=fsdp", "precision=bf16", "optimizer.name=adam", "batch_size=8")
    whole, split = predict(point("workers=4", *common)), predict(point("workers=8", "strategy.tp=2", *common))
    assert (split.point.layout.dp, split.point.layout.tp, split.point.layout.shard) == (4, 2, 4)
    assert split.memory.params == pytest.approx(whole.memory.params / 2, rel=0.01)
    assert split.memory.optimizer == pytest.approx(whole.memory.optimizer / 2, rel=0.01)
    assert whole.step.compute / 2 < split.step.compute < whole.step.compute


def test_nvlink_pairs_reach_each_other_over_nvlink_and_the_rest_over_pcie():
    lassen = links("lassen", 1, 4)
    assert lassen.collective("all_gather", 2**28, 2) < lassen.collective("all_gather", 2**28, 4) / 3
    # Issue 59: the footer said "pcie 12 GB/s" where a pair was priced over NVLink: it names both
    # Issue 59: the pair's 3 NVLink bricks (75 GB/s each way, the other 3 go to the CPU), not all 6 of the V100's
    assert lassen.source == "datasheet: NCCL's model on pcie 12 GB/s, the two GPUs of an NVLink pair 60 GB/s"


def test_a_gpu_cluster_without_a_fabric_says_which_keys_to_fill(conf_copy):
    path = conf_copy / "cluster" / "lassen.yaml"
    path.write_text(path.read_text().replace("  intra_node_fabric: nvlink_pairs\n", ""))
    cfg = point(cluster="lassen").cfg
    message = fabric.nccl_links(cfg.cluster, 1, 4)
    assert isinstance(message, str) and "fill cluster.hardware.intra_node_fabric" in message


def test_nvlink_pairs_without_the_pairs_bandwidth_say_which_key_to_fill(conf_copy):
    path = conf_copy / "cluster" / "lassen.yaml"
    path.write_text(path.read_text().replace("  nvlink_pair_bandwidth_gbs: 75\n", ""))
    message = fabric.nccl_links(point(cluster="lassen").cfg.cluster, 1, 4)
    assert isinstance(message, str) and "nvlink_pair_bandwidth_gbs" in message, message


def test_a_point_priced_from_the_datasheet_says_so(results):
    prediction = predict(point("workers=8", "strategy=ddp", "precision=bf16"))
    assert prediction.priced_from == "datasheet"
    assert prediction.profiled_on.startswith("datasheet: NVIDIA A100 GEMMs at 312 x 0.8")
    assert prediction.priced_by.startswith("datasheet: NCCL's model on nvlink 240 GB/s")
    assert 0 < prediction.model_tflops_per_device < 312
    assert prediction.step.comm >= 0 and prediction.step.core_wait == 0  # GPUs do not share cores
    assert prediction.memory.base == roofline.GPU_RANK_BASE_BYTES


@pytest.mark.slow
def test_make_predict_answers_for_lassen_on_a_fresh_clone_with_nothing_calibrated(results):
    """The issue's command, on a results directory with no calibration record."""
    args = ("dataset=tokens network=gpt2_medium cluster=lassen workers=4,16,64 strategy=ddp,zero,megatron,1f1b "
            "optimizer.name=adam")
    done = run_make("predict", "FORMAT=json", f"ARGS={args}")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    priced = [row for row in rows if "cannot_run" not in row]
    assert {row["point"].split("/")[2] for row in priced} == {"ddp", "zero", "megatron", "1f1b"}
    for row in priced:
        assert row["priced_from"] == "datasheet" and row["step_s"] > 0 and row["tokens_per_s"] > 0
        assert 0 < row["model_tflops_per_gpu"] < 125 and row["peak_memory_gb_per_gpu"] > 1
        assert isinstance(row["fits"], bool)
    assert not (results / "calibration").exists()


@pytest.mark.parametrize("strategy", ["megatron", "1f1b"])
def test_recomputation_adds_to_the_flops_executed_not_to_the_models(results, strategy):
    """Every block checkpointed runs its forward again in backward: with a GPT-2, whose blocks hold nearly all of
    its FLOPs, close to 4/3 of the model's FLOPs are executed (Megatron-LM's count), in more time, and each
    block keeps only its input (a pipeline's stages, for every micro-batch in flight)."""
    plain = predict(point("workers=2", f"strategy={strategy}", "precision=bf16", "optimizer.name=adam"))
    again = predict(point("workers=2", f"strategy={strategy}", "precision=bf16", "optimizer.name=adam",
                          "activation_checkpointing=every"))
    assert again.flops_per_sample == plain.flops_per_sample
    assert 1.15 < again.hardware_tflops_per_device / again.model_tflops_per_device <= 4 / 3
    assert again.step.total > plain.step.total and again.memory.activations < plain.memory.activations


@pytest.mark.parametrize("strategy", ["megatron", "1f1b"])
def test_selective_recomputation_trades_the_attention_cores_forward_for_their_scores(results, strategy):
    """Megatron-LM's selective recomputation (Korthikanti et al. 2022): each block's attention core runs again in
    backward. Under torch's math kernel the core keeps the scores and their softmax, at least 2 a s^2 b bytes a block
    in bf16 (a pipeline rank: for each micro-batch in flight), which selective recomputation frees for a few percent
    more FLOPs, far fewer than full recomputation's; FlashAttention keeps no scores (its output is the projection's
    input), so there it frees nothing and costs the kernel's forward."""
    common = ("workers=2", f"strategy={strategy}", "precision=bf16", "optimizer.name=adam")
    plain, selective, every = (predict(point(*common, "network.attention=math", f"activation_checkpointing={ac}"))
                               for ac in ("none", "selective", "every"))
    cfg = plain.point.cfg
    assert selective.flops_per_sample == plain.flops_per_sample
    ratio = selective.hardware_tflops_per_device / selective.model_tflops_per_device
    assert 1.01 < ratio < every.hardware_tflops_per_device / every.model_tflops_per_device
    assert plain.step.total < selective.step.total < every.step.total
    scores = 2 * cfg.network.n_head * cfg.dataset.seq_len ** 2 * plain.point.layout.micro_batch_size
    held = cfg.network.n_layer / (2 if strategy == "1f1b" else 2 * 2)  # blocks a rank holds; megatron: half its heads
    in_flight = 2 if strategy == "1f1b" else 1  # the first stage's warm-up micro-batches
    assert plain.memory.activations - selective.memory.activations >= held * in_flight * scores
    fused, fused_selective = (predict(point(*common, f"activation_checkpointing={ac}")) for ac in ("none", "selective"))
    assert fused_selective.memory.activations == fused.memory.activations
    assert fused_selective.step.total > fused.step.total


def test_sequence_parallel_pipeline_stages_send_each_other_slices_of_the_sequence(results):
    """Under sequence parallelism each tensor-parallel rank of a stage sends its slice of the sequence, 1/tp of the
    activation that each sends whole without it; the blocks' all-reduces become reduce-scatters and all-gathers."""
    common = ("workers=4", "strategy=1f1b", "strategy.pp=2", "strategy.tp=2", "strategy.micro_batches=2",
              "precision=bf16", "optimizer.name=adam")
    (whole, _, _), (sliced, _, _) = (workload(point(*common, f"strategy.sequence_parallel={sp}"))
                                     for sp in ("false", "true"))
    activation = whole.layers[1].output_bytes
    first_whole, first_sliced = devices(whole)[0].work, devices(sliced)[0].work
    assert first_whole.sends == pytest.approx(whole.links.send(activation, 2))  # its output; it receives the data
    assert first_sliced.sends == pytest.approx(sliced.links.send(activation / 2, 2))
    kinds = {kind for kind, _, _ in split_block_collectives(sliced, 1, 0, activation)}
    assert kinds == {"reduce_scatter", "all_gather"}


def test_megatron_lm_sends_a_stages_output_in_half_precision_scattered_over_its_tp_ranks(results):
    """The same 3D point priced as the suite runs it and as Megatron-LM would (framework=megatron_lm): the suite
    sends GPT-2's fp32 residual whole from each tp rank; Megatron-LM sends 1/tp of it from each in params_dtype (bf16
    here), and the receiving stage all-gathers it over its tp ranks (p2p_communication.py's scatter/gather)."""
    common = ("workers=4", "strategy=1f1b", "strategy.pp=2", "strategy.tp=2", "strategy.micro_batches=2",
              "precision=bf16", "optimizer.name=adam")
    (suite, _, _), (megatron, _, _) = (workload(point(*common, f"framework={name}"))
                                       for name in ("suite", "megatron_lm"))
    boundary = suite.layers[1]
    assert boundary.output_bytes == 4 * boundary.output_elements  # the residual stream stays fp32 under autocast
    assert devices(suite)[0].work.sends == pytest.approx(suite.links.send(boundary.output_bytes, 2))
    assert devices(megatron)[0].work.sends == pytest.approx(megatron.links.send(2 * boundary.output_elements / 2, 2))
    assert pipeline_sends(megatron, [boundary], 2)[1] == [("all_gather", 2 * boundary.output_elements, 2)]
    assert pipeline_sends(suite, [boundary], 2)[1] == []
    # a quarter of the bytes on the link between stages, and the gather's (tp - 1) / tp of the half-precision whole
    assert predict(point(*common, "framework=megatron_lm")).step.sent < predict(point(*common)).step.sent


def test_a_framework_that_shards_a_pipelines_optimizer_steps_its_share_and_gathers_the_update(results):
    """BLOOM's Megatron-DeepSpeed (DeepSpeed's bf16 optimizer, ZeRO-1) against Megatron-LM on one 3D point: each of
    the dp replicas of a stage steps 1/dp of its optimizer and keeps 1/dp of its states, and the updated bf16
    parameters are all-gathered over the replicas after the fp32 gradients' all-reduce."""
    common = ("workers=8", "strategy=1f1b", "strategy.pp=2", "strategy.tp=2", "strategy.micro_batches=2",
              "precision=bf16", "optimizer.name=adam")
    whole, sharded = (predict(point(*common, f"framework={name}"))
                      for name in ("megatron_lm", "megatron_deepspeed_bigscience"))
    assert sharded.step.optimizer == pytest.approx(whole.step.optimizer / 2)
    assert sharded.memory.optimizer == pytest.approx(whole.memory.optimizer / 2)
    w, _, _ = workload(point(*common, "framework=megatron_deepspeed_bigscience"))
    stage = max(devices(w), key=lambda d: d.params).params
    assert sharded.step.sent - whole.step.sent == pytest.approx(stage * 0.5 * (2 - 1) / 2)


@pytest.mark.parametrize(("precision", "share"), [("fp16", 0.5), ("bf16", 1.0)])
def test_megatron_lm_all_reduces_fp16_gradients_in_fp16_and_bf16_ones_in_fp32(results, precision, share):
    """Data-parallel ranks (and replicas of a tensor-parallel group) all-reduce gradients: the suite's fp32 ones
    under autocast; Megatron-LM's in params_dtype under --fp16 (no --fp32-allreduce), in fp32 under --bf16. (Two
    replicas of one rank each: no tensor-parallel collective of activations, which Megatron-LM runs in half
    precision, moves the difference.)"""
    common = ("workers=2", "strategy=megatron", "strategy.tp=1", f"precision={precision}", "optimizer.name=adam")
    suite, megatron = (predict(point(*common, f"framework={name}")) for name in ("suite", "megatron_lm"))
    reduced = suite.step.sent - megatron.step.sent  # the gradients' all-reduce among the 2 replicas: half its bytes
    held = sum(layer.param_bytes for layer in workload(suite.point)[0].layers)
    assert reduced == pytest.approx((1 - share) * held)  # a 2-rank all-reduce sends its buffer's bytes once




def test_context_parallel_ranks_run_their_share_of_the_residual_stream(results):
    """The residual stream's kernels are per token: split over cp ranks like the rest of a layer, so what sequence
    parallelism saves a tp=8 group halves with cp=2 (Llama 3 8B, the suite's unfused RMSNorm)."""
    common = ("dataset.seq_len=4096", "dataset.vocab_size=128256", "network=llama3_8b", "precision=bf16",
              "optimizer.name=adam", "strategy=megatron", "strategy.tp=8", "batch_size=2")

    def saved(cp: int) -> float:
        whole, sliced = (predict(point(*common, f"workers={8 * cp}", f"strategy.cp={cp}",
                                       f"strategy.sequence_parallel={sp}", cluster="dgx_h100")).step.compute
                         for sp in ("false", "true"))
        return whole - sliced

    assert saved(1) > 0
    assert saved(2) == pytest.approx(saved(1) / 2, rel=1e-6)

def test_megatron_lm_runs_the_whole_model_in_half_precision_where_the_suite_autocasts(results):
    """Megatron-LM's Float16Module casts the model (conf/framework/megatron_lm.yaml, `activations: half`): a GPT-2
    block's LayerNorm reads and writes 2-byte tensors where autocast keeps them fp32, its residual add adds two half
    tensors (autocast: the fp32 stream and a half linear output into fp32, 4 + 2 + 4 bytes an element), and no
    weight is cast in the step."""
    suite, megatron = (roofline.counted(point("precision=bf16", f"framework={name}").cfg, 4)
                       for name in ("suite", "megatron_lm"))
    (autocast, *_), (half, *_) = ([layer for layer in c.layers if layer.block] for c in (suite, megatron))
    stream = point().cfg.dataset.seq_len * 4 * point().cfg.network.n_embd  # a block's residual stream: elements
    (norm, add, *_), (half_norm, half_add, *_) = ([k for k in b.forward if k.residual] for b in (autocast, half))
    assert half_norm.bytes == norm.bytes / 2
    assert (add.bytes, half_add.bytes) == (10 * stream, 6 * stream)
    assert len(half.forward) == len(autocast.forward) - 1  # autocast's copy of the weights

def test_a_sweep_runs_only_the_suites_own_implementation():
    with pytest.raises(ConfigError, match="^Megatron-LM's implementation is priced, not run: a sweep runs the suite's"):
        point("workers=2", "strategy=megatron", "framework=megatron_lm", runs_here=True)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sequence_parallelism_splits_the_activations_tensor_parallel_ranks_keep_whole(results, precision):
    """Korthikanti et al. (2022): without sequence parallelism each tp rank keeps its blocks' LayerNorm inputs and
    its column-parallel linears' inputs whole; sequence parallelism splits the LayerNorm inputs over the tp ranks
    (the linears' gathered inputs torch keeps whole). Issue 59: both were priced at 10,234 MB for GPT-2 medium."""
    common = ("workers=8", "strategy=megatron", "strategy.tp=8", f"precision={precision}", "optimizer.name=adam",
              "network=gpt2_medium", "dataset.seq_len=1024", "dataset.vocab_size=50257")
    whole, sliced = (predict(point(*common, f"strategy.sequence_parallel={sp}", cluster="dgx_h100"))
                     for sp in ("false", "true"))
    cfg, tp = whole.point.cfg, 8
    tokens = whole.point.layout.micro_batch_size * cfg.dataset.seq_len
    residual = tokens * cfg.network.n_embd * 4  # a block's output, the fp32 residual stream
    assert whole.memory.activations - sliced.memory.activations == pytest.approx(
        cfg.network.n_layer * 2 * residual * (1 - 1 / tp), rel=1e-6)
    assert sliced.memory.peak < whole.memory.peak
    # Under full recomputation a block keeps only its input: whole without sequence parallelism, 1/tp with it
    whole, sliced = (predict(point(*common, f"strategy.sequence_parallel={sp}", "activation_checkpointing=every",
                                   cluster="dgx_h100")) for sp in ("false", "true"))
    blocks = cfg.network.n_layer
    assert whole.memory.activations - sliced.memory.activations == pytest.approx(blocks * residual * (1 - 1 / tp),
                                                                                 rel=1e-6)



def test_tensor_parallel_ranks_run_a_blocks_residual_stream_whole_unless_it_is_sequence_parallel(results):
    """Megatron-LM's tensor parallelism splits a block's GEMMs, attention and MLP activation; its LayerNorms, the
    dropouts after its row-parallel linears and its residual adds run whole on every tp rank (Shoeybi et al. 2019,
    Fig. 3), unless sequence parallelism splits them along the sequence. Counted: GPT-2's block has four such kernels
    forward (two LayerNorms, two residual adds; dropout 0), none a GEMM or attention; the QKV, attention and MLP
    kernels are not among them. Priced: tp=8 without sequence parallelism computes 7/8 of their time more per block
    than with it."""
    common = ("workers=8", "strategy=megatron", "strategy.tp=8", "precision=bf16", "optimizer.name=adam",
              "network=gpt2_medium", "dataset.seq_len=1024", "dataset.vocab_size=50257")
    whole, sliced = (predict(point(*common, f"strategy.sequence_parallel={sp}", cluster="dgx_h100"))
                     for sp in ("false", "true"))
    block = next(layer for layer in roofline.counted(whole.point.cfg, whole.point.layout.micro_batch_size).layers
                 if layer.block)
    stream = [k for k in block.forward if k.residual]
    assert len(stream) == 4 and {k.kind for k in stream} == {MEMORY}
    assert any(k.kind == MEMORY and not k.residual for k in block.forward)  # GeLU, on the MLP's 4h: split
    gpu = roofline.gpu_of(whole.point.cfg)
    stream_s = sum(map(gpu.seconds, stream)) + sum(gpu.seconds(k) for k in block.backward if k.residual)
    assert stream_s > 0
    n_layer = whole.point.cfg.network.n_layer
    assert whole.step.compute - sliced.step.compute == pytest.approx(n_layer * stream_s * 7 / 8, rel=1e-6)

ACCUMULATING = {"ddp": ["strategy=ddp"], "fsdp": ["strategy=fsdp"],
                **{f"zero{stage}": ["strategy=zero", f"strategy.zero_stage={stage}"] for stage in (1, 2, 3)}}


@pytest.mark.parametrize("strategy", ACCUMULATING)
def test_gradient_accumulation_computes_every_micro_batch_and_keeps_one_micro_batch_of_activations(results, strategy):
    """4 micro-batches of 8 against one batch of 8 per GPU: four times the compute; DDP and ZeRO-1 reduce the
    gradients once per step, ZeRO-2 into its partitions every micro-batch, FSDP and ZeRO-3 gather and reduce-scatter
    for every micro-batch (Composer's FSDP, LLM Foundry's records); the activations kept are one micro-batch's."""
    common = ("workers=8", *ACCUMULATING[strategy], "precision=bf16", "optimizer.name=adam", "batch_size=8")
    once, accumulated = predict(point(*common)), predict(point(*common, "grad_accum=4"))
    assert accumulated.step.compute == pytest.approx(4 * once.step.compute)
    assert accumulated.memory.activations == once.memory.activations
    # ZeRO-1/2 send their gradients' reduction and, once a step, the same bytes again: the updated parameters
    gathered = 0.5 * once.step.sent if strategy in ("zero1", "zero2") else 0.0
    ratio = (accumulated.step.sent - gathered) / (once.step.sent - gathered)
    assert ratio == pytest.approx(4.0 if strategy in ("fsdp", "zero2", "zero3") else 1.0, rel=0.01)
    if strategy in ("ddp", "zero1"):  # the reduction and the optimizer step amortised over four micro-batches
        assert accumulated.samples_per_s > once.samples_per_s


def test_a_sweep_on_a_gpu_cluster_records_the_datasheet_prediction_without_calibration(results):
    from suite.predict.predictor import recorded_prediction

    metrics = recorded_prediction(point("workers=8", "strategy=ddp", "precision=bf16"))
    assert metrics["predicted_from_datasheet"] == 1.0 and metrics["predicted_epoch_time_s"] > 0
    assert metrics["predicted_fits"] == 1.0
    assert recorded_prediction(point("workers=8", "strategy=ddp", "record_prediction=false")) == {}


def test_the_recommender_ranks_fsdp2_fsdp2_x_tp_fsdp2_x_cp_and_3d_layouts_for_a_llama_cell(results):
    """Llama 3 8B at 2048 tokens on two DGX H100s: FSDP2 alone, over tp ranks and over cp ranks, and 1F1B with its
    stages split over tp ranks are candidates beside the rest, priced from the datasheet; a tp that splits key-value
    groups is refused with the reason."""
    ranking = rank_cell(["dataset=tokens", "network=llama3_8b", "dataset.seq_len=2048", "dataset.vocab_size=128256",
                         "dataset.samples=4096", "precision=bf16", "optimizer.name=adamw", "batch_size=8",
                         "activation_checkpointing=every", "cluster=dgx_h100"], 16)
    ranked = {strategy_overrides(p.point.overrides) for p in ranking.ranked}
    assert {"fsdp reshard_after_forward=true", "fsdp tp=2", "fsdp tp=8", "fsdp tp=8 sequence_parallel=true",
            "fsdp cp=2", "fsdp cp=16"} <= ranked
    layouts_3d = {label for label in ranked if label.startswith("1f1b") and "tp=" in label}
    assert "1f1b pp=2 tp=8 micro_batches=4" in layouts_3d, sorted(ranked)
    assert all(p.point.layout.devices == 16 for p in ranking.ranked)
    refused = {i.label: i.reason for i in ranking.infeasible}
    assert refused["fsdp tp=16"].startswith("strategy fsdp: tp=16 does not divide n_kv_head=8 of llama3_8b")
    offered = ranked | set(refused)  # megatron with and without sequence parallelism, ranked or said why not
    assert {"megatron tp=8", "megatron tp=8 sequence_parallel=true"} <= offered


@pytest.mark.parametrize("name, kind", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", MATMUL),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0",
     ATTENTION),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<1>, ...>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(...)>", MEMORY),
    ("Optimizer.step#AdamW.step", None)])
def test_bench_kernels_sorts_a_profiles_cuda_kernels_into_the_kinds_the_model_prices(name, kind):
    assert profiled_kind(name) == kind
