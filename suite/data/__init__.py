"""Datasets: synthetic with the published shapes, scikit-learn's bundled digits, real ones from a path.

Every dataset is map-style with a length, so the trainer shards it with a DistributedSampler and
each rank reads only its shard. Image items are (float [C, H, W], int64 label); token items are
(int64 [seq_len] input, int64 [seq_len] next-token target).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from suite.data.real import REQUIRED, missing_files, real_splits
from suite.data.synthetic import SyntheticImages, SyntheticTokens
from suite.errors import ConfigError

# Published sizes (train, validation): images, or tokens for token datasets (REFERENCES.md).
PUBLISHED = {
    "mnist": (60_000, 10_000),
    "cifar10": (50_000, 10_000),
    "imagenet": (1_281_167, 50_000),
    "highres": (50_000, 10_000),
    "tokens": (103_227_021, 217_646),
}
DIGITS_TRAIN = 1437  # of scikit-learn's 1797 digits; the other 360 validate


@dataclass(frozen=True)
class Datasets:
    train: Dataset
    val: Dataset
    task: str  # classification | language_model


def _published_samples(cfg) -> tuple[int, int]:
    train, val = PUBLISHED.get(cfg.name, PUBLISHED["tokens" if cfg.kind == "tokens" else "cifar10"])
    if cfg.kind == "tokens":
        return train // cfg.seq_len, val // cfg.seq_len
    return train, val


def check_dataset(cfg) -> None:
    """Raise ConfigError (one line) for a dataset that cannot be built; cheap, runs before launch."""
    if cfg.kind not in ("image", "tokens"):
        raise ConfigError(f"dataset.kind={cfg.kind} is not one of image, tokens")
    if cfg.source not in ("synthetic", "real", "digits"):
        raise ConfigError(f"dataset.source={cfg.source} is not one of synthetic, real, digits")
    for key in ("samples", "val_samples"):
        if cfg[key] is not None and cfg[key] <= 0:
            raise ConfigError(f"dataset.{key}={cfg[key]} must be positive")
    sizes = ("num_classes", "channels", "image_size") if cfg.kind == "image" else ("vocab_size", "seq_len")
    for key in sizes:
        if cfg[key] <= 0:
            raise ConfigError(f"dataset {cfg.name}: dataset.{key} must be positive, got {cfg[key]}")
    if cfg.loader_workers < 0:
        raise ConfigError(f"dataset.loader_workers={cfg.loader_workers} must be >= 0")
    if cfg.source == "digits" and (cfg.kind, cfg.channels, cfg.image_size, cfg.num_classes) != ("image", 1, 8, 10):
        raise ConfigError("dataset digits is 10 classes of 1x8x8 images: keep channels=1, image_size=8, num_classes=10")
    if cfg.source == "real":
        if cfg.name not in REQUIRED:
            raise ConfigError(f"no reader for real dataset {cfg.name} (known: {', '.join(REQUIRED)})")
        if cfg.path is None:
            raise ConfigError(f"dataset {cfg.name} is real data: set dataset.path=/path/to/{cfg.name} (no downloads)")
        missing = missing_files(cfg.name, Path(cfg.path))
        if missing:
            raise ConfigError(f"dataset {cfg.name}: {Path(cfg.path) / missing[0]} does not exist")


def _digits() -> tuple[Dataset, Dataset]:
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    x = (x - x.mean()) / x.std()
    y = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # the same split for every run
    train, val = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def _cap(dataset: Dataset, samples: int | None) -> Dataset:
    return dataset if samples is None or samples >= len(dataset) else Subset(dataset, range(samples))


def build_datasets(cfg, seed: int) -> Datasets:
    task = "classification" if cfg.kind == "image" else "language_model"
    if cfg.source == "digits":
        train, val = _digits()
    elif cfg.source == "real":
        train, val = real_splits(cfg)
    else:
        published_train, published_val = _published_samples(cfg)
        n_train, n_val = cfg.samples or published_train, cfg.val_samples or published_val
        if cfg.kind == "image":
            shape = (cfg.num_classes, cfg.channels, cfg.image_size, seed)
            train, val = SyntheticImages(n_train, *shape, "train"), SyntheticImages(n_val, *shape, "val")
        else:
            shape = (cfg.vocab_size, cfg.seq_len, seed)
            train, val = SyntheticTokens(n_train, *shape, "train"), SyntheticTokens(n_val, *shape, "val")
    return Datasets(_cap(train, cfg.samples), _cap(val, cfg.val_samples), task)
