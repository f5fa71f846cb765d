"""`compile=true` (torch.compile of each decoder block, as torchtitan compiles a model): where it is refused in one
line before launch, and how the datasheet model prices it (suite.profiling.counted: each run of memory-bound kernels
between two library kernels of a graph fused into one). A compiled point trains as eager `single` does:
tests/test_equivalence.py."""

import pytest

from suite.errors import ConfigError
from suite.predict import roofline
from suite.profiling.counted import MEMORY
from suite.sweep.plan import plan

H100 = ["dataset=tokens", "dataset.seq_len=2048", "dataset.vocab_size=128256", "dataset.samples=4096",
        "network=llama3_8b", "precision=bf16", "cluster=dgx_h100", "cluster.job.account=x", "strategy=fsdp",
        "workers=8"]


@pytest.mark.parametrize("overrides, line", [
    (["dataset=cifar10", "network=resnet18", "strategy=ddp", "workers=2"], "compile=true compiles a decoder's "
     "blocks, as torchtitan does; network resnet18 (resnet18) has none"),
    (["dataset=tokens", "network=gpt2_tiny", "strategy=megatron", "strategy.tp=2", "workers=2"], "strategy megatron "
     "does not run compiled blocks (compile=true); ddp, fsdp, single do"),
])
def test_compile_where_it_cannot_run_is_one_line_before_launch(overrides, line):
    with pytest.raises(ConfigError) as refused:
        plan([[*overrides, "compile=true"]])
    assert str(refused.value) == line


def test_compiled_blocks_are_priced_as_fused_elementwise_kernels():
    """Llama 3 8B's block on an H100: the same GEMMs and attention, its memory-bound kernels (RMSNorm, RoPE, SwiGLU,
    residuals: dozens eager) fused into one per run between them, moving fewer bytes; the embedding and the head are
    not compiled."""
    (eager,) = plan([H100], runs_here=False)
    (compiled,) = plan([[*H100, "compile=true"]], runs_here=False)
    gpu = roofline.gpu_of(eager.cfg)
    plain, fused = roofline.counted(eager.cfg, 1), roofline.counted(compiled.cfg, 1)
    block, block_c = plain.layers[1], fused.layers[1]
    for phase in ("forward", "backward"):
        kernels, kernels_c = getattr(block, phase), getattr(block_c, phase)
        assert [k for k in kernels if k.kind != MEMORY] == [k for k in kernels_c if k.kind != MEMORY]
        memory, memory_c = ([k for k in ks if k.kind == MEMORY] for ks in (kernels, kernels_c))
        assert len(memory_c) < len(memory) / 3, (phase, len(memory), len(memory_c))
        assert sum(k.bytes for k in memory_c) < sum(k.bytes for k in memory)
        assert sum(k.flops for k in memory_c) == sum(k.flops for k in memory)
        assert sum(map(gpu.seconds, kernels_c)) < sum(map(gpu.seconds, kernels))
    assert plain.layers[0] == fused.layers[0] and plain.layers[-1] == fused.layers[-1]
    assert block_c.saved_bytes == block.saved_bytes  # what autograd keeps is counted as eager keeps it


def test_a_fused_kernel_that_takes_in_a_layernorm_reduces_rows_as_the_layernorm_did():
    """GPT-2's compiled block: each LayerNorm (forward, backward) lands in a fused kernel, priced at the share of the
    bandwidth row reductions reach; the fused kernels without one stream at the elementwise share."""
    gpt2 = ["dataset=tokens", "dataset.seq_len=128", "dataset.vocab_size=512", "network=gpt2_tiny",
            "cluster=dgx_h100", "precision=bf16", "compile=true"]
    (point,) = plan([gpt2], runs_here=False)
    block = roofline.counted(point.cfg, 2).layers[1]
    for phase in ("forward", "backward"):
        fused = [k for k in getattr(block, phase) if k.kind == MEMORY]
        assert sum(k.row_reduction for k in fused) == 2, phase  # the block's two LayerNorms
        assert not all(k.row_reduction for k in fused), phase
