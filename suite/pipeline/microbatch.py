"""How a pipeline's mini-batch is cut into micro-batches, with the two studies' rules as presets.

- `study_n`: Study N's torchgpipe rule: micro-batches = 4 x stages at a fixed micro-batch size
  (`micro_batch_size`, else the point's `batch_size`), so the mini-batch grows with the stages.
- `study_j`: Study J's table of GPipe mini-batches and micro-batch counts per dataset.
Without a preset the mini-batch is the point's `batch_size`, cut into `micro_batches` micro-batches,
or into micro-batches of `micro_batch_size`; with neither, into 4 x stages (Study N's count).
"""

from __future__ import annotations

from dataclasses import dataclass

from suite.errors import ConfigError

PRESETS = ("study_n", "study_j")
STUDY_J = {"mnist": (3072, 24), "cifar10": (2048, 32), "imagenet": (384, 12), "highres": (48, 12)}


@dataclass(frozen=True)
class MicroBatching:
    micro_batches: int
    micro_batch_size: int

    @property
    def mini_batch(self) -> int:
        return self.micro_batches * self.micro_batch_size


def micro_batching(preset: str | None, micro_batches: int | None, micro_batch_size: int | None,
                   batch_size: int, stages: int, dataset: str) -> MicroBatching:
    """The micro-batching of one pipeline; ConfigError (one line) when the batch does not split evenly."""
    for knob, value in (("micro_batches", micro_batches), ("micro_batch_size", micro_batch_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{knob} must be positive, got {value}")
    if preset == "study_n":
        if micro_batches is not None:
            raise ConfigError("preset study_n sets micro_batches to 4 x stages; leave micro_batches unset")
        return MicroBatching(4 * stages, micro_batch_size or batch_size)
    if preset == "study_j":
        if micro_batches is not None or micro_batch_size is not None:
            raise ConfigError("preset study_j takes the batch and micro-batches from Study J's table; "
                              "leave micro_batches and micro_batch_size unset")
        if dataset not in STUDY_J:
            raise ConfigError(f"preset study_j has no GPipe batch for dataset {dataset} "
                              f"(Study J's table covers {', '.join(STUDY_J)})")
        mini_batch, count = STUDY_J[dataset]
        return MicroBatching(count, mini_batch // count)
    if preset is not None:
        raise ConfigError(f"preset={preset} is not one of {', '.join(PRESETS)}")
    if micro_batches is not None and micro_batch_size is not None:
        return MicroBatching(micro_batches, micro_batch_size)
    if micro_batch_size is not None:
        if batch_size % micro_batch_size:
            works = _what_works("strategy.micro_batch_size", batch_size, micro_batch_size)
            raise ConfigError(f"batch_size={batch_size} does not split into micro-batches of strategy.micro_batch_size="
                              f"{micro_batch_size}: {works}")
        return MicroBatching(batch_size // micro_batch_size, micro_batch_size)
    count = micro_batches or 4 * stages
    if batch_size % count:
        given = (f"strategy.micro_batches={count}" if micro_batches else
                 f"the default {count} micro-batches (4 for each of the {stages} stages)")
        raise ConfigError(f"batch_size={batch_size} does not split into {given}: "
                          f"{_what_works('strategy.micro_batches', batch_size, count)}")
    return MicroBatching(count, batch_size // count)


def _what_works(knob: str, batch_size: int, value: int) -> str:
    """`set strategy.micro_batches to a divisor of 32 (8, 16, 32) or batch_size to a multiple of 12 (36)`."""
    divisors = [d for d in range(2, batch_size + 1) if batch_size % d == 0]
    near = sorted(divisors, key=lambda d: (abs(d - value), d))[:3]
    multiple = max(value, -(-batch_size // value) * value)
    return (f"set {knob} to a divisor of {batch_size} ({', '.join(map(str, sorted(near))) or 'none above 1'}) or "
            f"batch_size to a multiple of {value} ({multiple})")
