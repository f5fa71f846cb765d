"""Measure what the datasheet model prices, on this machine's GPU, into the files `make bench-kernels` scores
(`make profile-kernels OUT=DIR`).

micro.json: the GEMMs a step runs, by shape and dtype (squares; 4096 x 4096 weights at 128 to 4096 rows; GPT-2
medium's and Llama 3 8B's layers forward, input gradient and weight gradient; the unaligned 50257-token head), fp8
GEMMs where the GPU has fp8 tensor cores, memory-bound kernels at 1M to 256M elements (copy, add, scale, GeLU,
SiLU x mul, dropout, casts, LayerNorm, RMSNorm and softmax forward and backward, the loss), fused attention by
backend (FlashAttention-2, the memory-efficient kernel, cuDNN), an eager kernel's launch and foreach AdamW.
profile_<name>.json: training steps of the suite's own networks (bf16 autocast, foreach AdamW with weight decay,
data on the GPU): the step's time and its phases by CUDA events, every kernel of three steps by torch.profiler,
the peak allocated; each file names the overrides that build its network, so `make bench-kernels` prices the same.
Each time is the median of 10 runs after 3 warm-ups.

    python -m suite.tools.benchmarks.kernel_profile OUT [--smoke]   # --smoke: a few small shapes (CPU too)
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

WARMUP, REPEATS = 3, 10
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SQUARES = (256, 512, 1024, 2048, 4096, 8192, 16384)
ROWS = tuple(range(128, 4097, 128))  # of a GEMM with 4096 x 4096 weights: where waves of tiles show
# (tokens, in, out) of a network's linear layers: GPT-2 medium at 8 x 1024 tokens, Llama 3 8B at 8192
LAYERS = ((8192, 1024, 3072), (8192, 1024, 1024), (8192, 1024, 4096), (8192, 4096, 1024), (8192, 1024, 50304),
          (8192, 1024, 50257), (8192, 4096, 4096), (8192, 4096, 1024), (8192, 4096, 14336), (8192, 14336, 4096),
          (8192, 4096, 128256))
ELEMENTS = (2**20, 2**24, 2**26, 2**28)
WIDTHS = (1024, 4096)  # rows' width for the normalisations and softmax
ATTENTION = ((8, 16, 16, 1024, 64), (4, 16, 16, 2048, 64), (2, 32, 8, 4096, 128), (1, 32, 8, 8192, 128),
             (1, 64, 8, 8192, 128))  # batch, query heads, key-value heads, tokens, head dimension; causal
LOSSES = ((8192, 50304), (8192, 128256))  # tokens, vocabulary
# The suite's networks the steps profile, by the prefix of a profile's name: the overrides that build each
NETWORKS = {"gpt2_medium": ["network=gpt2_medium"], "llama3_8b_4layers": ["network=llama3_8b", "network.n_layer=4"]}
# name: overrides that build the suite's network, batch, sequence, vocabulary
STEPS = {"gpt2_medium_bf16_b8_s1024_v50304": (NETWORKS["gpt2_medium"], 8, 1024, 50304),
         "llama3_8b_4layers_bf16_b1_s8192": (NETWORKS["llama3_8b_4layers"], 1, 8192, 128256),
         "llama3_8b_4layers_bf16_b2_s4096": (NETWORKS["llama3_8b_4layers"], 2, 4096, 128256)}
FULL = {"squares": SQUARES, "weights": 4096, "rows": ROWS, "layers": LAYERS, "other_dtypes": (4096, 8192),
        "elements": ELEMENTS, "widths": WIDTHS, "attention": ATTENTION, "losses": LOSSES,
        "optimizer_gpt2": (50304, 1024, 24),
        "steps": STEPS}
SMOKE = {"squares": (64, 128), "weights": 64, "rows": (128,), "layers": ((256, 64, 96), (256, 64, 50)),
         "other_dtypes": (64,), "elements": (2**12,), "widths": (64,), "attention": ((1, 2, 2, 64, 16),),
         "losses": ((256, 512),), "optimizer_gpt2": (512, 64, 1),
         "steps": {"gpt2_nano_bf16_b2_s32_v512": (["network=gpt2_nano"], 2, 32, 512)}}


class Clock:
    """Median milliseconds of a callable: by CUDA events on a GPU, else by the host's clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, fn: Callable[..., object], *args, repeats: int = REPEATS, **kwargs) -> float:
        """`fn(*args, **kwargs)`'s median time."""
        for _ in range(WARMUP):
            fn(*args, **kwargs)
        times = []
        for _ in range(repeats):
            self.sync()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*args, **kwargs)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begun = time.perf_counter()
                fn(*args, **kwargs)
                times.append(1e3 * (time.perf_counter() - begun))
        return statistics.median(times)


def gemms(clock: Clock, device: torch.device, shapes: dict) -> list[dict]:
    cases = [(n, n, n, "bfloat16", "NT", None) for n in shapes["squares"]]
    cases += [(m, shapes["weights"], shapes["weights"], "bfloat16", "NT", None) for m in shapes["rows"]]
    for tokens, fan_in, fan_out in shapes["layers"]:  # y = x W^T, dx = dy W, dW = dy^T x
        cases += [(tokens, fan_out, fan_in, "bfloat16", "NT", "forward"), (tokens, fan_in, fan_out, "bfloat16", "NN",
                  "input_grad"), (fan_out, fan_in, tokens, "bfloat16", "TN", "weight_grad")]
    cases += [(n, n, n, dtype, "NT", None) for dtype in ("float16", "float32") for n in shapes["other_dtypes"]]
    rows = []
    for m, n, k, dtype, layout, role in cases:
        a = torch.randn(m, k, device=device, dtype=DTYPES[dtype])
        b = torch.randn(n, k, device=device, dtype=DTYPES[dtype])
        for tf32 in ((False, True) if dtype == "float32" else (None,)):
            if tf32 is not None:
                torch.backends.cuda.matmul.allow_tf32 = tf32
            ms = clock.ms(torch.matmul, a, b.T)
            row = {"m": m, "n": n, "k": k, "dtype": dtype, "layout": layout, "ms": ms,
                   "tflops": 2 * m * n * k / ms / 1e9}
            rows.append({**row, **({"role": role} if role else {}), **({"tf32": tf32} if tf32 is not None else {})})
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def fp8_gemms(clock: Clock, device: torch.device) -> list[dict]:
    """Where the GPU has fp8 tensor cores (compute capability 8.9 and later); none elsewhere."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return []
    rows = []
    for m, n, k in ((8192, 8192, 8192), (16384, 4096, 4096), (8192, 14336, 4096)):
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).T
        scales = {"tensorwise": (torch.ones((), device=device), torch.ones((), device=device)),
                  "rowwise": (torch.ones(m, 1, device=device), torch.ones(1, n, device=device))}
        for scaling, (sa, sb) in scales.items():
            try:
                ms = clock.ms(torch._scaled_mm, a, b, sa, sb, out_dtype=torch.bfloat16)
                rows.append({"m": m, "n": n, "k": k, "scaling": scaling, "ms": ms, "tflops": 2 * m * n * k / ms / 1e9})
            except RuntimeError as e:  # a scaling this torch or GPU does not run
                rows.append({"m": m, "n": n, "k": k, "scaling": scaling, "error": str(e).splitlines()[0]})
    return rows


def memory_bound(clock: Clock, device: torch.device, shapes: dict) -> list[dict]:
    rows = []
    for dtype in ("float32", "bfloat16"):
        size = torch.tensor([], dtype=DTYPES[dtype]).element_size()
        for n in shapes["elements"]:
            x, y = (torch.randn(n, device=device, dtype=DTYPES[dtype]) for _ in range(2))
            other = torch.bfloat16 if dtype == "float32" else torch.float32
            streaming = {"copy": (torch.Tensor.copy_, (y, x), 2 * n * size), "add": (torch.add, (x, y), 3 * n * size),
                         "mul_scalar": (torch.mul, (x, 2.0), 2 * n * size),
                         "gelu_tanh": (functools.partial(F.gelu, approximate="tanh"), (x,), 2 * n * size),
                         "silu_mul": (_silu_mul, (x, y), 5 * n * size),  # two kernels: silu, then the product
                         "dropout": (functools.partial(F.dropout, p=0.1, training=True), (x,), 2 * n * size + n),
                         "cast": (torch.Tensor.to, (x, other), n * (size + torch.empty(0, dtype=other).element_size()))}
            for op, (fn, inputs, moved) in streaming.items():  # dropout's `moved`: its mask too
                ms = clock.ms(fn, *inputs)
                rows.append({"op": op, "dtype": dtype, "numel": n, "ms": ms, "bytes": moved, "gbs": moved / ms / 1e6})
            for width in shapes["widths"]:
                rows += _row_kernels(clock, x.view(-1, width), width)
            del x, y
    for tokens, vocab in shapes["losses"]:
        logits = torch.randn(tokens, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.randint(vocab, (tokens,), device=device)
        rows.append({"op": "cross_entropy", "tokens": tokens, "vocab": vocab,
                     "ms": clock.ms(_loss, logits, targets), "fwd_bwd_ms": clock.ms(_loss_gradient, logits, targets),
                     "logits_bytes": logits.numel() * logits.element_size()})
        del logits
    return rows


def _silu_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.silu(x) * y


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets)


def _loss_gradient(logits: torch.Tensor, targets: torch.Tensor) -> tuple:
    return torch.autograd.grad(_loss(logits, targets), logits)


def _gradient(fn: Callable, leaf: torch.Tensor, grad: torch.Tensor) -> tuple:
    """The input's gradient alone: nothing accumulated into `.grad`, which would add a kernel."""
    return torch.autograd.grad(fn(leaf), leaf, grad)


def _adds(x: torch.Tensor, kernels: int) -> None:
    for _ in range(kernels):
        x.add_(1)


def _row_kernels(clock: Clock, x: torch.Tensor, width: int) -> list[dict]:
    """LayerNorm, RMSNorm and softmax over rows of `width`, forward, and backward alone (forward and backward timed,
    less forward): forward reads and writes the rows, backward reads the rows and their gradient, writes one."""
    moved = x.numel() * x.element_size()
    weight = torch.ones(width, device=x.device, dtype=x.dtype)
    rows = []
    for op, fn in {"layer_norm": lambda t: F.layer_norm(t, (width,), weight, weight),
                   "rms_norm": lambda t: F.rms_norm(t, (width,), weight),
                   "softmax": lambda t: F.softmax(t, -1)}.items():
        leaf = x.detach().requires_grad_()
        grad = torch.ones_like(x)
        forward = clock.ms(fn, x)
        both = clock.ms(_gradient, fn, leaf, grad)
        backward = max(both - forward, 1e-6)
        rows.append({"op": op, "dtype": str(x.dtype).removeprefix("torch."), "numel": x.numel(), "width": width,
                     "ms": forward, "bytes": 2 * moved, "gbs": 2 * moved / forward / 1e6, "backward_ms": backward,
                     "backward_bytes": 3 * moved, "backward_gbs": 3 * moved / backward / 1e6})
    return rows


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grouped: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)


def _attention_gradient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grouped: bool) -> tuple:
    out = _attention(q, k, v, grouped)
    return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def attention(clock: Clock, device: torch.device, shapes: dict) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION} if device.type == "cuda" else {"math": SDPBackend.MATH}
    rows = []
    for batch, heads, kv_heads, tokens, head_dim in shapes["attention"]:
        q = torch.randn(batch, heads, tokens, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(batch, kv_heads, tokens, head_dim, device=device, dtype=torch.bfloat16,
                            requires_grad=True) for _ in range(2))
        flops = 4 * batch * heads * tokens * tokens * head_dim * 0.5  # causal: half the scores
        grouped = heads != kv_heads
        for name, backend in backends.items():
            shape = [batch, heads, kv_heads, tokens, head_dim]
            try:
                with sdpa_kernel(backend):
                    forward = clock.ms(_attention, q, k, v, grouped)
                    both = clock.ms(_attention_gradient, q, k, v, grouped)
            except RuntimeError as e:  # a kernel that does not take this shape or GPU
                rows.append({"shape": shape, "backend": name, "error": str(e).splitlines()[0]})
                continue
            backward = max(both - forward, 1e-6)
            rows.append({"shape": shape, "backend": name, "fwd_ms": forward, "bwd_ms": backward,
                         "fwd_tflops": flops / forward / 1e9, "bwd_tflops": 2.5 * flops / backward / 1e9})
        del q, k, v
    return rows


def launch_floor(clock: Clock, device: torch.device) -> dict:
    x = torch.zeros(16, device=device)
    kernels = 1000

    return {"add_us_per_kernel": 1e3 * clock.ms(_adds, x, kernels, repeats=3) / kernels}


def optimizer(clock: Clock, device: torch.device, shapes: dict) -> dict:
    """torch's foreach AdamW (weight decay) over GPT-2 medium's parameter shapes (a small GPT-2's in the smoke run)."""
    vocab, w, blocks = shapes["optimizer_gpt2"]
    block = [(3 * w, w), (3 * w,), (w, w), (w,), (4 * w, w), (4 * w,), (w, 4 * w), (w,), (w,), (w,), (w,), (w,)]
    sizes = [(vocab, w), (1024, w)] + block * blocks
    params = [torch.zeros(s, device=device, requires_grad=True) for s in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    adamw = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=True)
    ms = clock.ms(adamw.step)
    count = sum(p.numel() for p in params)
    return {"name": "adamw_foreach", "parameters": count, "ms": ms, "bytes_per_parameter_at_1tbs": ms * 1e9 / count}


def step_overrides(network: list[str], batch: int, seq: int, vocab: int) -> list[str]:
    """A profiled step's point: the network's overrides, its tokens and batch, bf16 autocast, AdamW with decay."""
    return [*network, "dataset=tokens", f"dataset.seq_len={seq}", f"dataset.vocab_size={vocab}", f"batch_size={batch}",
            "precision=bf16", "optimizer.name=adamw", "optimizer.weight_decay=0.1"]


def step_profile(clock: Clock, device: torch.device, name: str, overrides: list[str], batch: int, seq: int,
                 vocab: int) -> dict:
    from suite.models import build_model
    from suite.sweep.plan import plan
    from suite.worker.trainer import loss_fn

    everything = step_overrides(overrides, batch, seq, vocab)
    (point,) = plan([everything], runs_here=False)
    torch.manual_seed(0)
    model = build_model(point.cfg.network, point.cfg.dataset).to(device)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True)
    tokens = torch.randint(vocab, (batch, seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}

    def step(timed: bool = False) -> None:
        marks = [time.perf_counter()]
        with autocast:
            loss = loss_fn(model(inputs), targets)
        clock.sync()
        marks.append(time.perf_counter())
        loss.backward()
        clock.sync()
        marks.append(time.perf_counter())
        adamw.step()
        adamw.zero_grad(set_to_none=True)
        clock.sync()
        marks.append(time.perf_counter())
        if timed:
            for phase, (begun, ended) in zip(phases, zip(marks, marks[1:])):
                phases[phase].append(1e3 * (ended - begun))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_ms = clock.ms(step, repeats=6)
    for _ in range(6):
        step(timed=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            step()
    kernels = _kernels(prof, device)
    return {"name": name, "overrides": everything, "parameters": sum(p.numel() for p in model.parameters()),
            "batch": batch, "seq": seq, "vocab": vocab, "step_ms": step_ms,
            "phases_ms": {phase: statistics.median(times) for phase, times in phases.items()},
            "kernels_per_step": sum(k["count"] for k in kernels),
            "kernel_ms_per_step": sum(k["ms_per_step"] for k in kernels),
            "peak_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
            "kernels": kernels}


def _kernels(prof, device: torch.device) -> list[dict]:
    """Each kernel of the profiled steps, per step: the GPU's kernels (and memsets, copies) on CUDA; on a CPU, the
    aten operators, which are its kernels there."""
    steps = 3
    rows = []
    for event in prof.key_averages():
        if device.type == "cuda":
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            total_us = event.device_time_total
        else:
            if not event.key.startswith("aten::"):
                continue
            total_us = event.self_cpu_time_total
        rows.append({"kernel": event.key, "count": event.count / steps, "ms_per_step": total_us / 1e3 / steps})
    return sorted(rows, key=lambda row: -row["ms_per_step"])


def environment(device: torch.device) -> dict:
    env = {"torch": torch.__version__, "device": device.type}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        env |= {"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version())), "gpu": properties.name,
                "sm_count": properties.multi_processor_count, "memory_mib": properties.total_memory // 2**20}
    else:
        env["gpu"] = "none (CPU)"
    return env


def main(args: list[str]) -> int:
    smoke = "--smoke" in args
    outs = [a for a in args if not a.startswith("--")]
    if len(outs) != 1:
        print("usage: python -m suite.tools.benchmarks.kernel_profile OUT [--smoke]", file=sys.stderr)
        return 2
    out = Path(outs[0])
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = SMOKE if smoke else FULL
    clock = Clock(device)
    micro = {"env": environment(device)}
    for part, measure in {"gemms": lambda: gemms(clock, device, shapes), "fp8_gemms": lambda: fp8_gemms(clock, device),
                          "memory_bound": lambda: memory_bound(clock, device, shapes),
                          "attention": lambda: attention(clock, device, shapes),
                          "launch_floor": lambda: launch_floor(clock, device),
                          "optimizers": lambda: optimizer(clock, device, shapes)}.items():
        begun = time.perf_counter()
        micro[part] = measure()
        print(f"{part}: {time.perf_counter() - begun:.0f} s", flush=True)
        (out / "micro.json").write_text(json.dumps(micro, indent=1))  # what was measured so far, kept if cut short
    for name, (overrides, batch, seq, vocab) in shapes["steps"].items():
        begun = time.perf_counter()
        profile = step_profile(clock, device, name, overrides, batch, seq, vocab)
        (out / f"profile_{name}.json").write_text(json.dumps(profile, indent=1))
        print(f"{name}: step {profile['step_ms']:.1f} ms ({time.perf_counter() - begun:.0f} s)", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
