"""Real datasets read from a user-given path. Nothing is downloaded.

Expected layouts under `dataset.path`:
- mnist:       MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte (torchvision's MNIST layout)
- cifar10:     cifar-10-batches-py/data_batch_1..5 and test_batch (the python pickles of the official archive)
- imagenet:    train/<class>/<image> and val/<class>/<image> (ImageFolder layout)
- wikitext103: train.bin and val.bin: GPT-2 token ids as uint16, the format of nanoGPT's
               data/openwebtext/prepare.py (encode wiki.train.tokens / wiki.valid.tokens with
               tiktoken's "gpt2" encoding and write `np.array(ids, dtype=np.uint16).tofile(...)`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import datasets, transforms

MNIST_FILES = [f"MNIST/raw/{p}-{k}" for p in ("train", "t10k") for k in ("images-idx3-ubyte", "labels-idx1-ubyte")]
CIFAR_FILES = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + ["cifar-10-batches-py/test_batch"]
REQUIRED = {
    "mnist": MNIST_FILES,
    "cifar10": CIFAR_FILES,
    "imagenet": ["train", "val"],
    "wikitext103": ["train.bin", "val.bin"],
}
MEAN_STD = {
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


def missing_files(name: str, path: Path) -> list[str]:
    return [f for f in REQUIRED[name] if not (path / f).exists()]


class CifarBatches(Dataset):
    """CIFAR-10's python pickles (torchvision's reader insists on the official md5 sums)."""

    def __init__(self, files: list[Path], transform) -> None:
        data, labels = [], []
        for file in files:
            with file.open("rb") as f:
                batch = pickle.load(f, encoding="bytes")
            data.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(batch[b"labels"])
        self.images = torch.from_numpy(np.concatenate(data))
        self.labels = torch.tensor(labels, dtype=torch.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.images[index].float() / 255), self.labels[index]


class TokenBins(Dataset):
    """Non-overlapping windows of seq_len + 1 tokens from a uint16 token file (memory-mapped)."""

    def __init__(self, file: Path, seq_len: int) -> None:
        self.tokens = np.memmap(file, dtype=np.uint16, mode="r")
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.seq_len
        window = torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


def real_splits(cfg) -> tuple[Dataset, Dataset]:
    path = Path(cfg.path)
    if cfg.name == "wikitext103":
        return TokenBins(path / "train.bin", cfg.seq_len), TokenBins(path / "val.bin", cfg.seq_len)
    normalize = transforms.Normalize(*MEAN_STD[cfg.name])
    if cfg.name == "imagenet":
        train = transforms.Compose([transforms.RandomResizedCrop(cfg.image_size), transforms.RandomHorizontalFlip(),
                                    transforms.ToTensor(), normalize])
        val = transforms.Compose([transforms.Resize(cfg.image_size * 256 // 224), transforms.CenterCrop(cfg.image_size),
                                  transforms.ToTensor(), normalize])
        return datasets.ImageFolder(path / "train", train), datasets.ImageFolder(path / "val", val)
    resize = transforms.Resize(cfg.image_size, antialias=True)
    if cfg.name == "mnist":
        transform = transforms.Compose([transforms.ToTensor(), resize, normalize])
        return (datasets.MNIST(path, train=True, transform=transform, download=False),
                datasets.MNIST(path, train=False, transform=transform, download=False))
    transform = transforms.Compose([resize, normalize])
    batches = path / "cifar-10-batches-py"
    return (CifarBatches([batches / f"data_batch_{i}" for i in range(1, 6)], transform),
            CifarBatches([batches / "test_batch"], transform))
