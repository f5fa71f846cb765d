"""A published record mapped onto the suite: the overrides of the point that reproduces its configuration (dataset,
network, cluster, workers, precision, batch, strategy and knobs), planned as a sweep plans it, or the reasons it
cannot be. Every record ends as one or the other; none is dropped.

    mapped = map_record(record)        # overrides and assumptions, or reasons; no Hydra
    planned = plan_records(records)    # the same, each expressible one composed and validated (suite.sweep.plan)

Where a record leaves something the point needs unstated (null), the mapping takes the framework's documented
default, or the suite's, and says so in `assumptions`; where the suite has no way to express what the record ran
(a network it does not build, fp8 or torch.compile outside single, ddp and fsdp, selective recomputation of another
kind, dp x tp x pp, a GPU the catalog lacks), the record gets a `Reason`. A point the planner rejects (fp16 in a
pipeline, gradient accumulation under a strategy that does not accumulate, ...) keeps the planner's line as its
reason. Pricing and scoring (`make validate-published`) start from `plan_records`' points.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from suite.config import register_schema
from suite.data import CATALOG
from suite.errors import ConfigError
from suite.models import network_names
from suite.models.gpt2 import GPT2_SIZES, GPT2Dims
from suite.models.llama import LLAMA3_SIZES
from suite.paths import CONF_DIR
from suite.published.frameworks import described, framework_of
from suite.published.records import Record
from suite.strategies import strategy_class
from suite.sweep import hardware_catalog
from suite.sweep.checks import OlderTorch
from suite.sweep.compose import compose_point
from suite.sweep.plan import Point, make_point

# Planning a record asks nothing of a scheduler: no account to charge (as `make predict`).
NOTHING_SUBMITTED = ("cluster.job.account_required=false",)

# Why a record is not a point: the kinds a count groups by (each Reason also says the detail).
NOT_STATED = "not stated"  # the record leaves null what the point cannot do without
NETWORK = "network not in the suite"
GPU = "GPU not in the catalog"
CLUSTER = "no catalog cluster with these GPUs per node"
PRECISION = "precision"
RECOMPUTE = "selective recomputation"
LAYOUT_3D = "3D layouts"  # dp x tp x pp, FSDP/ZeRO x tp, interleaved with tp: the 3D-layouts issue
CONTEXT_PARALLEL = "context parallelism"
COMPILE = "torch.compile"
ASYNC_TP = "async tensor parallelism"
OFFLOAD = "offload"
BATCH = "batch"
OPTIMIZER_KIND = "optimizer"
INCONSISTENT = "inconsistent record"  # its layout's own numbers disagree (dp x tp x pp, the ZeRO stage)
PLANNER = "planner"  # composed, but the suite's checks reject the point: their line

LANGUAGE_FAMILIES = ("gpt", "gpt2", "mpt")  # decoder-only GPT blocks: the suite's GPT-2 of the record's dimensions
LLAMA_FAMILIES = ("llama3",)  # Meta's Llama 3 and 3.1: the suite's Llama 3 of the record's dimensions
CNN_FAMILIES = ("resnet", "vgg", "mobilenet")
DATA_PARALLEL = ("ddp", "horovod", "fsdp", "zero1", "zero2", "zero3")
PIPELINES = ("gpipe", "1f1b", "interleaved_1f1b", "pipedream_async")
TOKENS_VOCAB = 50257  # conf/dataset/tokens.yaml
LLAMA3_VOCAB = 128256  # Llama 3's tokenizer: 128,000 tokens and 256 special ones (Meta's params.json, "vocab_size")
# Key-value heads, not a field of a record: 8 in every size of torchtitan's llama3_configs (8B, 70B, 405B) and of
# Meta's Llama 3 paper (Dubey et al. 2024, Table 3)
LLAMA3_KV_HEADS = 8
IMAGENET_SIZE = 224  # conf/dataset/imagenet.yaml
PREFERRED_CLUSTERS = ("dgx",)  # among clusters of one GPU type and node size: the catalog's generic nodes first


@dataclass(frozen=True)
class Reason:
    kind: str  # one of the kinds above: what a count groups by
    text: str  # the detail, one line

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}"


@dataclass(frozen=True)
class Mapped:
    """A record as the suite sees it: the point's overrides (with the defaults taken for what it leaves unstated),
    or why it is not a point. After planning, `point` is the composed, validated point."""

    record: Record
    overrides: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    reasons: tuple[Reason, ...] = ()
    point: Point | None = None

    @property
    def expressible(self) -> bool:
        return not self.reasons

    @property
    def reason(self) -> Reason | None:
        """The first reason: what a count by reason files the record under."""
        return self.reasons[0] if self.reasons else None


class _Draft:
    """What map_record collects: overrides, assumptions and reasons, in order."""

    def __init__(self) -> None:
        self.overrides: list[str] = []
        self.assumptions: list[str] = []
        self.reasons: list[Reason] = []

    def set(self, *overrides: str) -> None:
        self.overrides += overrides

    def assume(self, text: str) -> None:
        self.assumptions.append(text)

    def cannot(self, kind: str, text: str) -> None:
        self.reasons.append(Reason(kind, text))


# --- the catalog's clusters -------------------------------------------------------------------------------------


def _cluster_key(conf_dir: Path, name: str, key: str, folder: str = "cluster") -> object:
    """A top-level key of conf/<folder>/<name>.yaml (a cluster, or with folder cluster/gpu a GPU type), or of the
    same-group parent its defaults list."""
    config = yaml.safe_load((conf_dir / folder / f"{name}.yaml").read_text()) or {}
    if key in config:
        return config[key]
    for entry in config.get("defaults") or []:
        if isinstance(entry, str) and (conf_dir / folder / f"{entry}.yaml").exists():
            found = _cluster_key(conf_dir, entry, key, folder)
            if found is not None:
                return found
    return None


def _runs_bf16(gpu: str | None) -> bool:
    """Whether a catalog GPU type has a bfloat16 peak (Ampere and later)."""
    if gpu is None or not (CONF_DIR / "cluster" / "gpu" / f"{gpu}.yaml").exists():
        return False
    return "bf16" in (_cluster_key(CONF_DIR, gpu, "peak_tflops", "cluster/gpu") or {})


@functools.cache
def gpu_clusters(conf_dir: Path = CONF_DIR) -> tuple[tuple[str, str, int], ...]:
    """(cluster, GPU type, GPUs per node) of every catalog cluster that names a GPU type (conf/cluster/gpu/), the
    generic catalog nodes (dgx_*) first, then by name."""
    found = []
    for path in sorted((conf_dir / "cluster").glob("*.yaml")):
        gpu = next((layer.path.stem for layer in reversed(hardware_catalog.cluster_layers(conf_dir, path.stem))
                    if layer.group == "gpu"), None)
        per_node = _cluster_key(conf_dir, path.stem, "workers_per_node")
        if gpu and isinstance(per_node, int):
            found.append((path.stem, gpu, per_node))
    return tuple(sorted(found, key=lambda c: (not c[0].startswith(PREFERRED_CLUSTERS), c[0])))


def _cluster(record: Record, draft: _Draft) -> None:
    """`cluster=<name>`: the catalog cluster that names the record's system (its `systems`), else one of the record's
    GPU type and GPUs per node."""
    gpu, per_node = record.hardware.gpu, record.hardware.gpus_per_node
    if gpu is None:
        draft.cannot(NOT_STATED, "hardware.gpu")
        return
    clusters = gpu_clusters()
    of_type = [c for c in clusters if c[1] == gpu]
    named = [c for c in of_type if record.hardware.system in (_cluster_key(CONF_DIR, c[0], "systems") or ())]
    if named:
        of_type = named  # the system the record ran on, where the catalog describes it
    if not of_type:
        unsure = " (its form factor and memory not stated)" if gpu == "v100" else ""
        draft.cannot(GPU, f"{gpu}{unsure}: no cluster of conf/cluster/ has this GPU type")
        return
    if per_node is None:
        name, _, per_node = of_type[0]
        draft.assume(f"GPUs per node not stated: {name}'s {per_node}")
    else:
        fitting = [c for c in of_type if c[2] == per_node]
        if not fitting:
            draft.cannot(CLUSTER, f"{per_node} x {gpu} per node (the catalog has " +
                         ", ".join(f"{c[0]}: {c[2]}" for c in of_type) + ")")
            return
        name = fitting[0][0]
    draft.set(f"cluster={name}")
    hw = record.hardware
    if (hw.nodes or 1) > 1 or (hw.total_gpus or 0) > per_node:
        if not (hw.inter_node or hw.system):  # what crosses nodes goes at the network's rate, which no default gives
            nodes = hw.nodes or -(-hw.total_gpus // per_node)
            draft.cannot(NOT_STATED, f"hardware.inter_node (a run over {nodes} nodes)")
        elif hw.inter_node:  # a record's network is words, not numbers: what it is priced as is said beside them
            draft.assume(f"inter-node network priced as {name}'s (conf/cluster/{name}.yaml); the record's: "
                         f"{hw.inter_node}")


# --- the network and its data -----------------------------------------------------------------------------------


def _seq_len(record: Record, draft: _Draft) -> int | None:
    """The record's context, else its framework's documented default (an assumption); None where neither is."""
    if record.model.seq_len is not None:
        return record.model.seq_len
    default = framework_of(record.training.framework, record.source.ref).seq_len
    if default is None:
        return None
    draft.assume(f"sequence length not stated: {default.value}, {record.training.framework}'s default "
                 f"({default.source})")
    return int(default.value)


def _tokens(record: Record, seq_len: int, vocab: int, vocab_source: str, draft: _Draft) -> None:
    """The token dataset of the record's context and vocabulary (unstated: the network's own, `vocab_source`)."""
    draft.set("dataset=tokens", f"dataset.seq_len={seq_len}")
    if record.model.vocab is None:
        draft.assume(f"vocabulary not stated: {vocab_source} {vocab}")
    vocab = record.model.vocab or vocab
    if vocab != TOKENS_VOCAB:
        draft.set(f"dataset.vocab_size={vocab}")


def _gpt2(record: Record, draft: _Draft) -> None:
    model = record.model
    seq_len = _seq_len(record, draft)
    missing = [f"model.{k}" for k in ("n_layer", "hidden", "n_head") if getattr(model, k) is None]
    missing += ["model.seq_len"] if seq_len is None else []
    if missing:
        draft.cannot(NOT_STATED, ", ".join(missing))
        return
    if model.ffn_hidden is not None and model.ffn_hidden != 4 * model.hidden:
        draft.cannot(NETWORK, f"{model.name}: ffn_hidden={model.ffn_hidden} is not GPT-2's 4 x hidden "
                              f"({4 * model.hidden})")
        return
    if model.hidden % model.n_head:
        draft.cannot(NETWORK, f"{model.name}: hidden={model.hidden} is not divisible by n_head={model.n_head}")
        return
    if model.family != "gpt2":
        draft.assume(f"{model.family} block ({model.name}) built as GPT-2's of its dimensions")
    _tokens(record, seq_len, TOKENS_VOCAB, "GPT-2's", draft)
    dims = GPT2Dims(n_layer=model.n_layer, n_head=model.n_head, n_embd=model.hidden)
    size = next((s for s, d in GPT2_SIZES.items() if d == dims), None)
    if size is not None:
        draft.set(f"network=gpt2_{size}")
    else:  # recorded as gpt2_L{n}_H{h}_E{e} (suite.models.resolve_network)
        draft.set("network=gpt2_small", f"network.n_layer={dims.n_layer}", f"network.n_head={dims.n_head}",
                  f"network.n_embd={dims.n_embd}")
    _attention(record, draft)


def _llama3(record: Record, draft: _Draft) -> None:
    """`network=llama3_<size>` where the record's dimensions are a named size's, else that network with its
    dimensions overridden."""
    model = record.model
    seq_len = _seq_len(record, draft)
    missing = [f"model.{k}" for k in ("n_layer", "hidden", "n_head", "ffn_hidden") if getattr(model, k) is None]
    missing += ["model.seq_len"] if seq_len is None else []
    if missing:
        draft.cannot(NOT_STATED, ", ".join(missing))
        return
    if model.hidden % model.n_head or model.n_head % LLAMA3_KV_HEADS:
        draft.cannot(NETWORK, f"{model.name}: hidden={model.hidden}, n_head={model.n_head} and Llama 3's "
                              f"{LLAMA3_KV_HEADS} key-value heads do not divide into whole heads and groups")
        return
    draft.assume(f"key-value heads not stated: Llama 3's {LLAMA3_KV_HEADS} (torchtitan's llama3_configs)")
    _tokens(record, seq_len, LLAMA3_VOCAB, "Llama 3's tokenizer's", draft)
    stated = (model.n_layer, model.n_head, LLAMA3_KV_HEADS, model.hidden, model.ffn_hidden)
    size = next((s for s, d in LLAMA3_SIZES.items()
                 if (d.n_layer, d.n_head, d.n_kv_head, d.n_embd, d.ffn_hidden) == stated), None)
    if size is not None:
        draft.set(f"network=llama3_{size}")
    else:
        # Llama's width rule (LlamaDims.ffn_hidden) rounds a multiplier's width of at most ffn_hidden up to a
        # multiple of ffn_hidden itself: the stated width, exactly
        multiplier = model.ffn_hidden / int(2 * 4 * model.hidden / 3)
        draft.set("network=llama3_8b", f"network.n_layer={model.n_layer}", f"network.n_head={model.n_head}",
                  f"network.n_kv_head={LLAMA3_KV_HEADS}", f"network.n_embd={model.hidden}",
                  f"network.ffn_dim_multiplier={multiplier!r}", f"network.multiple_of={model.ffn_hidden}")
    _attention(record, draft)


def _framework(record: Record, draft: _Draft) -> None:
    """Priced as the record's framework runs the point, where a file of conf/framework/ describes it; else as the
    suite's own implementation."""
    framework = described(record.training.framework, record.source.ref)
    if framework:
        draft.set(f"framework={framework.name}")


def _attention(record: Record, draft: _Draft) -> None:
    """The attention kernel the record's framework ran (conf/framework/), the record naming none: in fp32 its fp32
    kernel where its fused ones take half precision only."""
    framework = framework_of(record.training.framework, record.source.ref)
    kernel = framework.attention
    precision = record.training.precision or (framework.precision.value if framework.precision else "")
    if precision.lower() == "fp32" and framework.attention_fp32:
        kernel = framework.attention_fp32
    if kernel:
        draft.set(f"network.attention={kernel.value}")
        draft.assume(f"attention: {kernel.source}")


def _cnn(record: Record, draft: _Draft) -> None:
    model = record.model
    digits = re.search(r"\d+", model.name or "")
    name = "mobilenet_v2" if model.family == "mobilenet" else f"{model.family}{digits[0]}" if digits else None
    if name not in network_names():
        names = ", ".join(n for n in network_names() if n.startswith(model.family))
        draft.cannot(NETWORK, f"{model.name} (the suite's {model.family} networks: {names})")
        return
    draft.set("dataset=imagenet", f"network={name}")
    if model.image_size is None:
        draft.assume(f"image size not stated: ImageNet's {IMAGENET_SIZE}")
    elif model.image_size != IMAGENET_SIZE:
        draft.set(f"dataset.image_size={model.image_size}")


def _network(record: Record, draft: _Draft) -> bool:
    """The dataset and network; True for a language model."""
    family = record.model.family
    if family in LANGUAGE_FAMILIES:
        _gpt2(record, draft)
        return True
    if family in LLAMA_FAMILIES:
        _llama3(record, draft)
        return True
    if family in CNN_FAMILIES:
        _cnn(record, draft)
        return False
    draft.cannot(NETWORK if family else NOT_STATED,
                 f"{family} ({record.model.name}): the suite builds GPT-2, Llama 3 and ResNet, VGG, MobileNetV2"
                 if family else "model.family")
    return False


# --- precision, recomputation, optimizer ------------------------------------------------------------------------


def _precision(record: Record, strategy: str, draft: _Draft) -> None:
    word = record.training.precision
    if word is None:  # the framework's documented default (issue 61: fp32 assumed for every framework, 10x off)
        default = framework_of(record.training.framework, record.source.ref).precision
        if default is None:
            draft.cannot(PRECISION, f"not stated: precision (the record names none, and {record.training.framework} "
                         "documents no default the suite describes)")
            return
        word, source = default.value, default.source
        draft.assume(f"precision not stated: {word}, {record.training.framework}'s default ({source})")
        if word == "fp32":  # the suite's own default
            return
    text = word.lower()
    half = "fp16"
    spec = strategy_class(strategy)
    if (spec and "fp16" not in spec.supports.precisions and _runs_bf16(record.hardware.gpu)
            and (text in ("fp16", "amp_fp16") or text.startswith("mixed"))):
        half = "bf16"
        draft.assume(f"precision {word!r} run as bf16: strategy {strategy} has no fp16 loss scaling, and this GPU's "
                     "tensor cores run bf16 at fp16's rate")
    if "fp8" in text:
        _fp8(record, word, spec, draft)
    elif text in ("bf16", "amp_bf16"):
        draft.set("precision=bf16")
    elif text in ("fp16", "amp_fp16"):
        draft.set(f"precision={half}")
    elif text.startswith("mixed"):
        draft.set(f"precision={half}")
        if half == "fp16":
            draft.assume(f"precision {word!r} taken as fp16 with loss scaling (Megatron-LM's --fp16, DeepSpeed's "
                         "fp16)")
    elif text == "fp32":
        draft.set("precision=fp32")
    else:
        draft.cannot(PRECISION, f"{word}: not a precision the suite knows (fp32, bf16, fp16)")


def _fp8(record: Record, word: str, spec, draft: _Draft) -> None:
    """fp8 linear layers under bf16 (`fp8_linear+bf16`): torchao's float8 training with dynamic tensorwise scaling,
    the one recipe torchtitan's float8 converter had when such records were taken (its docs/float8.md: "we
    currently support tensor-wise scaling with dynamic scales")."""
    if spec is None:  # the layout's reason says why there is no point
        return
    if not spec.supports.fp8:
        draft.cannot(PRECISION, f"{word}: the suite trains fp8 linear layers under single, ddp and fsdp only")
        return
    draft.set("precision=bf16", "fp8=tensorwise")
    draft.assume(f"precision {word!r} run as precision=bf16 fp8=tensorwise (torchao's dynamic tensorwise scaling, "
                 "torchtitan's float8 default)")


def _eager(record: Record, strategy: str, draft: _Draft) -> None:
    """What the record ran beyond eager PyTorch's kernels and collectives, as `measured.also` flags it."""
    also = record.measured.also
    spec = strategy_class(strategy)
    if also.get("torch_compile") and spec is None:  # the layout's reason says why there is no point
        pass
    elif also.get("torch_compile") and record.model.family in (*LLAMA_FAMILIES, *LANGUAGE_FAMILIES) and \
            spec.supports.compile:
        draft.set("compile=true")
    elif also.get("torch_compile"):
        draft.cannot(COMPILE, "compiled and fused kernels: the suite compiles a decoder's blocks under single, ddp "
                              "and fsdp only")
    if also.get("async_tp"):
        draft.cannot(ASYNC_TP, "tensor-parallel matmuls decomposed to overlap their collectives (torchtitan's "
                               "enable_async_tensor_parallel): not a knob of the suite")


def _recompute(record: Record, strategy: str, draft: _Draft) -> None:
    word = record.training.activation_recompute
    framework = framework_of(record.training.framework, record.source.ref)
    if word == "selective" and not framework.selective_recompute:
        draft.cannot(RECOMPUTE, f"{record.training.framework}'s selective checkpointing, of a kind not described "
                                "(conf/framework/, selective_recompute)")
    elif word == "selective":
        draft.set(f"activation_checkpointing={framework.selective_recompute}")
    elif strategy == "gpipe":  # torchgpipe's own recomputation
        if word is None:
            draft.assume("recomputation not stated: torchgpipe's default checkpoint=except_last")
        elif word == "none":
            draft.set("strategy.checkpoint=never")
        # full: torchgpipe's default except_last (every micro-batch but the last), the suite's default too
    elif word == "full":
        draft.set("activation_checkpointing=every")
    elif word is None and framework.recompute:  # its documented default, said with its source
        if framework.recompute.value == "every":
            draft.set("activation_checkpointing=every")
        draft.assume(f"activation recomputation not stated: {framework.recompute.value}, "
                     f"{framework.recompute.source}")
    elif word is None:
        draft.cannot(NOT_STATED, f"training.activation_recompute (the record names none, and "
                                 f"{record.training.framework} documents no default the suite describes)")


def _dropout(record: Record, language: bool, draft: _Draft) -> None:
    """A language model's dropout (attention probabilities and hidden states; no record states it): its framework's
    documented default, said with its source; the suite's none where the framework describes none."""
    framework = framework_of(record.training.framework, record.source.ref)
    if not language or not framework.dropout:
        return
    value = float(framework.dropout.value)
    if value:
        draft.set(f"network.dropout={value:g}")
    draft.assume(f"dropout not stated: {value:g}, {framework.dropout.source}")


OPTIMIZER = re.compile(r"(?P<name>[a-z_]+)\s*(\((?:lr\s*=\s*(?P<lr>[0-9.e-]+))?[^)]*\))?")


def _optimizer(record: Record, language: bool, draft: _Draft) -> None:
    word = record.training.optimizer
    if word is None:
        if language:  # SGD, the suite's default, is not what trains these; ZeRO takes only Adam(W)
            draft.set("optimizer.name=adam")
            draft.assume("optimizer not stated: Adam (Megatron-LM's default; ZeRO trains with Adam)")
        else:
            draft.assume("optimizer not stated: SGD with momentum, the suite's default")
        return
    found = OPTIMIZER.fullmatch(word.strip().lower())
    name = found["name"] if found else None
    if name not in ("sgd", "adam", "adamw", "lamb"):
        draft.cannot(OPTIMIZER_KIND, f"{word!r} is not one the suite runs (sgd, adam, adamw, lamb)")
        return
    draft.set(f"optimizer.name={name}")
    if found["lr"]:
        draft.set(f"optimizer.lr={found['lr']}")


# --- strategy, layout and batch ---------------------------------------------------------------------------------


def _mini_batch(record: Record, dp: int, pipeline: bool, draft: _Draft) -> tuple[int, int] | None:
    """The batch one data-parallel replica trains per step (a pipeline's mini-batch), from the global batch, or
    from micro-batch x accumulation; outside a pipeline, with the micro-batches it accumulates over (1: none)."""
    t = record.training
    if t.global_batch is not None:
        if t.global_batch % dp:
            draft.cannot(BATCH, f"global_batch={t.global_batch} does not split over dp={dp} replicas")
            return None
        mini = t.global_batch // dp
    elif t.micro_batch is not None:
        mini = t.micro_batch * (t.grad_accum or 1)
        if t.grad_accum is None and not pipeline:
            draft.assume("global batch and gradient accumulation not stated: none (global = micro-batch x dp)")
    else:
        draft.cannot(NOT_STATED, "training.global_batch and training.micro_batch")
        return None
    if pipeline:
        return mini, 1
    if t.micro_batch is not None:
        if mini % t.micro_batch:
            draft.cannot(BATCH, f"global_batch={t.global_batch} is not micro_batch={t.micro_batch} x dp={dp} x "
                                "a whole accumulation")
            return None
        return mini, mini // t.micro_batch
    if t.grad_accum not in (None, 1):
        if mini % t.grad_accum:
            draft.cannot(BATCH, f"a replica's batch of {mini} is not grad_accum={t.grad_accum} whole micro-batches")
            return None
        return mini, t.grad_accum
    if t.global_batch is not None:
        draft.assume(f"micro-batch not stated: no accumulation, {mini} per replica")
    return mini, 1


def _pipeline_batches(record: Record, strategy: str, mini: int, stages: int, draft: _Draft) -> None:
    """A pipeline's micro-batches: of the record's micro-batch size, or its count (Megatron-LM's accumulation is
    the pipeline's micro-batch count)."""
    t = record.training
    if strategy == "pipedream":
        return  # one weight update per mini-batch and stage, no micro-batches
    if t.micro_batch is not None:
        if mini % t.micro_batch:
            draft.cannot(BATCH, f"a replica's batch of {mini} is not whole micro-batches of {t.micro_batch}")
            return
        draft.set(f"strategy.micro_batch_size={t.micro_batch}")
    elif t.grad_accum is not None:
        draft.set(f"strategy.micro_batches={t.grad_accum}")
    elif strategy == "gpipe":
        draft.set("strategy.micro_batches=1")
        draft.assume("micro-batches not stated: torchgpipe's default chunks=1")
    else:
        draft.cannot(NOT_STATED, f"training.micro_batch (a {stages}-stage pipeline's micro-batches)")


def _layout(record: Record, language: bool, draft: _Draft) -> str | None:
    """Workers, strategy, its knobs and the batch; the suite's strategy name."""
    word, layout, hardware = record.layout.strategy, record.layout, record.hardware
    total = hardware.total_gpus
    if word is None:
        draft.cannot(NOT_STATED, "layout.strategy")
        return None
    if total is None:
        draft.cannot(NOT_STATED, "hardware.total_gpus")
        return None
    framework = framework_of(record.training.framework, record.source.ref)
    cp = record.measured.also.get("context_parallel_degree") or 1
    if cp > 1 and not (framework.shards_data_parallel and word == "hybrid"):
        draft.cannot(CONTEXT_PARALLEL, f"the sequence split over {cp} GPUs beside {word} (the suite splits it "
                                       "under FSDP)")
        return None
    if framework.offload:
        draft.cannot(OFFLOAD, f"{record.training.framework}: what is offloaded (activations, optimizer states, "
                              "parameters) is not a field of the record, nor activation offload a knob of the suite")
        return None
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    schedule = layout.schedule or ("interleaved_1f1b" if word == "interleaved_1f1b" else None)
    if word == "hybrid":
        optimizer_only = layout.zero_stage == 1 and framework.shards_optimizer  # its ZeRO-1, priced as declared
        if (layout.zero_stage and not optimizer_only) or (framework.shards_data_parallel and (pp or 1) > 1):
            sharded = f"ZeRO-{layout.zero_stage}" if layout.zero_stage else "FSDP"
            draft.cannot(LAYOUT_3D, f"{sharded} with model parallelism (tp={tp}, pp={pp}; the 3D-layouts issue)")
            return None
        if framework.shards_data_parallel:  # FSDP over tensor-parallel groups (torchtitan's 2D)
            word = "fsdp"
        elif None in (dp, tp, pp):
            draft.cannot(NOT_STATED, "layout.dp, tp and pp of a hybrid layout")
            return None
        else:
            if pp > 1 and schedule is None and framework.pipeline_schedule:
                schedule = framework.pipeline_schedule.value
                draft.assume(f"pipeline schedule not stated: {schedule}, {record.training.framework}'s "
                             f"({framework.pipeline_schedule.source})")
            word = (schedule or "1f1b") if pp > 1 else "megatron_tp" if tp > 1 else "ddp"
        if pp > 1 and schedule is None:
            draft.assume("pipeline schedule not stated: Megatron-LM's default 1F1B")
    dp = dp if dp is not None else total // ((tp or 1) * (pp or 1) * cp)
    tp, pp = tp or 1, pp or 1
    if dp * tp * pp * cp != total:
        draft.cannot(INCONSISTENT, f"dp={dp} x tp={tp} x pp={pp}" + (f" x cp={cp}" if cp > 1 else "")
                     + f" is not total_gpus={total}")
        return None
    parallel = ({"pp": pp} if word in ("fsdp", "megatron_tp") else {"tp": tp, "pp": pp} if word in DATA_PARALLEL
                else {})
    beyond = [f"{k}={v}" for k, v in parallel.items() if v > 1]
    if beyond:
        draft.cannot(LAYOUT_3D, f"{word} with {' '.join(beyond)} (the 3D-layouts issue)")
        return None
    draft.set(f"workers={total}")
    if word in DATA_PARALLEL:
        strategy = "zero" if word.startswith("zero") else word
        draft.set(f"strategy={strategy}")
        if strategy == "zero":
            stage = int(word[-1])
            if layout.zero_stage not in (None, stage):
                draft.cannot(INCONSISTENT, f"layout.strategy={word} but zero_stage={layout.zero_stage}")
            draft.set(f"strategy.zero_stage={stage}")
        if strategy == "fsdp" and tp > 1:
            draft.set(f"strategy.tp={tp}")
        if cp > 1:
            draft.set(f"strategy.cp={cp}")
        if strategy == "fsdp":
            sharding = record.measured.also.get("fsdp_sharding_strategy")
            if sharding == "SHARD_GRAD_OP":
                draft.set("strategy.reshard_after_forward=false")
            elif sharding not in (None, "FULL_SHARD"):
                draft.cannot(LAYOUT_3D, f"FSDP {sharding}: sharded within a node, replicated across")
        batch = _mini_batch(record, dp, False, draft)
    elif word == "megatron_tp":
        strategy = "megatron"
        if not language:
            draft.cannot(NETWORK, "Megatron tensor parallelism of a CNN")
        draft.set("strategy=megatron", f"strategy.tp={tp}", "strategy.batch_grows_with_tp=false")
        if layout.sequence_parallel:
            draft.set("strategy.sequence_parallel=true")
        batch = _mini_batch(record, dp, False, draft)
    elif word in PIPELINES:
        if word == "gpipe" and dp == 1 and (framework.single_process_pipeline or hardware.nodes in (None, 1)):
            strategy = "gpipe"
        else:
            strategy = {"gpipe": "gpipe_dist", "pipedream_async": "pipedream"}.get(word, "1f1b")
        draft.set(f"strategy={strategy}")
        if tp > 1:  # 1F1B's and GPipe's stages across ranks split their blocks (Megatron-LM's 3D layout)
            if strategy not in ("1f1b", "gpipe_dist"):
                draft.cannot(LAYOUT_3D, f"{strategy} with tp={tp}: its stages are not split (the 3D-layouts issue)")
            draft.set(f"strategy.tp={tp}")
        if dp > 1 or tp > 1:
            draft.set(f"strategy.pp={pp}")
        if schedule == "interleaved_1f1b":
            if layout.virtual_stages is None:
                draft.cannot(NOT_STATED, "layout.virtual_stages of an interleaved 1F1B schedule")
            else:
                draft.set(f"strategy.virtual_stages={layout.virtual_stages}")
        batch = _mini_batch(record, dp, True, draft)
        if batch is not None:
            _pipeline_batches(record, strategy, batch[0], pp, draft)
    else:
        draft.cannot(LAYOUT_3D, f"layout.strategy={word}")
        return None
    if batch is not None:
        mini, accumulation = batch
        draft.set(f"batch_size={mini // accumulation}")
        if accumulation > 1:  # the strategies that do not accumulate refuse it in the planner, with their line
            draft.set(f"grad_accum={accumulation}")
    return strategy


def _epoch(record: Record, language: bool, draft: _Draft) -> None:
    """An epoch metric priced over the record's own dataset: `measured.also.epoch_samples` (or `epoch_tokens`, for a
    language model), else ImageNet's training set for an ImageNet network; a language model's epoch of no stated size
    is not priced (issue 61: an epoch over a paper's corpus priced as one of the suite's `tokens`, 500x too fast)."""
    if record.measured.metric != "epoch_time_s":
        return
    also = record.measured.also
    samples = also.get("epoch_samples")
    if samples is None and language and also.get("epoch_tokens") and record.model.seq_len:
        samples = also["epoch_tokens"] // record.model.seq_len
    if samples:
        draft.set(f"dataset.samples={int(samples)}")
    elif language:
        draft.cannot(NOT_STATED, "the dataset behind an epoch (measured.also.epoch_samples or epoch_tokens)")
    else:
        draft.assume(f"an epoch of ImageNet's {CATALOG['imagenet'].train:,} training images")


def map_record(record: Record) -> Mapped:
    """The record's point as overrides (what `python -m suite` or `make predict` takes), with the defaults taken
    for what it leaves unstated; or the reasons it is not a point. Pure: nothing composed, nothing read but the
    catalog's cluster files."""
    draft = _Draft()
    for line in record.stated_elsewhere:
        draft.assume(f"not in the record, stated elsewhere: {line}")
    _framework(record, draft)
    language = _network(record, draft)
    _cluster(record, draft)
    strategy = _layout(record, language, draft)
    _eager(record, strategy or "", draft)
    _precision(record, strategy or "", draft)
    _recompute(record, strategy or "", draft)
    _dropout(record, language, draft)
    _optimizer(record, language, draft)
    _epoch(record, language, draft)
    if record.layout.sequence_parallel and strategy in ("fsdp", "1f1b", "gpipe_dist") and (record.layout.tp or 1) > 1:
        draft.set("strategy.sequence_parallel=true")
    elif record.layout.sequence_parallel and strategy not in (None, "megatron"):
        draft.cannot(LAYOUT_3D, f"sequence parallelism in {strategy} without tensor parallelism")
    return Mapped(record, tuple(draft.overrides), tuple(draft.assumptions), tuple(draft.reasons))


def plan_records(records: list[Record], torch_version: str | None = None) -> list[Mapped]:
    """Every record mapped, and each expressible one composed and validated as a sweep plans a point (its
    `point`); a point the planner rejects keeps the planner's line as its reason. In the records' order."""
    mapped = [map_record(record) for record in records]
    register_schema()
    GlobalHydra.instance().clear()
    planned = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for m in mapped:
            if m.reasons:
                planned.append(m)
                continue
            try:
                overrides = [*m.overrides, *NOTHING_SUBMITTED]
                point = make_point(overrides, compose_point(overrides), "published",
                                   torch_version or torch.__version__, runs_here=False)
            except (ConfigError, OlderTorch) as e:
                planned.append(replace(m, reasons=(Reason(PLANNER, " ".join(str(e).split())),)))
            else:
                planned.append(replace(m, point=point))
    return planned


EXPRESSIBLE = "expressible"


def counts(planned: list[Mapped]) -> dict[str, tuple[int, int]]:
    """Per reason kind, (records it is the first reason of, records it is among the reasons of); `expressible`
    first, (points, points). The first counts partition the records."""
    first: dict[str, int] = {}
    among: dict[str, int] = {}
    for m in planned:
        key = EXPRESSIBLE if m.expressible else m.reason.kind
        first[key] = first.get(key, 0) + 1
        for kind in {r.kind for r in m.reasons} or {EXPRESSIBLE}:
            among[kind] = among.get(kind, 0) + 1
    order = sorted(among, key=lambda k: (k != EXPRESSIBLE, -first.get(k, 0), -among[k], k))
    return {k: (first.get(k, 0), among[k]) for k in order}

