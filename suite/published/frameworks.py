"""The frameworks published records were measured with, as data: conf/framework/<name>.yaml says what each runs
where a record leaves it unstated (precision, recomputation, its attention kernel, its context length) and what it
does that a record's fields do not say (offloading, sharded data parallelism, a one-process pipeline), each default
with its source. A record names its framework as its source spells it; a file's `names` are matched whole, never by
substring, and a framework no file describes has no defaults (what it leaves unstated stays "not stated"). Where a
framework changed what it runs between releases, a file of one era names the commits its records cite (`source_refs`,
matched at the start of a record's `source.ref`); the file of the same name without them describes the rest."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import yaml

from suite.paths import CONF_DIR

KEYS = {"names", "attention", "precision", "recompute", "selective_recompute", "offload", "shards_data_parallel",
        "single_process_pipeline", "runnable", "pipeline_sends", "gradient_reduction", "seq_len", "context_parallel",
        "activations", "optimizer_sharding", "pipeline_schedule", "pipeline_partition", "dropout", "source_refs"}


@dataclass(frozen=True)
class Default:
    """What a framework runs where a record does not say, and the source that says so."""

    value: str
    source: str


@dataclass(frozen=True)
class Framework:
    name: str  # its file's
    attention: Default | None = None  # the kernel its attention ran: math, efficient or flash
    precision: Default | None = None
    recompute: Default | None = None  # activation recomputation: every or none
    # the suite's activation_checkpointing its "selective" recomputation is: selective (Megatron-LM's attention core)
    # or selective_op (torchtitan's operator policy); None: none the suite runs
    selective_recompute: str | None = None
    offload: bool = False  # it offloads to the host (what, no record field says)
    shards_data_parallel: bool = False  # its data parallelism is FSDP's
    shards_optimizer: bool = False  # its optimizer's states partitioned over the data-parallel replicas (ZeRO-1)
    single_process_pipeline: bool = False  # one process drives every stage (torchgpipe)
    seq_len: Default | None = None  # the context its training configs give a language model
    attention_fp32: Default | None = None  # where its fused kernels take half precision only: the one it runs in fp32
    pipeline_schedule: Default | None = None  # the schedule its pipeline runs (the suite's strategy name)
    dropout: Default | None = None  # its language models' dropout probability (attention and hidden), by default


def _default(entry: dict | None, key: str) -> Default | None:
    return Default(str(entry[key]), str(entry["source"])) if entry and key in entry else None


@functools.cache
def frameworks() -> dict[str, list[tuple[tuple[str, ...], Framework]]]:
    """Each described framework by every name a record may give it: under one name, each era's file with the source
    refs it is matched by (none: the name's default)."""
    found: dict[str, list[tuple[tuple[str, ...], Framework]]] = {}
    for path in sorted((CONF_DIR / "framework").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        unknown = set(data) - KEYS
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(KEYS))})")
        framework = Framework(path.stem, _default(data.get("attention"), "kernel"),
                              _default(data.get("precision"), "default"), _default(data.get("recompute"), "default"),
                              data.get("selective_recompute"), bool(data.get("offload")),
                              bool(data.get("shards_data_parallel")), bool(data.get("optimizer_sharding")),
                              bool(data.get("single_process_pipeline")),
                              _default(data.get("seq_len"), "default"),
                              _default(data.get("attention", {}).get("in_fp32"), "kernel"),
                              _default(data.get("pipeline_schedule"), "default"),
                              _default(data.get("dropout"), "default"))
        for name in data["names"]:
            found.setdefault(name, []).append((tuple(data.get("source_refs") or ()), framework))
    return found


def described(name: str | None, ref: str | None = None) -> Framework | None:
    """The file describing the framework a record names, of the era its source `ref` cites; None where none does."""
    eras = frameworks().get(name or "", [])
    cited = [framework for refs, framework in eras if ref and any(ref.startswith(r) for r in refs)]
    return next(iter(cited or [framework for refs, framework in eras if not refs]), None)


def framework_of(name: str | None, ref: str | None = None) -> Framework:
    """The framework a record names (of the era its source `ref` cites); one with no defaults where no file
    describes it."""
    return described(name, ref) or Framework(name or "not stated")
