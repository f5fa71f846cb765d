"""The interface every strategy implements, with the data-parallel defaults most of them share.

A strategy decides four things and nothing else: how the global batch follows from the per-worker
batch and the worker count, which shard of the data a rank reads, how the plain model is wrapped
or split across ranks, and how one training step runs on the wrapped model. The training loop
(`suite.trainer`) is the same for all of them; the hooks with defaults here (`processes`,
`forward`, `finish_epoch`, `summary_metrics`) are where pipelines differ from data parallelism.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from suite.dist import DistEnv
from suite.memory import local_tensor, tensor_mb
from suite.optim import OPTIMIZERS, build_optimizer
from suite.precision import PRECISIONS, Precision
from suite.timing import PhaseTimer

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Strategy:
    name: str

    # What starts the point's ranks: None for the cluster's own launcher (the local one here, srun, jsrun or
    # mpiexec on a batch cluster), "horovodrun" for strategies whose library brings its own.
    rank_launcher: ClassVar[str | None] = None
    # Which values of the cross-strategy knobs this strategy applies (the rest is rejected before launch).
    precisions: ClassVar[tuple[str, ...]] = PRECISIONS
    optimizers: ClassVar[tuple[str, ...]] = OPTIMIZERS
    checkpoints_activations: ClassVar[bool] = True  # activation_checkpointing, applied to the plain model
    grad_compressions: ClassVar[tuple[str, ...]] = ("none",)
    # True where all its communication goes through torch.distributed process groups, so that suite.comm's
    # count (`comm_mb_per_step`) is the whole of it; a strategy that communicates otherwise reports none.
    counts_communication: ClassVar[bool] = False

    def knobs(self) -> dict[str, Any]:
        """The strategy's own settings, recorded as run params."""
        return {k: v for k, v in asdict(self).items() if k != "name"}

    # Before launch, in the driver: raise ConfigError for a point this strategy cannot run.
    def check(self, cfg) -> None:
        pass

    def global_batch_size(self, cfg) -> int:
        """Data-parallel rule (Studies N and J): the batch per worker is fixed."""
        return cfg.batch_size * cfg.workers

    def processes(self, cfg) -> int:
        """How many processes the launcher starts (one per worker, unless one process drives several devices)."""
        return cfg.workers

    def derived_params(self, cfg) -> dict[str, Any]:
        """Settings the strategy derives from the config (e.g. micro-batches), recorded as run params."""
        return {}

    def config_files(self, cfg) -> dict[str, dict[str, Any]]:
        """Configuration the strategy generates for its library (file name -> JSON content), written into
        the point directory before launch and recorded with the run (e.g. DeepSpeed's ds_config.json)."""
        return {}

    def data_shards(self, cfg) -> int:
        """How many shards the training data is split into (before launch; see `data_shard`)."""
        return cfg.workers

    # In each worker.
    def data_shard(self, env: DistEnv) -> tuple[int, int]:
        """(index, count) of the data shard this rank reads; each data-parallel replica reads its own."""
        return env.rank, env.world_size

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        """Wrap or split the host-built model; move what this rank holds to its device."""
        return model.to(env.device)

    def checkpoint_fn(self) -> Callable | None:
        """The function that runs a checkpointed block (None: torch.utils.checkpoint; see
        suite.activation_checkpointing)."""
        return None

    def build_optimizer(self, model: nn.Module, cfg) -> torch.optim.Optimizer:
        return build_optimizer(model.parameters(), cfg)

    def train_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        loss_fn: LossFn,
        precision: Precision,
        timer: PhaseTimer,
    ) -> torch.Tensor:
        """One optimisation step on this rank's part of the global batch; returns the local loss."""
        with timer.phase("forward"), precision.autocast():
            loss = loss_fn(model(inputs), targets)
        with timer.phase("backward"):
            precision.backward(loss)
            self.reduce_gradients(model, optimizer)
        self.note_gradients(model)
        with timer.phase("optimizer"):
            self.optimizer_step(optimizer, precision)
        return loss.detach()

    def reduce_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Gradient communication the wrapped model does not do itself (after backward, before the step)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Precision) -> None:
        """Update the weights from the reduced gradients and free the gradients."""
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    def held_parameters(self, model: nn.Module) -> list[torch.Tensor]:
        """The parameter storage this rank holds (its shards, where parameters are sharded)."""
        return [local_tensor(p) for p in self.unwrap(model).parameters()]

    def held_gradients(self, model: nn.Module) -> list[torch.Tensor]:
        """The gradient storage this rank holds after backward (its shards, where gradients are sharded)."""
        return [local_tensor(p.grad) for p in self.unwrap(model).parameters() if p.grad is not None]

    def held_optimizer_state(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """The optimizer's state tensors on this rank (momenta; Adam's first and second moments)."""
        return [local_tensor(t) for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]

    def note_gradients(self, model: nn.Module) -> None:
        """Measure the gradients held after the first backward (they are freed by the step)."""
        if not hasattr(self, "gradients_mb"):
            self.gradients_mb = tensor_mb(self.held_gradients(model))

    def memory_split(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """MiB this rank holds in parameters, gradients (after backward) and optimizer states, after training."""
        split = {"mem_params_mb": tensor_mb(self.held_parameters(model)),
                 "mem_optim_mb": tensor_mb(self.held_optimizer_state(optimizer))}
        if hasattr(self, "gradients_mb"):
            split["mem_grads_mb"] = self.gradients_mb
        return split

    def finish_epoch(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Complete work still in flight at the end of an epoch (inside the epoch's clock)."""

    def forward(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor | None:
        """Evaluation forward pass; None on ranks that do not hold the network's output."""
        return model(inputs)

    def before_evaluate(self, model: nn.Module, env: DistEnv) -> None:
        """Make every rank hold the model that is evaluated (e.g. the same BatchNorm statistics)."""

    def reduce_mean(self, values: torch.Tensor, env: DistEnv) -> torch.Tensor:
        """Mean over the data-parallel replicas of per-rank values (losses of equal-sized shards)."""
        values = values.clone()
        dist.all_reduce(values)
        return values / env.world_size

    def summary_metrics(self, timer: PhaseTimer, memory_by_rank: list[dict[str, float]],
                        env: DistEnv) -> dict[str, float]:
        """Strategy-specific summary metrics, computed on every rank (may communicate), logged from rank 0."""
        return {}

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain model inside whatever `parallelize` returned."""
        return model

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The complete weights, valid on rank 0; sharded DTensors (FSDP2, tensor parallelism) are gathered,
        a collective every rank joins."""
        return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
                for k, v in self.unwrap(model).state_dict().items()}


def broadcast_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics drift apart on rank-local batches)."""
    for buffer in model.buffers():
        dist.broadcast(buffer, 0)
