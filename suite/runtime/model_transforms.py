"""What the trainer applies to the plain model before its strategy parallelises it, as torchtitan applies them:
fp8 linear layers (`fp8=`), activation checkpointing (`activation_checkpointing=`) and compiled blocks (`compile=`).

Activation checkpointing: a checkpointed module keeps only its input for backward and runs its forward again there,
trading compute for activation memory.

The unit is a block of `suite.models.layers` (a GPT-2 block, a ResNet block, a VGG convolution);
`every` checkpoints each block (full recomputation), k every k-th one (the k-th, 2k-th, ..., as torchtitan counts).
`selective` checkpoints only each GPT-2 block's attention core (softmax(q k^T) v: Megatron-LM's selective
recomputation, Korthikanti et al. 2022), whose scores, softmax and dropout mask are the activations that grow with
the sequence squared and cost few FLOPs to compute again; with a fused attention kernel, which keeps no scores,
it saves little.
`selective_op` is torchtitan's selective recomputation (its Llama train configs' `selective_ac_option = "op"`):
each decoder block is checkpointed under an operator policy (`MatmulKeepingPolicy`) that keeps the outputs of every
other matrix multiply, of the attention kernel and of a few other ops, and recomputes the rest (norms,
activations, elementwise ops); torch.utils.checkpoint's selective API (torch 2.4) runs it, so not under DeepSpeed.
The checkpoint function is the strategy's: torch.utils.checkpoint, or DeepSpeed's under `zero`. The network's
first layer, which reads the data (a VGG's or MobileNetV2's first convolution), is not a candidate: it keeps
its input for backward either way, and under DeepSpeed's reentrant checkpoint an output computed from inputs
that need no gradient would cut the gradient of every layer before the loss.

`compile=true`: each decoder block compiled as torchtitan compiles it (torchtitan/models/llama3/infra/parallelize.py,
`apply_compile`): the block's forward, activation checkpointing included, through torch.compile's default backend
(inductor: Triton kernels on a GPU, C++ and OpenMP on a CPU), one whole graph per block (`fullgraph`), in place
(`nn.Module.compile`: parameter names stay the plain model's). Compilation happens on the block's first call, so
the strategy's parallelism, applied after, is what is compiled.

fp8 linear layers (`fp8=tensorwise|rowwise`): torchao's float8 training, applied as torchtitan's float8 converter
applies it (torchtitan/components/quantization/float8.py): every `nn.Linear` of the plain model becomes a
`Float8Linear`, before any parallelism, except the output head and layers whose dimensions are not multiples of 16
(what fp8 GEMMs need). Each such layer casts its input, weight and output gradient to fp8 with a dynamic scale
(one amax reduction per tensor, or per row) and runs its three GEMMs on fp8 tensor cores; everything else trains in
the point's bf16. The performance model counts the same layers (suite.profiling.counted).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from suite.errors import BadValue
from suite.models import gpt2, llama
from suite.models.gpt2 import AttentionCore
from suite.models.layers import block_layers, flatten_layers

SELECTIVE = "selective"
SELECTIVE_OP = "selective_op"
OPERATOR_POLICY_TORCH = "2.4"  # torch.utils.checkpoint.create_selective_checkpoint_contexts


def _ops(namespace, *names: str) -> frozenset:
    """The default overloads of the operators `names` of an op namespace that this torch has."""
    return frozenset(getattr(namespace, name).default for name in names if hasattr(namespace, name))


_aten = torch.ops.aten
# A matrix multiply: torchtitan counts aten.mm, all its (bias-free) Llama's linears run; a linear with a bias (GPT-2's)
# runs aten.addmm, the same product with the bias added, counted as one as well.
MATMULS = _ops(_aten, "mm", "addmm")
# torchtitan's save list (torchtitan/models/llama3/infra/parallelize.py, `_op_sac_save_list`; pytorch/torchtitan
# at 018740b): the attention kernels, FSDP's/TP's reduce-scatter, and max (the amax of fp8 scaling), beside mm.
# Its flex, varlen and compiled-region ops are not among what the suite's networks run. On CPU, torch's attention
# runs aten._scaled_dot_product_flash_attention_for_cpu, kept too so that the policy trades on CPU as on a GPU.
SAVED_OPS = MATMULS | _ops(_aten, "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                           "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                           "_scaled_dot_product_fused_attention_overrideable",
                           "_scaled_dot_product_flash_attention_for_cpu", "max") \
    | _ops(torch.ops._c10d_functional, "reduce_scatter_tensor")


def checkpoint_interval(value: str) -> int:
    """Every how many blocks one is checkpointed whole: 0 for `none` and `selective`, 1 for `every`, else the k
    given."""
    if value in ("none", SELECTIVE, SELECTIVE_OP):
        return 0
    if value == "every":
        return 1
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise BadValue(f"activation_checkpointing={value} is not none, every, selective, selective_op or a block "
                   "interval k >= 1")


def recomputes(value: str) -> bool:
    """Whether `activation_checkpointing=value` recomputes anything."""
    return value in (SELECTIVE, SELECTIVE_OP) or checkpoint_interval(value) > 0


def attention_cores(model: nn.Module) -> list[str]:
    """The qualified names of the model's attention cores, which `selective` recomputes."""
    return [name for name, module in model.named_modules() if isinstance(module, AttentionCore)]


DECODER_BLOCKS = (gpt2.Block, llama.Block)


def decoder_blocks(model: nn.Module) -> list[str]:
    """The qualified names of the model's decoder blocks (GPT-2's and Llama 3's), which `selective_op` checkpoints."""
    return [name for name, module in model.named_modules() if isinstance(module, DECODER_BLOCKS)]


class MatmulKeepingPolicy:
    """torchtitan's operator policy (torchtitan/distributed/activation_checkpoint.py, `_apply_op_sac`; pytorch/
    torchtitan at cfb9326) for one checkpointed run of a block: the outputs of the ops in `SAVED_OPS` are kept for
    backward, except every second matrix multiply (the 2nd, 4th, ... of the block's forward), which is recomputed
    with everything else. Multiplies are counted apart in forward and in the recomputation, so that both agree.
    torchtitan also keeps a GPU-to-CPU copy (its activation offloading, which the suite does not run), and can
    force multiplies of given shapes to be recomputed (an option, empty by default)."""

    def __init__(self) -> None:
        self.matmuls = {False: 0, True: 0}  # by whether the block is being recomputed

    def saves(self, op, recomputing: bool = False) -> bool:
        if op in MATMULS:
            self.matmuls[recomputing] += 1
            return self.matmuls[recomputing] % 2 == 1
        return op in SAVED_OPS

    def __call__(self, ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy

        return CheckpointPolicy.MUST_SAVE if self.saves(op, ctx.is_recompute) else CheckpointPolicy.PREFER_RECOMPUTE


def operator_policy_contexts():
    """The forward and recomputation contexts of one checkpointed run under a fresh `MatmulKeepingPolicy`."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(MatmulKeepingPolicy())


def apply_activation_checkpointing(model: nn.Module, value: str, checkpoint_fn: Callable | None) -> int:
    """Wrap what `activation_checkpointing=value` recomputes of the plain model, in place: every k-th block,
    (`selective`) every attention core, or (`selective_op`) every decoder block under the operator policy; return
    how many modules were wrapped. `checkpoint_fn` runs a module with checkpointing (None: torch.utils.checkpoint,
    non-reentrant). Parameter names in state dicts stay those of the plain model."""
    interval = checkpoint_interval(value)
    first = flatten_layers(model)[0]
    candidates = [layer.prefix.removesuffix(".") for layer in block_layers(model) if layer.prefix != first.prefix]
    chosen = [name for i, name in enumerate(candidates, 1) if interval and i % interval == 0]
    if value == SELECTIVE:
        chosen = attention_cores(model)
    policy = {}
    if value == SELECTIVE_OP:
        chosen, policy = decoder_blocks(model), {"context_fn": operator_policy_contexts}
    for qualified in chosen:
        parent, _, name = qualified.rpartition(".")
        wrapped = checkpoint_wrapper(model.get_submodule(qualified), checkpoint_fn=checkpoint_fn, **policy)
        model.get_submodule(parent).register_module(name, wrapped)
    return len(chosen)


AUTOCAST_DEVICES = ("cpu", "cuda")


def recomputed_under_forward_autocast(checkpoint: Callable) -> Callable:
    """`checkpoint` (a reentrant checkpoint function such as DeepSpeed's) made to recompute a block in backward
    under the autocast its forward ran under, as torch.utils.checkpoint does by itself. Backward runs outside the
    step's autocast, so a recomputation left alone would run in fp32, and the gradients would be those of other
    activations than the forward's."""
    def checkpointed(function: Callable, *args, **kwargs):
        forward_autocast = {device: torch.get_autocast_dtype(device) for device in AUTOCAST_DEVICES
                            if torch.is_autocast_enabled(device)}

        def under_forward_autocast(*inputs):
            with contextlib.ExitStack() as stack:
                for device, dtype in forward_autocast.items():
                    stack.enter_context(torch.autocast(device, dtype=dtype))
                return function(*inputs)
        return checkpoint(under_forward_autocast, *args, **kwargs)
    return checkpointed


def compile_blocks(model: nn.Module, blocks: list[str], device: torch.device) -> None:
    """Compile the modules at the qualified names `blocks` (the decoder blocks, found before activation checkpointing
    wrapped them: the wrapper is what is compiled) for ranks on `device`.

    On a CPU, inductor compiles its C++ kernels in the rank's own process, not in its pool of compile workers: a
    kernel built by the pool and loaded into the rank can write past its buffers (pytorch/pytorch#181618: heap
    corruption that in-process compilation, TORCHINDUCTOR_COMPILE_THREADS=1, avoids; seen here as both ranks of a
    compiled DDP point aborting with "malloc(): unaligned tcache chunk detected"), and a CPU node's cores are its
    ranks' already. A GPU rank keeps the pool, which compiles the Triton kernels."""
    if blocks and device.type == "cpu":
        import torch._inductor.config as inductor

        inductor.compile_threads = 1
    for name in blocks:
        model.get_submodule(name).compile(fullgraph=True)


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
