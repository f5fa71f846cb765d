"""Real datasets read from a user-given path (`dataset.path`). Nothing is downloaded.

Expected layouts under the path:
- mnist:       MNIST/raw/{train,t10k}-images-idx3-ubyte and MNIST/raw/{train,t10k}-labels-idx1-ubyte
               (torchvision's MNIST layout: the official files, gunzipped)
- cifar10:     cifar-10-batches-py/data_batch_1..5 and cifar-10-batches-py/test_batch
               (the python pickles of the official cifar-10-python.tar.gz, unpacked)
- imagenet:    train/<class>/<image> and val/<class>/<image> (ImageFolder layout; the validation
               images sorted into one folder per class, with the same class folder names as train/)
- wikitext103: train.bin and val.bin: GPT-2 token ids as uint16, the format of nanoGPT's prepare.py
               scripts. To make them from wikitext-103-raw-v1 (wiki.train.raw, wiki.valid.raw):
                   import numpy as np, tiktoken
                   enc = tiktoken.get_encoding("gpt2")
                   for split, raw in (("train", "wiki.train.raw"), ("val", "wiki.valid.raw")):
                       ids = enc.encode_ordinary(open(raw, encoding="utf-8").read())
                       np.array(ids, dtype=np.uint16).tofile(f"{split}.bin")
               Sample i is tokens [i*seq_len, (i+1)*seq_len]: the input is its first seq_len tokens,
               the target its last seq_len (windows do not overlap, except that one window's last
               target is the next window's first input).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset

from suite.errors import ConfigError

if TYPE_CHECKING:  # torchvision is imported where data is read, not checked (see suite.models.vision)
    from torchvision import transforms

MNIST_FILES = [f"MNIST/raw/{split}-{kind}" for split in ("train", "t10k")
               for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")]
CIFAR_TRAIN = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)]
CIFAR_VAL = ["cifar-10-batches-py/test_batch"]
REQUIRED_FILES = {
    "mnist": MNIST_FILES,
    "cifar10": CIFAR_TRAIN + CIFAR_VAL,
    "imagenet": ["train", "val"],
    "wikitext103": ["train.bin", "val.bin"],
}
IMAGE_SHAPES = {"mnist": (1, 10), "cifar10": (3, 10), "imagenet": (3, None)}  # channels, classes (None: folders)
MEAN_STD = {
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
TOKEN_DTYPE = np.uint16


def class_folders(split_dir: Path) -> list[str]:
    """Class names as ImageFolder finds them: the sorted sub-directory names."""
    return sorted(entry.name for entry in split_dir.iterdir() if entry.is_dir())


def _token_count(file: Path) -> int:
    return file.stat().st_size // np.dtype(TOKEN_DTYPE).itemsize


def check_real(cfg) -> None:
    """Raise ConfigError (one line) unless `cfg.path` holds the files `cfg.name` is read from."""
    if cfg.path is None:
        raise ConfigError(f"dataset {cfg.name} is real data: set dataset.path=/path/to/{cfg.name} (no downloads)")
    root = Path(cfg.path)
    if not root.is_dir():
        raise ConfigError(f"dataset {cfg.name}: dataset.path={root} is not a directory")
    for file in REQUIRED_FILES[cfg.name]:
        if not (root / file).exists():
            raise ConfigError(f"dataset {cfg.name}: {root / file} does not exist (layout: see suite/data/real.py)")
    if cfg.kind == "tokens":
        _check_token_files(cfg, root)
    else:
        _check_images(cfg, root)


def _check_token_files(cfg, root: Path) -> None:
    for file in REQUIRED_FILES[cfg.name]:
        if _token_count(root / file) <= cfg.seq_len:
            raise ConfigError(f"dataset {cfg.name}: {root / file} holds fewer than seq_len+1 = {cfg.seq_len + 1} "
                              "tokens")
        largest = int(np.memmap(root / file, dtype=TOKEN_DTYPE, mode="r").max())  # a pass over the file: ~0.1 s/GB
        if largest >= cfg.vocab_size:
            raise ConfigError(f"dataset {cfg.name}: {root / file} holds token id {largest}, beyond the vocabulary of "
                              f"{cfg.vocab_size} (not {TOKEN_DTYPE.__name__} token ids of GPT-2's tokenizer?)")


# The IDX files' magic numbers (big-endian: 0, 0, the type 0x08 for unsigned bytes, the number of dimensions) and the
# sizes of an image, by yann.lecun.com/exdb/mnist's description of the format.
IDX_MAGIC = {"images-idx3-ubyte": 0x0803, "labels-idx1-ubyte": 0x0801}
MNIST_IMAGE = (28, 28)


def _check_mnist(root: Path) -> None:
    for name in MNIST_FILES:
        file, kind = root / name, name.split("-", 1)[1]
        images = kind.startswith("images")
        header = np.fromfile(file, dtype=">u4", count=4 if images else 2)  # magic, count[, rows, columns]
        item = int(np.prod(MNIST_IMAGE)) if images else 1
        if (len(header) < (4 if images else 2) or header[0] != IDX_MAGIC[kind]
                or (images and tuple(header[2:]) != MNIST_IMAGE)
                or file.stat().st_size != 4 * len(header) + int(header[1]) * item):
            raise ConfigError(f"dataset mnist: {file} is not an MNIST IDX file of {kind.split('-')[0]} (its header or "
                              "size is wrong: the official files, gunzipped)")


def _check_images(cfg, root: Path) -> None:
    if cfg.name == "mnist":
        _check_mnist(root)
    channels, classes = IMAGE_SHAPES[cfg.name]
    if cfg.channels != channels:
        raise ConfigError(f"dataset {cfg.name} has {channels}-channel images, not channels={cfg.channels}")
    if classes is not None and cfg.num_classes != classes:
        raise ConfigError(f"dataset {cfg.name} has {classes} classes, not num_classes={cfg.num_classes}")
    if cfg.name == "imagenet":
        train, val = class_folders(root / "train"), class_folders(root / "val")
        if not train:
            raise ConfigError(f"dataset imagenet: {root / 'train'} holds no class folders")
        unmatched = sorted(set(train) ^ set(val))  # ImageFolder numbers classes per split: they must agree
        if unmatched:
            raise ConfigError(f"dataset imagenet: class folder {unmatched[0]} is in only one of "
                              f"{root / 'train'} and {root / 'val'}")
        if len(train) > cfg.num_classes:
            raise ConfigError(f"dataset imagenet: {root / 'train'} holds {len(train)} classes, more than "
                              f"num_classes={cfg.num_classes}")


class CifarBatches(Dataset):
    """CIFAR-10's python pickles (torchvision's reader insists on the official md5 sums)."""

    def __init__(self, files: list[Path], transform: transforms.Compose) -> None:
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


class TokenWindows(Dataset):
    """Windows of seq_len + 1 tokens from a uint16 token file, memory-mapped."""

    def __init__(self, file: Path, seq_len: int) -> None:
        self.file, self.seq_len = file, seq_len
        self.windows = (_token_count(file) - 1) // seq_len
        self._tokens: np.memmap | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}  # a pickled copy (spawned DataLoader workers) maps the file anew

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.windows:
            raise IndexError(f"window {index} out of range for {self.windows} windows of {self.file}")
        if self._tokens is None:  # mapped on first use, by each process that reads
            self._tokens = np.memmap(self.file, dtype=TOKEN_DTYPE, mode="r")
        start = index * self.seq_len
        window = torch.from_numpy(self._tokens[start : start + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


def _imagenet(root: Path, image_size: int, normalize: transforms.Normalize) -> tuple[Dataset, Dataset]:
    from torchvision import datasets, transforms

    train = transforms.Compose([transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(),
                                transforms.ToTensor(), normalize])
    val = transforms.Compose([transforms.Resize(image_size * 256 // 224), transforms.CenterCrop(image_size),
                              transforms.ToTensor(), normalize])
    return datasets.ImageFolder(root / "train", train), datasets.ImageFolder(root / "val", val)


def _mnist(root: Path, image_size: int, normalize: transforms.Normalize) -> tuple[Dataset, Dataset]:
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Resize(image_size, antialias=True), normalize])
    return (datasets.MNIST(root, train=True, transform=transform, download=False),
            datasets.MNIST(root, train=False, transform=transform, download=False))


def _cifar10(root: Path, image_size: int, normalize: transforms.Normalize) -> tuple[Dataset, Dataset]:
    from torchvision import transforms

    transform = transforms.Compose([transforms.Resize(image_size, antialias=True), normalize])
    return (CifarBatches([root / f for f in CIFAR_TRAIN], transform),
            CifarBatches([root / f for f in CIFAR_VAL], transform))


IMAGE_READERS = {"mnist": _mnist, "cifar10": _cifar10, "imagenet": _imagenet}


def real_splits(cfg) -> tuple[Dataset, Dataset]:
    """(train, val) of the real dataset `cfg.name` under `cfg.path`, at the configured image size."""
    from torchvision import transforms

    root = Path(cfg.path)
    if cfg.kind == "tokens":
        return TokenWindows(root / "train.bin", cfg.seq_len), TokenWindows(root / "val.bin", cfg.seq_len)
    return IMAGE_READERS[cfg.name](root, cfg.image_size, transforms.Normalize(*MEAN_STD[cfg.name]))
