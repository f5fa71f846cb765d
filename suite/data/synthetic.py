"""Deterministic synthetic datasets with the published shapes, learnable so that accuracy means something.

Each item is generated from a generator seeded by (seed, split, index), never from global RNG
state, so every rank and every run sees bit-identical data whatever order it reads it in, and
memory does not grow with the published size (ImageNet-shaped data is made per item).

What a network can learn from them:
- images: every class is a fixed smooth pattern (a random 8x8 prototype per channel, upsampled)
  and each item adds independent Gaussian noise, so the best accuracy is close to 100%;
- tokens: sequences walk a fixed random Markov chain in which every token has SUCCESSORS equally
  likely successors, so the best achievable perplexity is at most SUCCESSORS (uniform guessing:
  vocab_size). Successors are drawn by Zipf's law, as words in text are, so a model first learns
  token frequencies (perplexity falls to hundreds within a few hundred steps), then the transitions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

PROTOTYPE_SIDE = 8  # class prototypes are low-resolution, so a class is a smooth pattern at any image size
NOISE_STD = 1.0
SUCCESSORS = 4
ZIPF_EXPONENT = 1.0  # token k is drawn as a successor with probability proportional to 1 / (k + 1)
SPLIT_IDS = {"train": 0, "val": 1}


def item_generator(seed: int, split: str, index: int) -> torch.Generator:
    """A generator for one item, its state a function of (seed, split, index) alone."""
    mixed = ((seed * 1_000_003 + SPLIT_IDS[split]) * 10_000_000_019 + index) % (1 << 63)
    return torch.Generator().manual_seed(mixed)


def bilinear_matrix(side_in: int, side_out: int) -> torch.Tensor:
    """[side_out, side_in] matrix M such that M @ P @ M.T is P bilinearly resized (align_corners=False).

    Resizing is separable and linear, so two small matrix products replace F.interpolate, which is
    several times slower per item at 224x224 and above.
    """
    identity = torch.eye(side_in).unsqueeze(0)
    return F.interpolate(identity, size=side_out, mode="linear", align_corners=False)[0].T.contiguous()


def _check_index(index: int, length: int) -> None:
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for a dataset of {length} items")


class SyntheticImages(Dataset):
    """Label = index mod classes; image = the class's upsampled prototype plus Gaussian noise."""

    def __init__(self, samples: int, classes: int, channels: int, image_size: int, seed: int, split: str) -> None:
        self.samples, self.classes, self.seed, self.split = samples, classes, seed, split
        # Seeded by `seed` alone: train and validation items share the class patterns.
        self.prototypes = torch.randn(classes, channels, PROTOTYPE_SIDE, PROTOTYPE_SIDE,
                                      generator=torch.Generator().manual_seed(seed))
        self.upsample = bilinear_matrix(PROTOTYPE_SIDE, image_size)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_index(index, self.samples)
        label = index % self.classes
        pattern = self.upsample @ self.prototypes[label] @ self.upsample.T
        noise = torch.randn(pattern.shape, generator=item_generator(self.seed, self.split, index))
        return pattern + NOISE_STD * noise, torch.tensor(label)


class SyntheticTokens(Dataset):
    """Walks of a fixed sparse Markov chain over the vocabulary; the target is the next token."""

    def __init__(self, samples: int, vocab_size: int, seq_len: int, seed: int, split: str) -> None:
        self.samples, self.vocab_size, self.seq_len, self.seed, self.split = samples, vocab_size, seq_len, seed, split
        zipf = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64) ** ZIPF_EXPONENT
        table = torch.multinomial(zipf, vocab_size * SUCCESSORS, replacement=True,
                                  generator=torch.Generator().manual_seed(seed))
        self.successors: list[int] = table.tolist()  # row-major [vocab_size, SUCCESSORS]; the walk is a Python loop

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_index(index, self.samples)
        g = item_generator(self.seed, self.split, index)
        token = int(torch.randint(self.vocab_size, (1,), generator=g))
        walk = [token]
        for choice in torch.randint(SUCCESSORS, (self.seq_len,), generator=g).tolist():
            token = self.successors[token * SUCCESSORS + choice]
            walk.append(token)
        sequence = torch.tensor(walk, dtype=torch.int64)
        return sequence[:-1], sequence[1:]
