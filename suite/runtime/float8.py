"""fp8 linear layers (`fp8=tensorwise|rowwise`): torchao's float8 training, applied as torchtitan's float8 converter
applies it (torchtitan/components/quantization/float8.py): every `nn.Linear` of the plain model becomes a
`Float8Linear`, before any parallelism, except the output head and layers whose dimensions are not multiples of 16
(what fp8 GEMMs need). Each such layer casts its input, weight and output gradient to fp8 with a dynamic scale
(one amax reduction per tensor, or per row) and runs its three GEMMs on fp8 tensor cores; everything else trains in
the point's bf16. The performance model counts the same layers (suite.profiling.counted)."""

from __future__ import annotations

from torch import nn

FP8_MULTIPLE = 16  # torch._scaled_mm's requirement on every dimension of an fp8 GEMM
HEADS = ("head", "output")  # the output projections (GPT-2's and Llama's `head`; torchtitan's `output`)


def converts(module: nn.Module, fqn: str) -> bool:
    """Whether the float8 converter swaps this module: a linear layer, not the head, with both dimensions multiples
    of 16 (torchtitan's module filter)."""
    return (isinstance(module, nn.Linear) and fqn.rsplit(".", 1)[-1] not in HEADS
            and module.in_features % FP8_MULTIPLE == 0 and module.out_features % FP8_MULTIPLE == 0)


def convert_to_fp8(model: nn.Module, recipe: str) -> nn.Module:
    """The model with its linear layers (`converts`) swapped for torchao's Float8Linear of `recipe`."""
    from torchao.float8 import Float8LinearConfig, Float8LinearRecipeName, convert_to_float8_training  # seconds

    config = Float8LinearConfig.from_recipe_name(Float8LinearRecipeName(str(recipe)))
    return convert_to_float8_training(model, config=config, module_filter_fn=converts)
