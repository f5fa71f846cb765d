"""scikit-learn's bundled handwritten digits: 1797 real 1x8x8 grey images of 10 classes, no download.

Small enough to learn in seconds on a CPU, so tests and time-to-accuracy demos use real data.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

TRAIN_IMAGES = 1437  # the other 360 validate
SPLIT_SEED = 0  # one split for every run, so validation numbers compare across runs and seeds
MAX_PIXEL = 16.0  # load_digits' pixels are integers 0..16


def digits_file() -> Path:
    """scikit-learn's bundled copy of the digits (what `load_digits` reads), found without importing scikit-learn:
    its import takes 1.6 s of CPU, in every rank of a digits point."""
    (package,) = importlib.util.find_spec("sklearn").submodule_search_locations
    return Path(package) / "datasets" / "data" / "digits.csv.gz"


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images [1797, 64], labels [1797]) as scikit-learn's `load_digits(return_X_y=True)` gives them: a row per
    image, its 64 pixels then its label."""
    with gzip.open(digits_file(), mode="rt", encoding="utf-8") as rows:
        data = np.loadtxt(rows, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def digits_splits() -> tuple[Dataset, Dataset]:
    """(train, val) of (float [1, 8, 8], int64 label), normalised with the training split's mean and std."""
    images, labels = load_digits()
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / MAX_PIXEL
    y = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train, val = order[:TRAIN_IMAGES], order[TRAIN_IMAGES:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])
