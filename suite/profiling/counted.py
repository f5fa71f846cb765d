"""A network counted, not timed: every kernel one training step of it launches, with its FLOPs and the bytes it
reads and writes, layer by layer (`suite.models.layers`), forward and backward; taken on the meta device, so a
GPT-2 of any size is counted on a laptop in seconds with no memory. The analytical GPU model
(suite.predict.roofline) prices what this counts.

Each aten operator is one kernel, counted as eager PyTorch on a GPU runs it: views and aliases cost nothing;
FLOPs are torch's own count (torch.utils.flop_counter, 2 per multiply-add); bytes are the operator's tensor
inputs and outputs. `scaled_dot_product_attention` is one fused kernel (flash or memory-efficient attention on a
GPU, which the meta device would decompose into matmuls and a materialised score matrix; with `network.attention=math`
it is that decomposition, as torch's math kernel runs it): causal attention does
half of the score matrix's work, and its backward 2.5 times its forward (FlashAttention-2's five matmuls against
two, recomputing the scores). Under bf16 or fp16 autocast the tensors follow autocast's CUDA rules: matrix
multiplies and convolutions produce half-precision outputs from half-precision copies of their inputs (the
parameter copies are counted, 6 bytes per element each way), the ops autocast keeps in fp32 (normalisation,
softmax, losses, reductions) produce fp32, and every other op produces half only where all its inputs are half.
A framework that runs the whole model in half precision (conf/framework/, `activations: half`: Megatron-LM's
Float16Module, DeepSpeed's engine) holds every floating-point tensor in 2 bytes, the residual stream and the
weights included, and casts no weights in the step. With `fp8=`, the network's linear layers are converted as the
ranks convert them (suite.runtime.model_transforms, torchao's Float8Linear) and counted as torchao runs them
uncompiled: each cast to fp8 its own amax, scale and cast kernels, each GEMM of fp8 operands (1 byte an element)
an fp8 GEMM. Counted for a GPU, dropout is the one kernel CUDA runs (ATen's `dropout` takes `native_dropout` on a CUDA
tensor: it writes the output and a one-byte mask, and its backward reads that mask), not the meta device's
decomposition into `bernoulli_`, `div_` and `mul` over a mask of the input's dtype, which is what a CPU runs; and
LayerNorm's backward is CUDA's two kernels (the input's gradient, then the weight's and bias's).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from suite.models import build_model
from suite.models.layers import flatten_layers
from suite.profiling.cores import CoreWatch
from suite.runtime.model_transforms import DECODER_BLOCKS, MatmulKeepingPolicy, convert_to_fp8
from suite.shared_names import Float8Recipe

MATMUL = "matmul"  # on the tensor cores (or the FP32 units): GEMMs
FP8_MATMUL = "fp8_matmul"  # GEMMs of fp8 operands (torch._scaled_mm) on the fp8 tensor cores
CONV = "conv"  # convolutions (cuDNN), forward and backward
ATTENTION = "attention"  # fused attention
MEMORY = "memory"  # everything else: elementwise, normalisation, reductions, copies

_aten = torch.ops.aten
# Views, and allocations (the caching allocator's, no kernel; `new_empty_strided` is autograd's for a gradient of
# another layout than its parameter's, which the `copy_` after it fills)
FREE = {_aten.detach, _aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided,
        _aten.lift_fresh, _aten._unsafe_view,
        _aten.alias, _aten.t, _aten.view, _aten.expand, _aten.permute, _aten.transpose, _aten.unsqueeze,
        _aten.squeeze, _aten.split, _aten.unbind, _aten.slice, _aten.select, _aten.split_with_sizes}
# Autocast's CUDA fp32 list, as far as the suite's networks reach it (torch/csrc/autograd/autocast_mode.cpp).
FP32 = {_aten.native_layer_norm, _aten.native_layer_norm_backward, _aten._softmax, _aten._log_softmax,
        _aten._log_softmax_backward_data, _aten._softmax_backward_data, _aten.nll_loss_forward,
        _aten.nll_loss_backward, _aten.sum, _aten.mean, _aten.mse_loss, _aten.exp, _aten.log, _aten.pow}
# Row-wise normalisation and softmax (and their backward): each reduces a row before it writes it, which holds them
# below the bandwidth streaming kernels reach (suite.predict.roofline.ROW_REDUCTION_EFFICIENCY).
ROW_REDUCTIONS = {_aten.native_layer_norm, _aten.native_layer_norm_backward, _aten._softmax, _aten._safe_softmax,
                  _aten._softmax_backward_data, _aten._log_softmax, _aten._log_softmax_backward_data}
HALF_BYTES = 2
# cuBLAS's tensor-core kernels load 16 bytes at a time: a GEMM with a dimension not a multiple of 8 elements
# (a 16-bit dtype's 16 bytes; GPT-2's 50257-token vocabulary) runs on kernels of 2-byte loads ("align1").
ALIGNMENT = 8


def aligned(*dims: int) -> bool:
    """Whether a GEMM of these dimensions (M, N, K) runs on the tensor cores' fast kernels (ALIGNMENT)."""
    return all(d % ALIGNMENT == 0 for d in dims)

CAST_BYTES = 6  # a parameter copied between fp32 and half precision: 4 bytes read, 2 written (or back)
ATTENTION_BACKWARD = 2.5
CAUSAL_WORK = 0.5


@dataclass(frozen=True)
class Kernel:
    kind: str
    flops: float
    bytes: float
    rows: int = 0  # of a matmul's output (for how many tiles it fills a GPU with): M, with batch folded in
    cols: int = 0  # N
    aligned: bool = True  # a matmul whose M, N and K are multiples of 8 (what the tensor cores' fast kernels need)
    keys: int = 0  # fused attention: the sequence each query attends over (cols: the head dimension)
    causal: bool = False  # fused attention under a causal mask
    # A decoder block's memory-bound kernel on its residual stream alone (`_Kernels.stream`): a norm, the dropout
    # after a row-parallel linear, a residual add, and their gradients; what tensor parallelism leaves whole
    residual: bool = False
    row_reduction: bool = False  # a memory-bound kernel of ROW_REDUCTIONS


@dataclass(frozen=True)
class CountedLayer:
    name: str
    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    output_bytes: int
    saved_bytes: int
    param_bytes: int  # its own parameters, fp32 (the suite keeps fp32 parameters under autocast)
    param_tensors: int
    tied_bytes: int
    block: bool
    core_forward: tuple[Kernel, ...] = ()  # the forward kernels its attention cores launch (GPT-2's)
    core_saved_bytes: int = 0  # what autograd keeps inside them and nowhere else, their inputs excluded
    output_elements: int = 0
    # A decoder block under `selective_op`'s operator policy: the forward kernels it runs again in backward, and
    # what it keeps (its input, and the outputs of the ops the policy saves)
    op_recomputed: tuple[Kernel, ...] = ()
    op_kept_bytes: int = 0


@dataclass(frozen=True)
class CountedNetwork:
    layers: tuple[CountedLayer, ...]
    input_bytes: int
    buffer_bytes: int
    largest_output_bytes: int  # the largest tensor any kernel writes: the workspace a step needs beyond what it keeps


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _Kernels(TorchDispatchMode):
    """Records one Kernel per aten operator (apart as well, those of the `watch`ed attention cores); with `half`,
    tracks which tensors autocast would hold in half precision."""

    def __init__(self, half: bool, state: set[int], watch: CoreWatch, policy: MatmulKeepingPolicy | None,
                 all_half: bool = False, cuda: bool = False, safe_softmax: bool = False) -> None:
        # imported when counting, not with the module: it imports triton (a third of a second for every driver)
        from torch.utils.flop_counter import flop_registry

        super().__init__()
        self.flop_registry = flop_registry
        self.half, self.state = half, state  # the ids of the model's parameters and buffers
        self.all_half = all_half  # every floating-point tensor in half precision (the model cast, not autocast)
        self.watch = watch
        self.kernels: list[Kernel] = []
        self.flows: list[tuple[dict[int, int], dict[int, int]]] = []  # each kernel's tensors read and written: bytes
        self.core_kernels: list[Kernel] = []  # those launched while an attention core runs
        self.policy = policy  # `selective_op`'s, in a decoder block's forward; None elsewhere
        self.recomputed: list[Kernel] = []  # the kernels it does not save
        self.kept_bytes = 0  # the outputs of those it saves
        self.half_ids: set[int] = set()
        self.cuda = cuda  # dropout as CUDA's fused kernel
        self.dropout_masks: set[int] = set()  # the ids of the masks the decomposed dropout draws (with `cuda`)
        self.safe_softmax = safe_softmax  # `_safe_softmax` as the kernels it runs on a GPU (torch's math attention)
        self.alive: list[torch.Tensor] = []  # ids stay unique while their tensors live
        self.largest = 0
        # A decoder block's residual stream: (its elements, its width); None outside decoder blocks
        self.stream: tuple[int, int] | None = None

    def on_stream(self, tensors: list[torch.Tensor]) -> bool:
        """Whether a memory-bound kernel works on the residual stream alone: one of its floating-point tensors is the
        stream as the block holds it ([batch, sequence, hidden]) or one value per token of it (a norm's statistics),
        and none is larger or of another width. What tensor parallelism splits is wider (the fused QKV, the MLP's
        hidden layer), split by heads (queries, keys, values, their rotations: a head's width) or by keys (attention
        scores)."""
        elements, width = self.stream

        def stream_shaped(t: torch.Tensor) -> bool:
            return t.dim() >= 3 and (t.numel(), t.shape[-1]) in ((elements, width), (elements // width, 1))

        floating = [t for t in tensors if t.is_floating_point()]
        return (any(map(stream_shaped, floating))
                and all(t.numel() <= elements and t.dim() > 0 and t.shape[-1] in (width, 1) for t in floating))

    def nbytes(self, t: torch.Tensor) -> int:
        if id(t) in self.dropout_masks:
            return t.numel()  # native_dropout's bool mask
        size = HALF_BYTES if id(t) in self.half_ids or (self.all_half and t.is_floating_point()) else _element_size(t)
        return t.numel() * size

    def mark_half(self, tensors) -> None:
        for t in tensors:
            if t.is_floating_point():
                self.half_ids.add(id(t))
                self.alive.append(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if self.cuda and packet is _aten.bernoulli_:  # drawn inside native_dropout's one kernel
            self.dropout_masks.add(id(args[0]))
            self.alive.append(args[0])
            return out
        if packet is _aten.div_ and id(args[0]) in self.dropout_masks:  # its scale, applied there too
            return out
        if packet in FREE or func.is_view:
            if self.half and any(id(t) in self.half_ids for t in _tensors(args)):
                self.mark_half(_tensors(out))
            return out
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        if packet is _aten.copy_:  # writes its destination without reading it
            inputs = inputs[1:]
        counter = self.flop_registry.get(packet)
        flops = float(counter(*args, **kwargs, out_val=out)) if counter else 0.0
        conv = packet in (_aten.convolution, _aten.convolution_backward)
        kind = (CONV if conv else FP8_MATMUL if any(map(_is_fp8, inputs)) else MATMUL) if flops else MEMORY
        if self.half:
            floating = [t for t in inputs if t.is_floating_point()]
            if kind != MEMORY:
                self.mark_half([t for t in floating if not _is_fp8(t)])
                self.mark_half(outputs)
            elif packet not in FP32:  # in the activations' dtype: batch norm's fp32 state leaves its output half
                activations = [t for t in floating if id(t) not in self.state]
                if activations and all(id(t) in self.half_ids for t in activations):
                    self.mark_half(outputs)
        moved = sum(map(self.nbytes, inputs)) + sum(map(self.nbytes, outputs))
        self.largest = max([self.largest, *map(self.nbytes, outputs)])
        rows = cols = 0
        if kind != MEMORY and outputs:
            shape = outputs[0].shape
            cols = shape[-1] if len(shape) > 1 else 1
            rows = outputs[0].numel() // max(cols, 1)
            if conv and len(shape) == 4:  # NCHW, an implicit GEMM of N*H*W rows and C columns
                rows, cols = shape[0] * shape[2] * shape[3], shape[1]
        depth = round(flops / (2 * rows * cols)) if kind in (MATMUL, FP8_MATMUL) and rows * cols else 0
        fast = kind not in (MATMUL, FP8_MATMUL) or aligned(rows, cols, depth)
        residual = kind == MEMORY and self.stream is not None and self.on_stream(inputs + outputs)
        if self.cuda and packet is _aten.native_layer_norm_backward and len(outputs) > 1:
            self.layer_norm_backward(func, args, outputs, residual)
        else:
            self.record(Kernel(kind, flops, moved, rows, cols, fast, residual=residual,
                               row_reduction=kind == MEMORY and packet in ROW_REDUCTIONS), func, inputs, outputs)
        if packet is _aten._safe_softmax and self.safe_softmax:
            self.zero_masked_rows(inputs[0], outputs[0])
        return out

    def layer_norm_backward(self, op, args, outputs: list[torch.Tensor], residual: bool) -> None:
        """LayerNorm's backward as CUDA runs it (aten/src/ATen/native/cuda/layer_norm_kernel.cu): the input's gradient,
        then the weight's and bias's by a kernel of their own (GammaBetaBackward) that reads the output's gradient, the
        input and its statistics again."""
        grad, x, _, mean, rstd, weight = args[:6]
        rows = [t for t in (grad, x, mean, rstd) if t is not None]
        for reads, writes in ((rows + [weight], outputs[:1]), (rows, outputs[1:])):
            reads = [t for t in reads if t is not None]
            self.record(Kernel(MEMORY, 0.0, sum(map(self.nbytes, reads + writes)), residual=residual,
                               row_reduction=True), op, reads, writes)

    def zero_masked_rows(self, scores: torch.Tensor, probs: torch.Tensor) -> None:
        """What `_safe_softmax` runs after its softmax on a GPU (aten/src/ATen/native/transformers/attention.cpp): a
        -inf scalar filled, the scores compared with it, each row's all(), a zero filled, and where() zeroing the rows
        masked whole."""
        masked = torch.empty(scores.shape, dtype=torch.bool, device=scores.device)
        rows = torch.empty((*scores.shape[:-1], 1), dtype=torch.bool, device=scores.device)
        for kernel, op, inputs, outputs in (
                (Kernel(MEMORY, 0.0, 0.0), _aten.scalar_tensor.default, [], []),
                (Kernel(MEMORY, 0.0, self.nbytes(scores) + masked.numel()), _aten.eq.Tensor, [scores], [masked]),
                (Kernel(MEMORY, 0.0, masked.numel() + rows.numel()), _aten.all.dim, [masked], [rows]),
                (Kernel(MEMORY, 0.0, 0.0), _aten.scalar_tensor.default, [], []),
                (Kernel(MEMORY, 0.0, rows.numel() + 2 * self.nbytes(probs)), _aten.where.self, [rows, probs], [probs])):
            self.record(kernel, op, inputs, outputs)

    def record(self, kernel: Kernel, op, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        self.kernels.append(kernel)
        self.flows.append(({id(_base(t)): self.nbytes(t) for t in inputs},
                           {id(_base(t)): self.nbytes(t) for t in outputs}))
        self.alive.extend(outputs)  # ids stay theirs while the flows name them
        if self.watch.inside:
            self.core_kernels.append(kernel)
        if self.policy and self.policy.saves(op):
            self.kept_bytes += sum(map(self.nbytes, outputs))
        elif self.policy:
            self.recomputed.append(kernel)


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, recorder, causal):
        out = torch.empty_like(q)
        ctx.save_for_backward(q, k, v, out)
        ctx.recorder, ctx.causal = recorder, causal
        recorder.attention(q, k, v, out, causal, backward=False)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out = ctx.saved_tensors
        ctx.recorder.attention(q, k, v, out, ctx.causal, backward=True)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None


class _ScoresAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, recorder, dropout):
        out = torch.empty_like(q)
        kept = recorder.scores_forward(q, k, v, out, dropout)
        ctx.save_for_backward(q, k, v, *kept)
        ctx.recorder = recorder
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, *kept = ctx.saved_tensors
        ctx.recorder.scores_backward(q, k, v, grad, kept)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None


class _Attention(TorchFunctionMode):
    """`F.scaled_dot_product_attention` as one fused kernel recorded on `kernels`; with `scores`, as Megatron-LM runs
    its attention from 2021 on (megatron/model/transformer.py, ParallelAttention; `attention.softmax: fused` in
    conf/framework/): the scores materialised by one batched GEMM that scales them (torch.baddbmm's alpha),
    FusedScaleMaskSoftmax's one kernel that masks and normalises them (megatron/model/fused_softmax.py), dropout,
    and the GEMM with the values; backward the two GEMMs' four, dropout's and the softmax's own. The fused kernel
    takes half precision, 17 to 2048 keys, queries and heads x batch in fours; otherwise the scores are masked by
    masked_fill_ before torch's softmax, as FusedScaleMaskSoftmax falls back (its fp32 casts not counted)."""

    def __init__(self, kernels: _Kernels, scores: bool = False) -> None:
        super().__init__()
        self.kernels, self.scores = kernels, scores

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            if self.scores:
                return _ScoresAttention.apply(q, k, v, self, float(kwargs.get("dropout_p", 0.0)))
            return _FusedAttention.apply(q, k, v, self, bool(kwargs.get("is_causal")))
        return func(*args, **kwargs)

    def launch(self, op, inputs: list[torch.Tensor], outputs: list[torch.Tensor], depth: int = 0,
               row_reduction: bool = False) -> None:
        """One kernel of the materialised attention: a batched GEMM of inner dimension `depth`, else memory-bound."""
        if self.kernels.half:  # in the scores' precision (a GEMM's output under autocast, the mask a bool)
            self.kernels.mark_half(outputs)
        moved = sum(map(self.kernels.nbytes, inputs)) + sum(map(self.kernels.nbytes, outputs))
        self.kernels.largest = max([self.kernels.largest, *map(self.kernels.nbytes, outputs)])
        if not depth:
            kernel = Kernel(MEMORY, 0.0, moved, row_reduction=row_reduction)
        else:
            cols = outputs[0].shape[-1]
            rows = outputs[0].numel() // cols
            kernel = Kernel(MATMUL, 2.0 * rows * cols * depth, moved, rows, cols, aligned(rows, cols, depth))
        self.kernels.record(kernel, op, inputs, outputs)

    def _like(self, q: torch.Tensor, keys: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A [..., queries, keys] tensor of the scores (a bool one with `dtype`)."""
        t = q.new_empty((*q.shape[:-1], keys), dtype=dtype or q.dtype)
        self.kernels.alive.append(t)
        return t

    def fusable(self, q: torch.Tensor, keys: int) -> bool:
        """Whether FusedScaleMaskSoftmax runs its fused kernel (megatron/model/fused_softmax.py's condition)."""
        queries = q.shape[-2]
        return self.kernels.half and 16 < keys <= 2048 and queries % 4 == 0 and \
            (q.numel() // (queries * q.shape[-1])) % 4 == 0

    def scores_forward(self, q, k, v, out, dropout: float) -> list[torch.Tensor]:
        """Records the forward; returns what backward reads besides q, k and v: the softmax's output, and with
        dropout its mask and the dropped probabilities."""
        if self.kernels.half:
            self.kernels.mark_half([q, k, v, out])
        keys, depth = k.shape[-2], q.shape[-1]
        scores, probs = self._like(q, keys), self._like(q, keys)
        self.launch(_aten.baddbmm.default, [q, k], [scores], depth)
        if not self.fusable(q, keys):
            self.launch(_aten.masked_fill_.Scalar, [scores], [scores])
        self.launch(_aten._softmax.default, [scores], [probs], row_reduction=True)
        kept = [probs]
        if dropout:
            dropped, mask = self._like(q, keys), self._like(q, keys, torch.bool)
            self.launch(_aten.native_dropout.default, [probs], [dropped, mask])
            kept += [mask, dropped]
        self.launch(_aten.bmm.default, [kept[-1], v], [out], keys)
        return kept

    def scores_backward(self, q, k, v, grad, kept: list[torch.Tensor]) -> None:
        probs, used = kept[0], kept[-1]
        if self.kernels.half:
            self.kernels.mark_half([grad])
        keys, depth = k.shape[-2], q.shape[-1]
        grad_used = self._like(q, keys)
        self.launch(_aten.bmm.default, [grad, v], [grad_used], depth)  # dP = dO V^T
        self.launch(_aten.bmm.default, [used, grad], [torch.empty_like(v)], q.shape[-2])  # dV = P^T dO
        grad_probs = grad_used
        if len(kept) > 1:
            grad_probs = self._like(q, keys)
            self.launch(_aten.native_dropout_backward.default, [grad_used, kept[1]], [grad_probs])
        grad_scores = self._like(q, keys)
        self.launch(_aten._softmax_backward_data.default, [grad_probs, probs], [grad_scores], row_reduction=True)
        if not self.fusable(q, keys):
            self.launch(_aten.masked_fill.Scalar, [grad_scores], [grad_scores])
        self.launch(_aten.bmm.default, [grad_scores, k], [torch.empty_like(q)], keys)  # dQ = dS K
        self.launch(_aten.bmm.default, [grad_scores, q], [torch.empty_like(k)], q.shape[-2])  # dK = dS^T Q

    def attention(self, q, k, v, out, causal: bool, backward: bool) -> None:
        k_len, head_dim = k.shape[-2], q.shape[-1]
        score_flops = 2 * 2 * q.numel() * k_len  # Q K^T and P V: 2 FLOPs per multiply-add each
        flops = score_flops * (CAUSAL_WORK if causal else 1) * (ATTENTION_BACKWARD if backward else 1)
        tensors = (q, k, v, out) * (2 if backward else 1)  # backward reads them and writes their gradients
        if self.kernels.half:
            self.kernels.mark_half([q, k, v, out])
        moved = sum(map(self.kernels.nbytes, tensors))
        # recorded as the GPU's fused kernel (flash attention), which `selective_op` saves
        self.kernels.record(Kernel(ATTENTION, flops, moved, q.numel() // head_dim, head_dim,
                                   keys=k_len, causal=causal), _aten._scaled_dot_product_flash_attention.default,
                            [q, k, v, out] if backward else [q, k, v], [] if backward else [out])


def _is_fp8(t: torch.Tensor) -> bool:
    """A torchao float8 tensor: an fp8 `_data` under the dtype it stands in for."""
    data = getattr(t, "_data", None)
    return isinstance(data, torch.Tensor) and data.element_size() == 1 and data.is_floating_point()


def _element_size(t: torch.Tensor) -> int:
    return 1 if _is_fp8(t) else t.element_size()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * _element_size(t)


def _base(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


class _Saved:
    """Bytes autograd keeps for backward (parameters excluded), each storage once, under the precision the
    kernels gave it; apart, what it keeps while one of the kernels' watched attention cores runs."""

    def __init__(self, kernels: _Kernels, params: set[int]) -> None:
        self.kernels, self.params, self.seen, self.in_core = kernels, params, {}, {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        base = _base(t)
        if id(base) not in self.params:
            kept = self.in_core if self.kernels.watch.inside else self.seen
            kept[id(base)] = (base, self.kernels.nbytes(base))
        return t

    @property
    def total(self) -> int:
        return sum(n for _, n in (self.in_core | self.seen).values())

    @property
    def core(self) -> int:
        """What the cores keep that nothing outside them does, their inputs excluded: what recomputing them frees."""
        inputs = {id(_base(t)) for args in self.kernels.watch.inputs for t in args}
        return sum(n for key, (_, n) in self.in_core.items() if key not in self.seen and key not in inputs)


def _compiled(forward: list[Kernel], backward: list[Kernel],
              flows: list[tuple[dict[int, int], dict[int, int]]]) -> tuple[list[Kernel], list[Kernel]]:
    """A block's kernels as inductor runs its compiled forward and backward graphs (`compile=true`): each run of
    memory-bound kernels between two GEMMs or attention kernels of one graph is one fused kernel, which reads what
    the run did not write itself and writes only what is read after it (by a later kernel of the step, or by
    nothing here: the block's output, its gradients); the GEMMs and attention are the libraries' kernels, as before.
    `flows`: each kernel's tensors read and written (bytes), forward's then backward's."""
    last_read: dict[int, int] = {}
    for position, (reads, _) in enumerate(flows):
        for tensor in reads:
            last_read[tensor] = position

    def graph(kernels: list[Kernel], offset: int) -> list[Kernel]:
        fused: list[Kernel] = []
        run: list[int] = []  # positions in `flows` of the memory-bound kernels since the last library kernel

        def close() -> None:
            if not run:
                return
            written = {t: n for k in run for t, n in flows[k][1].items()}
            read = {t: n for k in run for t, n in flows[k][0].items() if t not in written}
            kept = {t: n for t, n in written.items() if last_read.get(t, len(flows)) > run[-1]}
            flops = sum(kernels[k - offset].flops for k in run)
            residual = all(kernels[k - offset].residual for k in run)
            reduction = any(kernels[k - offset].row_reduction for k in run)  # a norm's or softmax's rows, fused
            fused.append(Kernel(MEMORY, flops, sum(read.values()) + sum(kept.values()), residual=residual,
                                row_reduction=reduction))
            run.clear()

        for position, kernel in enumerate(kernels, offset):
            if kernel.kind == MEMORY:
                run.append(position)
            else:
                close()
                fused.append(kernel)
        close()
        return fused

    return graph(forward, 0), graph(backward, len(forward))


def _autocast_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """The weights autocast copies to half precision: every matrix but those of fp8 layers."""
    fp8 = {id(p) for m in module.modules() if type(m).__name__ == "Float8Linear" for p in m.parameters()}
    return [p for p in module.parameters() if p.dim() > 1 and id(p) not in fp8]


def framework_attention(cfg) -> dict:
    """The point's framework's attention traits (conf/framework/, `attention`)."""
    return dict((cfg.get("framework") or {}).get("attention") or {})


def half_activations(cfg) -> bool:
    """Whether the point's framework runs the whole model in its half precision (conf/framework/, `activations`)
    rather than under autocast, as the suite does."""
    framework = cfg.get("framework") or {}
    return (framework.get("activations") or {}).get("dtype", "computed") == "half"


def count_network(cfg, batch: int) -> CountedNetwork:
    """Every kernel of one training step of the point's network at `batch`, layer by layer, in its precision, as a GPU
    runs it where the point's cluster names one (`cluster.hardware.gpu`), else as a CPU does."""
    cuda = bool(OmegaConf.select(cfg, "cluster.hardware.gpu"))
    from suite.strategies.pipeline import profile_sample
    from suite.worker.trainer import loss_fn

    half = cfg.precision in ("bf16", "fp16")
    all_half = half and half_activations(cfg)
    with torch.device("meta"):
        model = build_model(cfg.network, cfg.dataset).train()
    if cfg.get("fp8", Float8Recipe.none) != Float8Recipe.none:
        convert_to_fp8(model, cfg.fp8)
    layers = flatten_layers(model)
    params = {id(p) for p in model.parameters()}
    inputs = profile_sample(cfg, batch).to("meta")
    data = cfg.dataset
    targets = (torch.zeros(batch, data.seq_len, dtype=torch.long, device="meta") if data.kind == "tokens"
               else torch.zeros(batch, dtype=torch.long, device="meta"))
    for module in model.modules():  # a leaf that requires grad may not be modified in place (see measure.py)
        if getattr(module, "inplace", False):
            module.inplace = False
    # The softmax of materialised scores: torch's math attention's `_safe_softmax` (no framework trait), a framework's
    # plain softmax after its own masking (`aten`: Megatron-LM's of 2020), or Megatron-LM's fused CUDA kernel (`fused`;
    # without a GPU FusedScaleMaskSoftmax falls back to torch's softmax)
    softmax = framework_attention(cfg).get("softmax")
    if cfg.network.attention != "math":
        fused = _Attention
    elif softmax == "fused" and cuda:
        fused = partial(_Attention, scores=True)
    else:  # the math kernel decomposed as it runs
        fused = nullcontext
    seen: set[int] = set()
    counted, x, x_half, largest = [], inputs, False, 0
    for index, layer in enumerate(layers):
        last = index == len(layers) - 1
        own = [p for p in layer.module.parameters() if id(p) not in seen]
        tied = [p for p in layer.module.parameters() if id(p) in seen]
        seen.update(id(p) for p in own)
        watch = CoreWatch(layer.module)
        policy = MatmulKeepingPolicy() if isinstance(layer.module, DECODER_BLOCKS) else None
        kernels = _Kernels(half, params | {id(b) for b in model.buffers()}, watch, policy, all_half, cuda,
                           safe_softmax=cuda and softmax is None)
        x_in = x.detach().requires_grad_(x.is_floating_point())
        if isinstance(layer.module, DECODER_BLOCKS):
            kernels.stream = (x_in.numel(), x_in.shape[-1])
        if x_half:
            kernels.mark_half([x_in])
        saved = _Saved(kernels, params)
        with (watch, fused(kernels), kernels, torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)):
            y = layer.module(x_in)
            output_bytes, output_elements, x_half = kernels.nbytes(y), y.numel(), id(y) in kernels.half_ids
            if last:
                y = loss_fn(y, targets)
        forward = list(kernels.kernels)
        kernels.kernels.clear()
        kernels.policy = None
        with fused(kernels), kernels:
            y.backward(torch.ones_like(y))
        backward = list(kernels.kernels)
        if cfg.get("compile", False) and isinstance(layer.module, DECODER_BLOCKS):
            forward, backward = _compiled(forward, backward, kernels.flows)
        if half and not all_half:
            # torchao casts the weights of its fp8 layers itself (counted above)
            cast = Kernel(MEMORY, 0.0, CAST_BYTES * sum(p.numel() for p in _autocast_weights(layer.module)))
            forward.append(cast)
            backward.append(cast)
            if policy:
                kernels.recomputed.append(cast)
        largest = max(largest, kernels.largest)
        counted.append(CountedLayer(
            name=layer.prefix.removesuffix(".") or type(layer.module).__name__, forward=tuple(forward),
            backward=tuple(backward), output_bytes=output_bytes, saved_bytes=saved.total,
            param_bytes=sum(map(_nbytes, own)), param_tensors=len(own), tied_bytes=sum(map(_nbytes, tied)),
            block=bool(layer.prefix) and any(True for _ in layer.module.parameters()),
            core_forward=tuple(kernels.core_kernels), core_saved_bytes=saved.core, output_elements=output_elements,
            op_recomputed=tuple(kernels.recomputed) if policy else (),
            op_kept_bytes=kernels.nbytes(x_in) + kernels.kept_bytes if policy else 0))
        x = y.detach() if not last else x
    return CountedNetwork(tuple(counted), _nbytes(inputs), sum(_nbytes(b) for b in model.buffers()), largest)
