"""Deterministic synthetic datasets with the published shapes, learnable so that accuracy means something.

Each item is generated from a generator seeded by (seed, split, index), never from global RNG
state, so every rank and every run sees bit-identical data whatever order it reads it in, and
memory does not grow with the published size (ImageNet-shaped data is made per item).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

PROTOTYPE_SIDE = 8  # class prototypes are low-resolution, so a class is a smooth pattern at any image size
NOISE_STD = 1.0
SUCCESSORS = 4  # each token of the synthetic language can be followed by this many tokens


def item_generator(seed: int, split: str, index: int) -> torch.Generator:
    mixed = (seed * 1_000_003 + (0 if split == "train" else 1)) * 10_000_000_019 + index
    return torch.Generator().manual_seed(mixed % (1 << 63))


class SyntheticImages(Dataset):
    """Label = index mod classes; image = the class's upsampled prototype plus Gaussian noise."""

    def __init__(self, samples: int, classes: int, channels: int, image_size: int, seed: int, split: str) -> None:
        self.samples, self.classes, self.image_size, self.seed, self.split = samples, classes, image_size, seed, split
        self.prototypes = torch.randn(classes, channels, PROTOTYPE_SIDE, PROTOTYPE_SIDE,
                                      generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = index % self.classes
        prototype = F.interpolate(self.prototypes[label : label + 1], size=self.image_size, mode="bilinear",
                                  align_corners=False)[0]
        noise = torch.randn(prototype.shape, generator=item_generator(self.seed, self.split, index))
        return prototype + NOISE_STD * noise, torch.tensor(label)


class SyntheticTokens(Dataset):
    """Sequences of a fixed sparse Markov chain over the vocabulary; the target is the next token."""

    def __init__(self, samples: int, vocab_size: int, seq_len: int, seed: int, split: str) -> None:
        self.samples, self.vocab_size, self.seq_len, self.seed, self.split = samples, vocab_size, seq_len, seed, split
        table = torch.randint(vocab_size, (vocab_size, SUCCESSORS), generator=torch.Generator().manual_seed(seed))
        self.successors = table.numpy()

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = item_generator(self.seed, self.split, index)
        start = int(torch.randint(self.vocab_size, (1,), generator=g))
        choices = torch.randint(SUCCESSORS, (self.seq_len,), generator=g).numpy()
        tokens = np.empty(self.seq_len + 1, dtype=np.int64)
        tokens[0] = start
        for t, choice in enumerate(choices, 1):
            tokens[t] = self.successors[tokens[t - 1], choice]
        sequence = torch.from_numpy(tokens)
        return sequence[:-1], sequence[1:]
