"""fp8 linear layers (`fp8=tensorwise|rowwise`, torchao's float8 training as torchtitan converts a model): which layers
the ranks convert, where a point is refused in one line before launch (no GPU here has fp8 tensor cores, so no point
runs here), and how the datasheet model prices them (suite.profiling.counted, suite.predict.roofline)."""

import pytest
from torch import nn

from conftest import edit_catalog_entry
from suite.errors import ConfigError
from suite.models import build_model
from suite.predict import roofline
from suite.profiling.counted import FP8_MATMUL, MATMUL, MEMORY
from suite.runtime.model_transforms import convert_to_fp8
from suite.sweep.plan import plan

TOKENS = ["dataset=tokens", "dataset.seq_len=128", "dataset.vocab_size=512", "dataset.samples=4096",
          "network=gpt2_tiny", "precision=bf16"]
H100 = [*TOKENS, "cluster=dgx_h100", "cluster.job.account=x", "strategy=fsdp", "workers=8"]


def test_the_ranks_convert_the_linear_layers_torchtitan_converts():
    """Every linear layer of the blocks becomes a Float8Linear; the head and a layer whose dimensions are not
    multiples of 16 (which fp8 GEMMs need) stay as they are."""
    (point,) = plan([TOKENS])
    model = build_model(point.cfg.network, point.cfg.dataset)
    model.extra = nn.Linear(64, 40)
    convert_to_fp8(model, "tensorwise")
    converted = {name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted == {f"blocks.{b}.{part}" for b in range(2)
                         for part in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}, converted
    assert type(model.head) is nn.Linear and type(model.extra) is nn.Linear


@pytest.mark.parametrize("overrides, line", [
    (["strategy=ddp", "workers=2"], "fp8=tensorwise needs a GPU with fp8 tensor cores (compute capability 8.9 or "
     "more: Ada, Hopper and later); cluster local computes on CPU"),
    (["cluster=dgx_a100_80gb", "cluster.job.account=x", "strategy=ddp", "workers=8"], "fp8=tensorwise needs a GPU "
     "with fp8 tensor cores (compute capability 8.9 or more), not NVIDIA A100 (8.0)"),
    ([*H100[-4:], "precision=fp32"], "fp8=tensorwise trains the linear layers in fp8 and the rest in bf16, as "
     "torchtitan's float8 converter does: set precision=bf16 (not fp32)"),
    ([*H100[-4:-2], "strategy=megatron", "strategy.tp=2", "workers=8"], "strategy megatron does not train fp8 "
     "linear layers (fp8=tensorwise); ddp, fsdp, single do"),
    ([*H100[-4:], "strategy.tp=2"], "strategy fsdp: tp=2 with fp8=tensorwise is not run here (torchtitan splits "
     "fp8 linear layers with float8 tensor-parallel plans); use tp=1"),
])
def test_fp8_where_it_cannot_train_is_one_line_before_launch(overrides, line):
    with pytest.raises(ConfigError) as refused:
        plan([[*TOKENS, *overrides, "fp8=tensorwise"]], runs_here=False)
    assert str(refused.value) == line


def test_fp8_layers_are_priced_at_the_fp8_peak_with_the_casts_torchao_runs():
    """A block's three GEMMs per linear layer (forward, and backward's two) run on fp8 operands at the H100's fp8
    peak, twice its bf16 one, of which they reach what the H200 lease measured fp8 GEMMs reach against bf16 ones
    (1.81 times bf16's rate with one scale a tensor, 1.75 with a scale a row); each cast to fp8 adds memory-bound
    kernels (torchao uncompiled: amax, scale, cast); the head's GEMMs stay bf16."""
    medium = [*H100, "network=gpt2_medium", "dataset.seq_len=1024", "dataset.vocab_size=50304"]  # over kernel floors
    (bf16,) = plan([medium], runs_here=False)
    (fp8,) = plan([[*medium, "fp8=tensorwise"]], runs_here=False)
    gpu = roofline.gpu_of(fp8.cfg)
    assert gpu.fp8_tflops == pytest.approx(1.81 * gpu.matmul_tflops, rel=5e-3)  # 1978.9 and 989.4 TFLOP/s, x 0.8
    (rowwise,) = plan([[*medium, "fp8=rowwise"]], runs_here=False)
    assert roofline.gpu_of(rowwise.cfg).fp8_tflops == pytest.approx(1.75 * gpu.matmul_tflops, rel=5e-3)
    plain, converted = roofline.counted(bf16.cfg, 8), roofline.counted(fp8.cfg, 8)
    block, block8 = plain.layers[1], converted.layers[1]
    kernels = [k for k in block.forward + block.backward if k.kind == MATMUL]
    kernels8 = [k for k in block8.forward + block8.backward if k.kind == FP8_MATMUL]
    assert len(kernels) == len(kernels8) == 12
    assert sum(k.flops for k in kernels8) == sum(k.flops for k in kernels)
    assert sum(k.bytes for k in kernels8) < sum(k.bytes for k in kernels)  # 1-byte operands
    assert not [k for k in block8.forward + block8.backward if k.kind == MATMUL]
    casts = sum(k.kind == MEMORY for k in block8.forward + block8.backward) - sum(
        k.kind == MEMORY for k in block.forward + block.backward)
    assert casts >= 2 * 12  # at least an amax and a cast for each of the 12 GEMMs' fp8 operands
    head, head8 = plain.layers[-1], converted.layers[-1]
    assert [k.kind for k in head8.forward + head8.backward] == [k.kind for k in head.forward + head.backward]
    assert sum(map(gpu.seconds, kernels8)) < sum(map(roofline.gpu_of(bf16.cfg).seconds, kernels))


def test_a_gpu_without_an_fp8_peak_names_the_key_to_fill(conf_copy):
    edit_catalog_entry(conf_copy / "cluster" / "gpu" / "h100_sxm5_80gb.yaml", fp8_tflops=None)
    (point,) = plan([[*H100, "fp8=rowwise"]], runs_here=False)
    with pytest.raises(ConfigError, match=r"^cluster dgx_h100 cannot price fp8=rowwise: fill "
                                          r"cluster.hardware.fp8_tflops \(the dense FP8 tensor-core peak of its GPU"):
        roofline.gpu_of(point.cfg)


def test_the_fp8_recipe_is_part_of_a_points_identity_and_none_leaves_it_as_recorded():
    (plain,) = plan([H100], runs_here=False)
    (none,) = plan([[*H100, "fp8=none"]], runs_here=False)
    (tensorwise,) = plan([[*H100, "fp8=tensorwise"]], runs_here=False)
    assert plain.config_hash == none.config_hash != tensorwise.config_hash
