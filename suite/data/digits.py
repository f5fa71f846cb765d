"""scikit-learn's bundled handwritten digits: 1797 real 1x8x8 grey images of 10 classes, no download.

Small enough to learn in seconds on a CPU, so tests and time-to-accuracy demos use real data.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, TensorDataset

TRAIN_IMAGES = 1437  # the other 360 validate
SPLIT_SEED = 0  # one split for every run, so validation numbers compare across runs and seeds
MAX_PIXEL = 16.0  # load_digits' pixels are integers 0..16


def digits_splits() -> tuple[Dataset, Dataset]:
    """(train, val) of (float [1, 8, 8], int64 label), normalised with the training split's mean and std."""
    from sklearn.datasets import load_digits  # scikit-learn is slow to import; only this source needs it

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / MAX_PIXEL
    y = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train, val = order[:TRAIN_IMAGES], order[TRAIN_IMAGES:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])
