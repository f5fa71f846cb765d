"""Datasets: synthetic with the published shapes, scikit-learn's bundled digits, real ones from a path.

Every dataset is map-style with a length, so the trainer shards it with a DistributedSampler and
each rank reads only its shard. Image items are (float32 [C, H, W], int64 label); token items are
(int64 [seq_len] input, int64 [seq_len] next-token target).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset, Subset

from suite.data.digits import digits_splits
from suite.data.real import check_real, real_splits
from suite.data.synthetic import SyntheticImages, SyntheticTokens
from suite.errors import BadValue, ConfigError

KINDS = ("image", "tokens")
SOURCES = ("synthetic", "real", "digits")
TASKS = {"image": "classification", "tokens": "language_model"}


@dataclass(frozen=True)
class Catalogued:
    """What a dataset name means: its kind, where it can come from, and its published size."""

    kind: str
    sources: tuple[str, ...]
    train: int  # images, or tokens for token datasets
    val: int


CATALOG = {  # sizes from REFERENCES.md; highres has 60,000 images in all
    "mnist": Catalogued("image", ("synthetic", "real"), 60_000, 10_000),
    "cifar10": Catalogued("image", ("synthetic", "real"), 50_000, 10_000),
    "imagenet": Catalogued("image", ("synthetic", "real"), 1_281_167, 50_000),
    "highres": Catalogued("image", ("synthetic",), 50_000, 10_000),
    "tokens": Catalogued("tokens", ("synthetic",), 103_227_021, 217_646),  # WikiText-103's token counts
    "wikitext103": Catalogued("tokens", ("real",), 103_227_021, 217_646),
    "digits": Catalogued("image", ("digits",), 1437, 360),
}
DIGITS_SHAPE = {"channels": 1, "image_size": 8, "num_classes": 10}


@dataclass(frozen=True)
class Datasets:
    train: Dataset
    val: Dataset
    task: str  # classification | language_model


def _choice(field: str, value: str, choices) -> None:
    if value not in choices:
        raise BadValue(f"dataset.{field}={value} is not one of {', '.join(choices)}")


def check_dataset(cfg) -> None:
    """Raise ConfigError (one line) for a dataset that cannot be built; cheap, runs before launch."""
    _choice("name", cfg.name, CATALOG)
    _choice("kind", cfg.kind, KINDS)
    _choice("source", cfg.source, SOURCES)
    entry = CATALOG[cfg.name]
    if cfg.kind != entry.kind:
        raise ConfigError(f"dataset {cfg.name} is {entry.kind} data, not dataset.kind={cfg.kind}")
    if cfg.source not in entry.sources:
        raise ConfigError(f"dataset {cfg.name} comes from dataset.source={' or '.join(entry.sources)}, "
                          f"not {cfg.source}")
    for field in ("samples", "val_samples"):
        value = getattr(cfg, field)
        if value is not None and value <= 0:
            raise BadValue(f"dataset.{field}={value} must be positive")
    if cfg.loader_workers is not None and cfg.loader_workers < 0:
        raise BadValue(f"dataset.loader_workers={cfg.loader_workers} must be >= 0")
    sizes = ("num_classes", "channels", "image_size") if cfg.kind == "image" else ("vocab_size", "seq_len")
    for field in sizes:
        if getattr(cfg, field) <= 0:
            raise BadValue(f"dataset {cfg.name}: dataset.{field} must be positive, got {getattr(cfg, field)}")
    if cfg.source == "digits":
        for field, value in DIGITS_SHAPE.items():
            if getattr(cfg, field) != value:
                raise ConfigError(f"dataset digits is 10 classes of 1x8x8 images: dataset.{field} must be {value}")
    if cfg.source == "real":
        check_real(cfg)


def published_samples(cfg) -> tuple[int, int]:
    """(train, val) sample counts of the published dataset: images, or sequences of seq_len tokens."""
    entry = CATALOG[cfg.name]
    if cfg.kind == "tokens":
        return entry.train // cfg.seq_len, entry.val // cfg.seq_len
    return entry.train, entry.val


def train_samples(cfg) -> int | None:
    """Training samples of `cfg` when known without reading data (synthetic, digits); None for real data."""
    if cfg.source == "real":
        return None
    available = published_samples(cfg)[0]
    if cfg.source == "synthetic":
        return available if cfg.samples is None else cfg.samples
    return available if cfg.samples is None else min(cfg.samples, available)


def _synthetic_splits(cfg, seed: int) -> tuple[Dataset, Dataset]:
    train = train_samples(cfg)  # the size the plan checked batches and steps against
    val = published_samples(cfg)[1] if cfg.val_samples is None else cfg.val_samples
    if cfg.kind == "image":
        shape = (cfg.num_classes, cfg.channels, cfg.image_size, seed)
        return SyntheticImages(train, *shape, "train"), SyntheticImages(val, *shape, "val")
    shape = (cfg.vocab_size, cfg.seq_len, seed)
    return SyntheticTokens(train, *shape, "train"), SyntheticTokens(val, *shape, "val")


def _cap(dataset: Dataset, samples: int | None) -> Dataset:
    return dataset if samples is None or samples >= len(dataset) else Subset(dataset, range(samples))


def build_datasets(cfg, seed: int) -> Datasets:
    """The training and validation sets of `cfg`; synthetic data is a function of `seed`."""
    check_dataset(cfg)
    if cfg.source == "synthetic":
        train, val = _synthetic_splits(cfg, seed)
    else:
        train, val = digits_splits() if cfg.source == "digits" else real_splits(cfg)
        train, val = _cap(train, cfg.samples), _cap(val, cfg.val_samples)
    return Datasets(train, val, TASKS[cfg.kind])
