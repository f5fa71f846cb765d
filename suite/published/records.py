"""A published-measurements file (analysis/published/gpu_measurements.yaml, or any file of its schema) read into
frozen records, each field named as the schema's (analysis/published/README.md). Null is "not stated", kept as None.

A malformed record is one line naming the file, the record and the key (`<file>: record <id>: <key> ...`), raised as
`MalformedRecord` before anything is mapped or priced: a value of the wrong type, a word outside its vocabulary (a
strategy, a GPU, a metric), a key the schema does not have, a missing `id`, `measured.metric` or `measured.value`,
an id given twice.

A record's own source may leave null what another public source by its authors states for the same run (the scripts
that produced a paper's table): a file of such fields (`stated_elsewhere`, analysis/published/stated_elsewhere.yaml)
fills them, each with its citation, which the mapping prints among the record's assumptions. It fills only what the
record leaves null: it never changes what the record states.
"""

from __future__ import annotations

import io
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import yaml

from suite.errors import BadValue, yaml_error_line
from suite.paths import REPO_ROOT

STRATEGIES = ("ddp", "horovod", "gpipe", "1f1b", "interleaved_1f1b", "pipedream_async", "zero1", "zero2", "zero3",
              "fsdp", "megatron_tp", "hybrid")
GPUS = ("v100_sxm2_16gb", "v100_sxm2_32gb", "v100_sxm3_32gb", "v100_pcie_32gb", "v100", "a100_sxm4_40gb",
        "a100_sxm4_80gb", "h100_sxm5_80gb", "h100_sxm5_96gb", "h200_sxm_141gb", "titan_rtx", "p100", "p40")
OTHER_GPU = "other:"  # other:<name>: a part the schema has no word for
METRICS = ("tflops_per_gpu", "mfu", "samples_per_s", "tokens_per_s", "tokens_per_s_per_gpu", "iteration_time_s",
           "epoch_time_s", "speedup", "scaling_efficiency", "memory_gb_per_gpu", "max_batch_fits")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
RECOMPUTE = ("full", "selective", "none")


class MalformedRecord(BadValue):
    """A record the schema does not allow; its message is one line naming the file, the record and the key."""


@dataclass(frozen=True)
class Source:
    title: str | None = None
    ref: str | None = None
    where: str | None = None
    url_or_repo: str | None = None


@dataclass(frozen=True)
class Hardware:
    gpu: str | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    total_gpus: int | None = None
    intra_node: str | None = None
    inter_node: str | None = None
    system: str | None = None


@dataclass(frozen=True)
class Model:
    family: str | None = None
    name: str | None = None
    n_layer: int | None = None
    hidden: int | None = None
    n_head: int | None = None
    ffn_hidden: int | None = None
    seq_len: int | None = None
    vocab: int | None = None
    params_b: float | None = None
    image_size: int | None = None


@dataclass(frozen=True)
class Training:
    precision: str | None = None
    global_batch: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    activation_recompute: str | None = None
    optimizer: str | None = None
    framework: str | None = None


@dataclass(frozen=True)
class Layout:
    strategy: str | None = None
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    virtual_stages: int | None = None
    schedule: str | None = None
    sequence_parallel: bool | None = None
    zero_stage: int | None = None


@dataclass(frozen=True)
class Measured:
    metric: str
    value: float
    unit: str | None = None
    also: Mapping[str, object] = field(default_factory=lambda: types.MappingProxyType({}))  # the row's other figures


@dataclass(frozen=True)
class Record:
    id: str
    source: Source
    hardware: Hardware
    model: Model
    training: Training
    layout: Layout
    measured: Measured
    notes: str | None = None
    stated_elsewhere: tuple[str, ...] = ()  # fields filled from another source: `<field>=<value> (<its citation>)`

    @property
    def prefix(self) -> str:
        """The source family the id names (megatron, llmfoundry, torchtitan, ...): records sharing it share a
        source."""
        return self.id.split("-", 1)[0]


SECTIONS = {"source": Source, "hardware": Hardware, "model": Model, "training": Training, "layout": Layout,
            "measured": Measured}
REQUIRED = {"measured": ("metric", "value")}
VOCABULARY = {("layout", "strategy"): STRATEGIES, ("measured", "metric"): METRICS,
              ("layout", "schedule"): SCHEDULES, ("training", "activation_recompute"): RECOMPUTE}


def _kinds(cls: type, key: str) -> tuple[type, ...]:
    """The Python types a field (`int | None`, `float`, a mapping) allows, None aside."""
    hint = typing.get_type_hints(cls)[key]
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return tuple(typing.get_origin(k) or k for k in kinds if k is not type(None))


def _fits(value: object, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # YAML's true is an int to Python: only a bool field takes it
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", Mapping: "a mapping"}


def _section(cls: type, entry: object, where: str, name: str) -> object:
    if entry is None:
        entry = {}
    if not isinstance(entry, dict):
        raise MalformedRecord(f"{where}: {name} must be a mapping, got {entry!r}")
    known = {f.name: f for f in fields(cls)}
    for key in entry:
        if key not in known:
            raise MalformedRecord(f"{where}: {name}.{key} is not a key of the schema (one of {', '.join(known)})")
    for key in REQUIRED.get(name, ()):
        if entry.get(key) is None:
            raise MalformedRecord(f"{where}: {name}.{key} is required")
    values = {}
    for key, value in entry.items():
        if value is None:
            continue  # not stated: the field's default, None (an empty `also`)
        kinds = _kinds(cls, key)
        if not _fits(value, kinds):
            raise MalformedRecord(f"{where}: {name}.{key}={value!r} is not {TYPE_WORDS[kinds[0]]}")
        choices = VOCABULARY.get((name, key))
        if choices and value not in choices:
            raise MalformedRecord(f"{where}: {name}.{key}={value} is not one of {', '.join(choices)}")
        if isinstance(value, int) and not isinstance(value, bool) and float not in kinds and value < 1 and \
                key != "zero_stage":
            raise MalformedRecord(f"{where}: {name}.{key}={value} must be positive")
        if key == "value" and float(value) != float(value):  # NaN: no figure
            raise MalformedRecord(f"{where}: {name}.{key} is not a number")
        if key == "also":
            value = types.MappingProxyType(dict(value))
        elif float in kinds and isinstance(value, int):
            value = float(value)
        values[key] = value
    if name == "hardware":
        gpu = values.get("gpu")
        if gpu is not None and gpu not in GPUS and not (gpu.startswith(OTHER_GPU) and len(gpu) > len(OTHER_GPU)):
            raise MalformedRecord(f"{where}: hardware.gpu={gpu} is not one of {', '.join(GPUS)} or other:<name>")
    if name == "layout" and values.get("zero_stage") is not None and values["zero_stage"] not in (1, 2, 3):
        raise MalformedRecord(f"{where}: layout.zero_stage={values['zero_stage']} is not one of 1, 2, 3")
    return cls(**values)


def parse(entry: object, where: str) -> Record:
    """One record from its YAML mapping; `where` names it in errors (`<file>: record <id>`)."""
    if not isinstance(entry, dict):
        raise MalformedRecord(f"{where}: a record must be a mapping, got {entry!r}")
    known = ("id", *SECTIONS, "notes")
    for key in entry:
        if key not in known:
            raise MalformedRecord(f"{where}: {key} is not a key of the schema (one of {', '.join(known)})")
    if "measured" not in entry or entry["measured"] is None:
        raise MalformedRecord(f"{where}: measured.metric is required")
    notes = entry.get("notes")
    if notes is not None and not isinstance(notes, str):
        raise MalformedRecord(f"{where}: notes={notes!r} is not a string")
    return Record(id=entry["id"], notes=notes,
                  **{name: _section(cls, entry.get(name), where, name) for name, cls in SECTIONS.items()})


def shown(path: Path) -> str:
    """A file as the user named it, or from the repository's root where it is under it."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def _entries(path: Path, what: str) -> tuple[str, list]:
    """A file's name as shown and its YAML list; MalformedRecord (one line) where it cannot be read or is no list."""
    name = shown(path)
    try:
        stream = io.StringIO(path.read_text())
        stream.name = name  # what a syntax error's place names
        entries = yaml.load(stream, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as e:
        raise MalformedRecord(f"{name}: cannot be read ({e.strerror or e})") from e
    except yaml.YAMLError as e:
        raise MalformedRecord(yaml_error_line(e) or f"{name}: not YAML") from e
    if not isinstance(entries, list):
        raise MalformedRecord(f"{name}: {what} is a list of records, got {type(entries).__name__}")
    return name, entries


def load(path: str | Path) -> list[Record]:
    """Every record of a published-measurements file, in its order. MalformedRecord (one line) for a file that
    cannot be read or a record the schema does not allow."""
    name, entries = _entries(Path(path), "a published-measurements file")
    records, seen = [], {}
    for index, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise MalformedRecord(f"{name}: record {index}: a record is a mapping, got {entry!r}")
        ident = entry.get("id")
        if ident is None or ident == "":
            raise MalformedRecord(f"{name}: record {index} (no id): id is required")
        if not isinstance(ident, str):
            raise MalformedRecord(f"{name}: record {index}: id={ident!r} is not a string")
        where = f"{name}: record {ident}"
        if ident in seen:
            raise MalformedRecord(f"{where}: id is given twice (records {seen[ident]} and {index})")
        seen[ident] = index
        records.append(parse(entry, where))
    return records


FILLABLE = ("hardware", "model", "training", "layout")


def stated_elsewhere(records: list[Record], path: str | Path) -> list[Record]:
    """The records with the fields a file of `stated_elsewhere` entries gives them filled in, each entry `id`,
    `source: {ref, where}` (where those fields are stated) and the fields under their sections (`training:
    {micro_batch: 4}`); a record no entry names as it was. MalformedRecord (one line) for an entry the schema does
    not allow, one without its source, or one that gives a field its record states."""
    name, entries = _entries(Path(path), "a stated-elsewhere file")
    by_id = {record.id: record for record in records}
    for index, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise MalformedRecord(f"{name}: entry {index}: an entry is a mapping with the id of a record")
        where = f"{name}: entry {entry['id']}"
        for key in entry:
            if key not in ("id", "source", *FILLABLE):
                raise MalformedRecord(f"{where}: {key} is not a key of an entry (id, source, {', '.join(FILLABLE)})")
        source = _section(Source, entry.get("source"), where, "source")
        if not (source.ref and source.where):
            raise MalformedRecord(f"{where}: source.ref and source.where are required: where the fields are stated")
        record = by_id.get(entry["id"])
        if record is None:
            continue  # a record of a file not read this time
        filled, said = {}, []
        for section in FILLABLE:
            given = _section(SECTIONS[section], entry.get(section), where, section)
            stated = getattr(record, section)
            keys = [key for key, value in (entry.get(section) or {}).items() if value is not None]
            for key in keys:
                if getattr(stated, key) is not None:
                    raise MalformedRecord(f"{where}: {section}.{key} is stated in the record "
                                          f"({getattr(stated, key)!r}): an entry fills only what it leaves null")
                said.append(f"{section}.{key}={getattr(given, key)}")
            if keys:
                filled[section] = replace(stated, **{key: getattr(given, key) for key in keys})
        line = f"{', '.join(said)} ({source.ref}: {source.where})"
        by_id[record.id] = replace(record, stated_elsewhere=(*record.stated_elsewhere, line), **filled)
    return [by_id[record.id] for record in records]
