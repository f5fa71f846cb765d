"""Datasets: synthetic determinism, shapes and learnability; digits; real readers on tiny fake files; checks."""

import math
import pickle
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from suite.config import DatasetConfig
from suite.data import build_datasets, check_dataset
from suite.data.synthetic import SUCCESSORS
from suite.errors import ConfigError
from suite.paths import CONF_DIR

SMALL_IMAGES = {"samples": 40, "val_samples": 20, "image_size": 16}


def dataset_conf(file: str, /, **overrides) -> DictConfig:
    """conf/dataset/<file>.yaml against the schema, as Hydra would compose it, with overrides."""
    raw = OmegaConf.load(CONF_DIR / "dataset" / f"{file}.yaml")
    raw.pop("defaults")
    return OmegaConf.merge(OmegaConf.structured(DatasetConfig), raw, overrides)


def items(dataset, indices) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [dataset[i] for i in indices]


def assert_same_items(a, b) -> None:
    assert len(a) == len(b)
    for (x1, y1), (x2, y2) in zip(a, b):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


# --- synthetic: determinism ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, overrides", [("cifar10", SMALL_IMAGES),
                                             ("tokens", {"samples": 6, "val_samples": 3, "seq_len": 32})])
def test_synthetic_items_are_a_function_of_seed_split_and_index(name, overrides):
    cfg = dataset_conf(name, **overrides)
    first = build_datasets(cfg, seed=3)
    indices = [0, 1, len(first.val) - 1]
    expected_train, expected_val = items(first.train, indices), items(first.val, indices)

    torch.manual_seed(1234)  # global RNG state must not matter, nor the order items are read in
    again = build_datasets(cfg, seed=3)
    assert_same_items(items(again.train, indices[::-1])[::-1], expected_train)
    assert_same_items(items(again.val, indices[::-1])[::-1], expected_val)

    other_seed = build_datasets(cfg, seed=4)
    assert not torch.equal(other_seed.train[0][0], expected_train[0][0])
    assert not torch.equal(first.val[0][0], expected_train[0][0])  # validation items are not training items


def test_synthetic_items_are_identical_in_dataloader_worker_processes():
    data = build_datasets(dataset_conf("mnist", **SMALL_IMAGES), seed=0)
    images, labels = next(iter(DataLoader(data.train, batch_size=8, num_workers=2)))
    direct = items(data.train, range(8))
    assert torch.equal(images, torch.stack([x for x, _ in direct]))
    assert torch.equal(labels, torch.stack([y for _, y in direct]))


# --- synthetic: shapes, sizes, speed --------------------------------------------------------------------------


@pytest.mark.parametrize("name, channels", [("mnist", 1), ("cifar10", 3), ("imagenet", 3), ("highres", 3)])
def test_synthetic_images_have_the_configured_shape(name, channels):
    cfg = dataset_conf(name, **SMALL_IMAGES)
    data = build_datasets(cfg, seed=0)
    assert data.task == "classification"
    assert (len(data.train), len(data.val)) == (40, 20)
    for image, label in items(data.train, [0, 39]) + items(data.val, [19]):
        assert image.shape == (channels, 16, 16) and image.dtype == torch.float32
        assert label.shape == () and label.dtype == torch.int64 and 0 <= label < cfg.num_classes
    with pytest.raises(IndexError):
        data.train[40]


def test_synthetic_imagenet_item_is_full_size():
    data = build_datasets(dataset_conf("imagenet", samples=64), seed=0)
    image, label = data.train[63]
    assert image.shape == (3, 224, 224) and image.dtype == torch.float32 and label == 63


@pytest.mark.parametrize("name, train, val", [
    ("mnist", 60_000, 10_000),
    ("cifar10", 50_000, 10_000),
    ("imagenet", 1_281_167, 50_000),
    ("highres", 50_000, 10_000),
    ("tokens", 103_227_021 // 1024, 217_646 // 1024),
])
def test_synthetic_datasets_default_to_the_published_sizes(name, train, val):
    data = build_datasets(dataset_conf(name), seed=0)  # lengths only: nothing is generated up front
    assert (len(data.train), len(data.val)) == (train, val)


def test_synthetic_tokens_are_next_token_pairs():
    data = build_datasets(dataset_conf("tokens", samples=4, val_samples=2, seq_len=64), seed=0)
    assert data.task == "language_model"
    for inputs, targets in items(data.train, range(4)) + items(data.val, range(2)):
        assert inputs.shape == targets.shape == (64,)
        assert inputs.dtype == targets.dtype == torch.int64
        assert torch.equal(inputs[1:], targets[:-1])
        assert 0 <= int(inputs.min()) and int(targets.max()) < 50257


# --- synthetic: learnability ----------------------------------------------------------------------------------


def test_synthetic_image_classes_are_separable_from_few_examples():
    data = build_datasets(dataset_conf("mnist", samples=100, val_samples=100), seed=0)
    images, labels = map(torch.stack, zip(*items(data.train, range(100))))
    class_means = torch.stack([images[labels == c].mean(0) for c in range(10)]).flatten(1)
    val_images, val_labels = map(torch.stack, zip(*items(data.val, range(100))))
    predicted = torch.cdist(val_images.flatten(1), class_means).argmin(1)
    assert (predicted == val_labels).float().mean() > 0.9  # chance is 0.1


def test_synthetic_tokens_follow_a_sparse_markov_chain_learnable_from_counts():
    vocab = 50
    data = build_datasets(dataset_conf("tokens", vocab_size=vocab, seq_len=32, samples=100, val_samples=20), seed=0)
    counts = torch.zeros(vocab, vocab)
    for inputs, targets in items(data.train, range(100)):
        counts.index_put_((inputs, targets), torch.ones(len(inputs)), accumulate=True)
    assert int((counts > 0).sum(1).max()) <= SUCCESSORS  # every token has at most SUCCESSORS successors
    assert counts[:, :10].sum() > 0.5 * counts.sum()  # Zipfian: a fifth of the vocabulary makes most of the text

    correct = total = 0
    for inputs, targets in items(data.val, range(20)):
        correct += int((counts[inputs].argmax(1) == targets).sum())
        total += len(targets)
    assert correct / total > 0.2  # a bigram table from the training split; chance is 1/50


def train_one_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, dataset) -> None:
    for inputs, targets in DataLoader(dataset, batch_size=32, shuffle=True):
        optimizer.zero_grad()
        F.cross_entropy(model(inputs).flatten(0, -2), targets.flatten()).backward()
        optimizer.step()


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    return float((model(images).argmax(1) == labels).float().mean())


@torch.no_grad()
def perplexity(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    return math.exp(F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()))


def test_gradient_descent_on_synthetic_images_beats_chance_within_an_epoch():
    data = build_datasets(dataset_conf("cifar10", samples=256, val_samples=100, image_size=8), seed=0)
    val_images, val_labels = next(iter(DataLoader(data.val, batch_size=100)))
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    before = accuracy(linear, val_images, val_labels)
    train_one_epoch(linear, torch.optim.SGD(linear.parameters(), lr=0.05), data.train)
    assert before < 0.5 and accuracy(linear, val_images, val_labels) > 0.9  # chance is 0.1


def test_gradient_descent_on_synthetic_tokens_lowers_perplexity_towards_the_successor_count():
    vocab = 64
    data = build_datasets(dataset_conf("tokens", vocab_size=vocab, seq_len=32, samples=256, val_samples=32), seed=0)
    val_inputs, val_targets = next(iter(DataLoader(data.val, batch_size=32)))
    torch.manual_seed(0)
    bigram = nn.Embedding(vocab, vocab)  # logits of the next token given the current one
    before = perplexity(bigram, val_inputs, val_targets)
    optimizer = torch.optim.Adam(bigram.parameters(), lr=0.1)
    for _ in range(3):
        train_one_epoch(bigram, optimizer, data.train)
    assert before > vocab / 2 and perplexity(bigram, val_inputs, val_targets) < 3 * SUCCESSORS


# --- digits ---------------------------------------------------------------------------------------------------


def test_digits_are_a_fixed_normalised_split_of_the_1797_images():
    data = build_datasets(dataset_conf("digits"), seed=0)
    assert (len(data.train), len(data.val)) == (1437, 360)
    images, labels = data.train.tensors
    assert images.shape == (1437, 1, 8, 8) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert abs(float(images.mean())) < 1e-4 and abs(float(images.std()) - 1) < 1e-4
    assert set(data.val.tensors[1].tolist()) == set(range(10))
    other_seed = build_datasets(dataset_conf("digits"), seed=5)  # the run seed does not move the split
    assert torch.equal(other_seed.val.tensors[0], data.val.tensors[0])


def test_digits_are_scikit_learns_read_without_importing_it():
    """Every rank of a digits point reads them: scikit-learn's import (1.6 s of CPU) is not part of that."""
    import subprocess
    import sys

    probe = ("import sys; from suite.data.digits import load_digits; images, labels = load_digits(); "
             "print(images.shape, labels.shape, 'sklearn' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout == "(1797, 64) (1797,) False\n", result.stdout + result.stderr
    from sklearn.datasets import load_digits as scikit_learns

    from suite.data.digits import load_digits

    for ours, theirs in zip(load_digits(), scikit_learns(return_X_y=True)):
        assert np.array_equal(ours, theirs) and ours.dtype == theirs.dtype


def test_digits_samples_cap_both_splits():
    data = build_datasets(dataset_conf("digits", samples=100, val_samples=30), seed=0)
    assert (len(data.train), len(data.val)) == (100, 30)
    image, label = data.val[29]
    assert image.shape == (1, 8, 8) and label.dtype == torch.int64


# --- real datasets from tiny fake files in the official formats -----------------------------------------------


def write_idx(path, magic: int, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack(f">{1 + array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes())


def fake_mnist(root, train: int = 12, val: int = 5) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("t10k", val)):
        write_idx(root / f"MNIST/raw/{split}-images-idx3-ubyte", 2051, rng.integers(0, 256, (n, 28, 28)))
        write_idx(root / f"MNIST/raw/{split}-labels-idx1-ubyte", 2049, np.arange(n) % 10)


def fake_cifar(root, per_batch: int = 4) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": [i % 10 for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch))


def fake_imagenet(root, classes=("n01", "n02"), per_class: int = 2) -> None:
    for split in ("train", "val"):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                colour = (255 * c, 40 * i, 128)
                Image.new("RGB", (40, 30), colour).save(root / split / name / f"{i}.png")


def fake_token_bins(root, train: int = 101, val: int = 25) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (np.arange(train) % 50257).astype(np.uint16).tofile(root / "train.bin")
    (np.arange(val) + 1000).astype(np.uint16).tofile(root / "val.bin")


def test_real_mnist_reads_torchvision_idx_files(tmp_path):
    fake_mnist(tmp_path)
    data = build_datasets(dataset_conf("mnist", source="real", path=str(tmp_path)), seed=0)
    assert (len(data.train), len(data.val)) == (12, 5)
    image, label = data.train[11]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and int(label) == 1
    small = build_datasets(dataset_conf("mnist", source="real", path=str(tmp_path), image_size=14, samples=4), 0)
    assert len(small.train) == 4 and small.train[0][0].shape == (1, 14, 14)


def test_real_cifar10_reads_the_python_pickles(tmp_path):
    fake_cifar(tmp_path)
    data = build_datasets(dataset_conf("cifar10", source="real", path=str(tmp_path)), seed=0)
    assert (len(data.train), len(data.val)) == (20, 4)
    image, label = data.train[5]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and int(label) == 1
    assert -3 < float(image.min()) < 0 < float(image.max()) < 3  # normalised with CIFAR-10's mean and std


def test_real_imagenet_reads_an_image_folder_at_the_configured_size(tmp_path):
    fake_imagenet(tmp_path)
    cfg = dataset_conf("imagenet", source="real", path=str(tmp_path), image_size=16, num_classes=2)
    data = build_datasets(cfg, seed=0)
    assert (len(data.train), len(data.val)) == (4, 4)
    for image, _ in items(data.train, range(4)) + items(data.val, range(4)):
        assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert [int(label) for _, label in items(data.val, range(4))] == [0, 0, 1, 1]
    red = data.val[2][0]  # class n02 is red: after normalisation its red channel is the largest
    assert float(red[0].mean()) > float(red[2].mean())


def test_real_wikitext_reads_non_overlapping_windows_of_token_ids(tmp_path):
    fake_token_bins(tmp_path)
    cfg = dataset_conf("wikitext103", path=str(tmp_path), seq_len=10)
    data = build_datasets(cfg, seed=0)
    assert data.task == "language_model"
    assert (len(data.train), len(data.val)) == (10, 2)  # (101 - 1) // 10 and (25 - 1) // 10
    inputs, targets = data.train[3]
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.tolist() == list(range(30, 40)) and targets.tolist() == list(range(31, 41))
    assert data.val[1][1].tolist() == list(range(1011, 1021))
    copy = pickle.loads(pickle.dumps(data.train))  # as sent to a spawned worker: maps the file again
    assert torch.equal(copy[9][1], data.train[9][1])
    capped = build_datasets(dataset_conf("wikitext103", path=str(tmp_path), seq_len=10, samples=3), seed=0)
    assert len(capped.train) == 3


# --- checks before launch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mnist", "cifar10", "imagenet", "highres", "tokens", "digits"])
def test_the_shipped_dataset_configs_pass_the_check(name):
    check_dataset(dataset_conf(name))


@pytest.mark.parametrize("name, overrides, message", [
    ("mnist", {"name": "svhn"}, "dataset.name=svhn is not one of"),
    ("mnist", {"kind": "audio"}, "dataset.kind=audio is not one of"),
    ("mnist", {"source": "web"}, "dataset.source=web is not one of"),
    ("mnist", {"kind": "tokens"}, "dataset mnist is image data"),
    ("highres", {"source": "real", "path": "/data"}, "comes from dataset.source=synthetic"),
    ("tokens", {"source": "real"}, "comes from dataset.source=synthetic"),
    ("cifar10", {"samples": 0}, "dataset.samples=0 must be positive"),
    ("cifar10", {"val_samples": -3}, "dataset.val_samples=-3 must be positive"),
    ("cifar10", {"loader_workers": -1}, "dataset.loader_workers=-1"),
    ("imagenet", {"image_size": 0}, "dataset.image_size must be positive"),
    ("imagenet", {"num_classes": 0}, "dataset.num_classes must be positive"),
    ("mnist", {"channels": -1}, "dataset.channels must be positive"),
    ("tokens", {"vocab_size": 0}, "dataset.vocab_size must be positive"),
    ("tokens", {"seq_len": 0}, "dataset.seq_len must be positive"),
    ("digits", {"image_size": 28}, "dataset.image_size must be 8"),
    ("digits", {"channels": 3}, "dataset.channels must be 1"),
    ("wikitext103", {}, "set dataset.path="),
    ("mnist", {"source": "real", "path": "/no/such/dir"}, "dataset.path=/no/such/dir is not a directory"),
])
def test_check_dataset_rejects_bad_configs_in_one_line(name, overrides, message):
    with pytest.raises(ConfigError) as error:
        check_dataset(dataset_conf(name, **overrides))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_check_dataset_reads_plain_dataclasses_too():
    cfg = DatasetConfig(name="cifar10", kind="image", num_classes=10, channels=3, image_size=8, samples=0)
    with pytest.raises(ConfigError, match="samples=0"):
        check_dataset(cfg)
    cfg.samples = 4
    assert len(build_datasets(cfg, seed=0).train) == 4


def test_check_dataset_names_the_missing_real_file(tmp_path):
    fake_mnist(tmp_path)
    (tmp_path / "MNIST/raw/t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match="t10k-labels-idx1-ubyte does not exist"):
        check_dataset(dataset_conf("mnist", source="real", path=str(tmp_path)))
    fake_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py/test_batch").unlink()
    with pytest.raises(ConfigError, match="cifar-10-batches-py/test_batch does not exist"):
        check_dataset(dataset_conf("cifar10", source="real", path=str(tmp_path)))
    with pytest.raises(ConfigError, match="train.bin does not exist"):
        check_dataset(dataset_conf("wikitext103", path=str(tmp_path)))


def test_real_files_of_garbage_under_the_right_names_are_one_line_before_launch(tmp_path):
    """Hostile inputs 3, case 5: random bytes named as MNIST's IDX files or as token ids failed at run time with an
    AssertionError or an IndexError; their headers and token ids are checked against what the format says."""
    fake_mnist(tmp_path)
    check_dataset(dataset_conf("mnist", source="real", path=str(tmp_path)))
    rng = np.random.default_rng(0)
    images = tmp_path / "MNIST/raw/train-images-idx3-ubyte"
    images.write_bytes(rng.integers(0, 256, 12 * 784 + 16, dtype=np.uint8).tobytes())
    with pytest.raises(ConfigError, match=r"train-images-idx3-ubyte is not an MNIST IDX file of images"):
        check_dataset(dataset_conf("mnist", source="real", path=str(tmp_path)))
    fake_mnist(tmp_path)
    labels = tmp_path / "MNIST/raw/t10k-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-1])  # one label short of its header's count
    with pytest.raises(ConfigError, match=r"t10k-labels-idx1-ubyte is not an MNIST IDX file of labels"):
        check_dataset(dataset_conf("mnist", source="real", path=str(tmp_path)))
    fake_token_bins(tmp_path)
    check_dataset(dataset_conf("wikitext103", path=str(tmp_path), seq_len=10))
    rng.integers(0, 2**16, 200, dtype=np.uint16).tofile(tmp_path / "val.bin")
    with pytest.raises(ConfigError, match=r"val.bin holds token id \d+, beyond the vocabulary of 50257"):
        check_dataset(dataset_conf("wikitext103", path=str(tmp_path), seq_len=10))


def test_check_dataset_rejects_real_data_that_does_not_fit_the_config(tmp_path):
    fake_mnist(tmp_path)
    with pytest.raises(ConfigError, match="1-channel images, not channels=3"):
        check_dataset(dataset_conf("mnist", source="real", path=str(tmp_path), channels=3))
    fake_token_bins(tmp_path)
    with pytest.raises(ConfigError, match=r"val.bin holds fewer than seq_len\+1 = 31 tokens"):
        check_dataset(dataset_conf("wikitext103", path=str(tmp_path), seq_len=30))
    fake_imagenet(tmp_path / "in", classes=("n01", "n02", "n03"))
    with pytest.raises(ConfigError, match="holds 3 classes, more than num_classes=2"):
        check_dataset(dataset_conf("imagenet", source="real", path=str(tmp_path / "in"), num_classes=2))
    for image in (tmp_path / "in/val/n03").iterdir():
        image.unlink()
    (tmp_path / "in/val/n03").rmdir()
    with pytest.raises(ConfigError, match="class folder n03 is in only one of"):
        check_dataset(dataset_conf("imagenet", source="real", path=str(tmp_path / "in")))
