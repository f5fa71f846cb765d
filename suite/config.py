"""Typed schema of one grid point.

Hydra composes `conf/` against these dataclasses, so a misspelt key or a value of the
wrong type is a composition error instead of being silently ignored. Strategy knobs differ
per strategy; they are checked by instantiating the strategy class (see `suite.strategies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class DatasetConfig:
    name: str = MISSING  # mnist | cifar10 | imagenet | highres | digits | tokens | wikitext103
    kind: str = MISSING  # image | tokens
    source: str = "synthetic"  # synthetic | real | digits
    path: Optional[str] = None  # root of the real dataset (source=real)
    samples: Optional[int] = None  # training samples (images) or sequences (tokens); None = published size
    val_samples: Optional[int] = None
    num_classes: int = 0  # images
    channels: int = 0  # images
    image_size: int = 0  # images: side of the square input fed to the network
    vocab_size: int = 0  # tokens
    seq_len: int = 0  # tokens: context length of one sample
    loader_workers: int = 0  # DataLoader worker processes per rank


@dataclass
class NetworkConfig:
    name: str = MISSING  # the config's name, e.g. resnet18 or gpt2_tiny
    arch: str = MISSING  # resnet18 | resnet50 | resnet152 | vgg11 | vgg16 | mobilenet_v2 | gpt2
    width: float = 1.0  # channel multiplier (vgg, mobilenet_v2) for small test variants
    dropout: float = 0.0
    n_layer: int = 0  # gpt2
    n_head: int = 0  # gpt2
    n_embd: int = 0  # gpt2


@dataclass
class OptimizerConfig:
    name: str = "sgd"  # sgd | adamw
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4


@dataclass
class TargetConfig:
    """Time-to-accuracy: the first epoch whose validation metric reaches `value`."""

    metric: Optional[str] = None  # val_accuracy (higher is better) | val_perplexity (lower); None = the task's
    value: Optional[float] = None


@dataclass
class FaultConfig:
    """Fault injection for testing how failures are recorded: kind error | oom | hang | exit."""

    kind: Optional[str] = None
    step: int = 1  # global training step (warm-up included) at which it fires
    rank: int = 0


@dataclass
class ClusterConfig:
    name: str = MISSING
    scheduler: str = "local"  # local (torchrun on this machine)
    workers_per_node: int = 1  # GPUs per node, or CPU worker processes per node
    threads_per_worker: Optional[int] = None  # CPU intra-op threads per rank; None = cores / local ranks
    device: str = "auto"  # auto | cpu | cuda


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # None = $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db
    experiment: str = "adhoc"


@dataclass
class PointConfig:
    dataset: DatasetConfig = MISSING
    network: NetworkConfig = MISSING
    strategy: Any = MISSING  # {_target_: suite.strategies.<module>.<Class>, knobs...}
    cluster: ClusterConfig = MISSING
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)

    workers: int = 1  # ranks (one per GPU, or CPU processes)
    nodes: Optional[int] = None  # None = ceil(workers / cluster.workers_per_node)
    batch_size: int = 32  # per worker; the strategy's batch rule turns it into the global batch
    epochs: int = 3
    steps_per_epoch: Optional[int] = None  # None = one full pass over the training set
    warmup_steps: int = 2  # untimed training steps before the first epoch
    eval_batches: Optional[int] = None  # None = the whole validation set
    precision: str = "fp32"  # fp32 | bf16 | fp16
    seed: int = 0
    timeout_s: int = 1800  # the driver kills a point that runs longer and records `timeout`
    log_every: int = 10  # progress line every N steps
    save_final_weights: bool = False  # rank 0 writes the full state dict (used by equivalence tests)


def register_schema() -> None:
    cs = ConfigStore.instance()
    cs.store(name="point_schema", node=PointConfig)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConfig)
    cs.store(group="network", name="network_schema", node=NetworkConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
