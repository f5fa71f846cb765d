"""A strategy is two things: a frozen spec, checked before launch, and the runtime it sets up in each rank.

`Strategy` (the spec) holds the knobs of the strategy's yaml and answers, from the point's config
alone: can this point run (`check`), how do its ranks divide the work (`layout`), which library
config files does it generate, which cross-strategy knobs does it support. In each rank,
`Strategy.setup` wraps or splits the plain model and returns a `Runtime` built once with everything
a step needs (model, optimizer, precision, timer, loss). The training loop (`suite.worker.trainer`) drives
every strategy through the same `Runtime` calls; `DataParallel` is the shared step of all strategies
that run forward, backward and an optimizer step on each rank (single, ddp, fsdp, zero, horovod,
megatron), each changing only how it reduces gradients (`backward`) and steps (`step`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from suite.errors import BadValue
from suite.layout import Layout
from suite.runtime.dist import DistEnv
from suite.runtime.metrics import PhaseTimer, local_tensor, tensor_mb
from suite.runtime.numerics import Precision, optimizer_implementation
from suite.runtime.torch_api import is_dtensor
from suite.shared_names import Family, GradCompression, OptimizerName, PrecisionName

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Supports:
    """Which values of the cross-strategy knobs a strategy applies (the rest is rejected before launch)."""

    precisions: tuple[str, ...] = tuple(PrecisionName)
    optimizers: tuple[str, ...] = tuple(OptimizerName)
    activation_checkpointing: bool = True  # applied to the plain model before `setup`
    # checkpoints with torch.utils.checkpoint, whose selective policy `selective_op` needs (not its library's own)
    operator_policy: bool = True
    grad_accum: bool = False  # trains `grad_accum` micro-batches per step (DataParallel's step), synced as it says
    grad_compressions: tuple[str, ...] = (GradCompression.none,)
    # True where all its communication goes through torch.distributed process groups, so that suite.runtime.metrics's
    # count (`comm_mb_per_step`) is the whole of it; a strategy that communicates otherwise reports none.
    counts_communication: bool = False
    # Trains the plain model's linear layers as torchao's Float8Linear (`fp8=`): its ranks run what the converter
    # made of the model as they run the model (torchtitan composes it with DDP and FSDP2)
    fp8: bool = False
    # Runs the plain model's blocks compiled (`compile=true`) as the model's own code (torchtitan composes torch.compile
    # with DDP and FSDP2)
    compile: bool = False


@dataclass(frozen=True)
class Library:
    """A library a strategy's ranks need beyond torch, which the suite's environment may lack."""

    name: str  # as its users know it
    module: str  # what its ranks import
    make_target: str  # what installs it: `setup` (a dependency of the suite) or its own (`horovod`)
    executables: tuple[str, ...] = ()  # its scripts, beside the interpreter, that start the ranks


@dataclass(frozen=True)
class GradientSync:
    """How a strategy's replicas reduce their gradients, as it declares it to the performance model (suite.predict):
    all-reduced in buckets filled in backward order, each once it holds `bucket_bytes` (the first once it holds
    `first_bucket_bytes`); with a `cycle_s`, what is ready at each tick of that period, fused up to `bucket_bytes`
    (Horovod); `after_backward`, each tensor on its own once backward has ended (AxoNN); else the gradients together
    after backward."""

    bucket_bytes: float = 0.0  # 0: not bucketed (Horovod: no fusion)
    first_bucket_bytes: float | None = None
    cycle_s: float | None = None
    after_backward: bool = False
    buffers_each_forward: bool = False  # rank 0's buffers (BatchNorm statistics) broadcast before every forward
    bucket_copy: bool = False  # the buckets hold a copy of the gradients beside them, not views of them


@dataclass(frozen=True)
class Sharding:
    """What a sharded strategy (ZeRO, FSDP) splits over its replicas and how it gathers and reduces, as it declares it
    to the performance model: ZeRO's `stage` (1 the optimizer's states, 2 and the gradients, 3 and the parameters)."""

    stage: int
    master_copy: bool = False  # an fp32 copy of its partition of the parameters beside the optimizer's states
    gathered_share: float = 1.0  # of a parameter's bytes that gathering it moves and holds (half precision: 0.5)
    regathers: bool | None = None  # gathers the parameters again for backward; None: by `max_reuse_elements`
    regathers_root: bool = False  # the root unit's parameters gathered again too, with the first unit's
    persistence_elements: float = 0.0  # a layer of fewer parameters than this stays gathered (kept whole)
    max_reuse_elements: float = float("inf")  # a network of more parameters than this is gathered again
    bucket_elements: float = 0.0  # stages 1-2: gradients reduced in buckets of this many elements
    overlap_comm: bool = False  # stages 1-2: the buckets reduced while backward runs on (two buffers)
    reduce_scatter: bool = True  # stages 1-2: reduce-scattered, else all-reduced


@dataclass(frozen=True)
class RankContext:
    """What a strategy's runtime on one rank is built from, handed over once."""

    cfg: DictConfig
    env: DistEnv
    layout: Layout
    precision: Precision
    timer: PhaseTimer
    loss_fn: LossFn


@dataclass(frozen=True)
class Strategy:
    name: str
    supports: ClassVar[Supports] = Supports()
    requires: ClassVar[tuple[Library, ...]] = ()  # checked before launch (suite.strategies.missing_library)
    # The oldest torch its ranks run on, checked before launch (suite.strategies.older_torch). This default is the
    # suite's own, what its training loop, runtime and models need (suite.runtime.torch_api keeps the names that
    # moved since): Open-CE's newest build on Power9 (Lassen) is torch 2.1.2 (open-ce/open-ce#941), and
    # `make test-compat` trains the strategies that declare it on that torch.
    needs_torch: ClassVar[str] = "2.1"
    # The strategy's facts the rest of the suite asks it, rather than keeping tables of names: how the performance
    # model prices it and what memory its ranks keep (its family), the name studies and reports give it, and the
    # strategy whose one-step rank on a negligible network gives its ranks' base memory (its library's).
    family: ClassVar[Family | None] = None  # None: the model does not price it
    label: ClassVar[str] = ""  # "" : its name
    base_memory_of: ClassVar[str] = "ddp"

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        """The knob settings the recommender (suite.predict.recommend) prices for a cell of `workers` ranks and
        `batch` samples per rank, as overrides (`strategy.zero_stage=3`): [] for none, [[]] for its defaults."""
        return [[]]

    @property
    def overhead_key(self) -> str:
        """Whose fitted library overhead a point of this strategy shares (suite.predict.correction): its name, unless
        a knob changes what its library does every step."""
        return self.name

    def knobs(self) -> dict[str, Any]:
        """The strategy's own settings, recorded as run params."""
        return {k: v for k, v in asdict(self).items() if k != "name"}

    def check(self, cfg) -> None:
        """Before launch: raise ConfigError for a point this strategy cannot run."""

    def rank_launcher(self, cfg) -> str | None:
        """What starts the point's ranks: None for the cluster's own launcher (the local one here, srun, jsrun or
        mpiexec on a batch cluster); "horovodrun" or "mpiexec" where the strategy's library needs its own."""
        return None

    # What a point that asks this strategy for gradient accumulation is told instead, where it does not accumulate
    # (None: to leave it 1, and which strategies do).
    accumulation_hint: ClassVar[str | None] = None

    def layout(self, cfg) -> Layout:
        """Data-parallel rule (Studies N and J): every worker is a replica with a fixed batch per worker, trained in
        `grad_accum` micro-batches of it per step."""
        return Layout(dp=cfg.workers, mini_batch=cfg.batch_size * cfg.grad_accum, micro_batches=cfg.grad_accum)

    def config_files(self, cfg) -> dict[str, dict[str, Any]]:
        """Configuration the strategy generates for its library (file name -> JSON content), written into
        the point directory before launch and recorded with the run (e.g. DeepSpeed's ds_config.json)."""
        return {}

    def checkpoint_fn(self) -> Callable | None:
        """The function that runs a checkpointed block (None: torch.utils.checkpoint; see
        suite.runtime.model_transforms)."""
        return None

    def recomputed_forward_share(self, layout: Layout) -> float:
        """The share of the forward pass a step computes again in backward by the strategy's own recomputation
        (not `activation_checkpointing`, which the FLOP count sees itself): 0 for none. Counted in HFU, and priced
        (a pipeline's micro-batches recomputed keep only their stage's input)."""
        return 0.0

    # What the performance model (suite.predict) prices, declared here rather than known there by class.
    def gradient_sync(self, dp: int) -> GradientSync:
        """How `dp` replicas reduce their gradients."""
        return GradientSync()

    def sharding(self, cfg) -> Sharding | None:
        """What it shards over its replicas (None: it shards nothing)."""
        return None

    @classmethod
    def probes(cls) -> dict[str, list[str]]:
        """Its library-overhead probes (`make calibrate`, suite.tools.overhead_probes): the overrides of a point of it,
        by the overhead key (`overhead_key`) each measures; none where the model does not price it."""
        return {cls.name: []} if cls.family is not None else {}

    @property
    def fills_bubble(self) -> bool:
        """Whether its pipeline schedule runs the weights' gradients in the bubble (zero-bubble schedules)."""
        return False

    def setup(self, model: nn.Module, rank: RankContext) -> Runtime:
        """In each rank: wrap or split the host-built model, move what this rank holds to its device, build
        the optimizer; return the runtime that trains it."""
        raise NotImplementedError


class Runtime:
    """A strategy on one rank: the model as this rank holds it, its optimizer, and one training step."""

    def __init__(self, rank: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer,
                 plain: nn.Module | None = None) -> None:
        self.rank, self.model, self.optimizer = rank, model, optimizer
        self.plain = model if plain is None else plain  # the plain model inside the wrapper
        self.gradients_mb: float | None = None  # held after the first backward (freed by each step)

    @property
    def devices(self) -> list[torch.device]:
        """The devices this rank computes on, whose memory and queued work it measures: its own, or every GPU
        of a gpipe process."""
        return [self.rank.env.device]

    @property
    def holds_output(self) -> bool:
        """Whether this rank computes the network's output (and so the loss): every rank of a replica,
        except in pipelines, where the last stage does."""
        return True

    # Whether the network's logits stay split by vocabulary over the tensor-parallel ranks (its head split so)
    split_logits: bool = False

    def loss_context(self) -> contextlib.AbstractContextManager:
        """Where the loss and its backward run: with the logits split by vocabulary, under `loss_parallel`, where
        cross-entropy reads the split logits (they are never gathered)."""
        if not self.split_logits:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    @property
    def takes_inputs(self) -> bool:
        """Whether this rank's training step takes the batch's inputs from the loader (a pipeline's first stage): a
        rank that takes neither inputs nor targets loads no batch."""
        return True

    @property
    def takes_targets(self) -> bool:
        """Whether this rank's training step takes the batch's targets from the loader: the rank that holds the
        output, unless another rank loads them for it."""
        return self.holds_output

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimisation step on this rank's part of the global batch; returns the local loss."""
        raise NotImplementedError

    def finish_epoch(self) -> None:
        """Complete work still in flight at the end of an epoch (inside the epoch's clock)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """Evaluation forward pass; None on ranks that do not hold the network's output."""
        return self.model(inputs)

    def before_evaluate(self) -> None:
        """Make every rank hold the model that is evaluated (e.g. the same BatchNorm statistics)."""

    def reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel replicas of per-replica values (losses, counts). Every rank of a replica
        that holds the output holds the same values: the `cp` x `tp` ranks of a stage, or a pipeline's last stage."""
        values = values.clone() if self.holds_output else values.new_zeros(values.shape)
        dist.all_reduce(values)
        return values / (self.rank.layout.cp * self.rank.layout.tp)

    def reduce_mean(self, values: torch.Tensor) -> torch.Tensor:
        """Mean over the replicas (of equal-sized shards)."""
        return self.reduce_sum(values) / self.rank.layout.dp

    def held_parameters(self) -> list[torch.Tensor]:
        """The parameter storage this rank holds (its shards, where parameters are sharded)."""
        return [local_tensor(p) for p in self.plain.parameters()]

    def held_gradients(self) -> list[torch.Tensor] | None:
        """The gradient storage this rank holds after backward (None: not measurable)."""
        return [local_tensor(p.grad) for p in self.plain.parameters() if p.grad is not None]

    def held_optimizer_state(self) -> list[torch.Tensor]:
        """The optimizer's state tensors on this rank (momenta; Adam's first and second moments)."""
        return optimizer_state(self.optimizer)

    def skipped_steps(self) -> int:
        """Optimizer steps skipped on inf/NaN gradients (fp16 loss scaling) so far."""
        return self.rank.precision.skipped_steps

    def note_gradients(self) -> None:
        """Measure the gradients held after the first backward."""
        if self.gradients_mb is None:
            held = self.held_gradients()
            self.gradients_mb = None if held is None else tensor_mb(held)

    def memory_split(self) -> dict[str, float]:
        """MiB this rank holds in parameters, gradients (after backward) and optimizer states, after training."""
        split = {"mem_params_mb": tensor_mb(self.held_parameters()),
                 "mem_optim_mb": tensor_mb(self.held_optimizer_state())}
        if self.gradients_mb is not None:
            split["mem_grads_mb"] = self.gradients_mb
        return split

    def effective_settings(self) -> dict[str, Any]:
        """What this rank's libraries run with that moves performance and the knobs do not say (defaults they
        resolved, kernels they chose), recorded as params `effective.<name>`: a subclass adds its library's."""
        return {"optimizer.implementation": optimizer_implementation(self.optimizer),
                "precision.implementation": "fp32" if self.rank.precision.name == "fp32" else "torch autocast"
                + (" + GradScaler" if self.rank.precision.scaler else "")}

    def summary_metrics(self, memory_by_rank: list[dict[str, float]]) -> dict[str, float]:
        """Strategy-specific summary metrics, computed on every rank (may communicate), logged from rank 0."""
        return {}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The complete weights, valid on rank 0; sharded DTensors (FSDP2, tensor parallelism) are gathered,
        a collective every rank joins."""
        return {k: (v.full_tensor() if is_dtensor(v) else v).detach().cpu()
                for k, v in self.plain.state_dict().items()}


class DataParallel(Runtime):
    """The step of every strategy that runs the whole forward and backward on each rank: forward, backward
    (with the gradient communication the wrapped model does not do itself), optimizer step. With gradient
    accumulation (the layout's `micro_batches` outside a pipeline) forward and backward run once per micro-batch,
    each loss scaled by 1/micro-batches so that the summed gradients are those of the mean loss, then one step."""

    def __init__(self, rank: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer,
                 plain: nn.Module | None = None, sync_buffers: bool = False) -> None:
        super().__init__(rank, model, optimizer, plain)
        self.sync_buffers = sync_buffers

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        timer, precision = self.rank.timer, self.rank.precision
        micro = self.rank.layout.micro_batches
        losses = []
        for i, (x, y) in enumerate(zip(inputs.chunk(micro), targets.chunk(micro))):
            with self.gradient_sync(i == micro - 1), self.loss_context():
                with timer.phase("forward"), precision.autocast():
                    loss = self.rank.loss_fn(self.model(x), y)
                with timer.phase("backward"):
                    self.backward(loss / micro if micro > 1 else loss)
            losses.append(local_tensor(loss).detach())
        self.note_gradients()
        with timer.phase("optimizer"):
            self.step()
        return losses[0] if micro == 1 else torch.stack(losses).mean()

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward and backward: whether its gradients are synchronised is the wrapped
        model's (here: every micro-batch's); DDP's defers it to the `last`."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of the loss, reduced over the replicas that need them equal."""
        self.rank.precision.backward(loss)

    def step(self) -> None:
        """Update the weights from the reduced gradients and free the gradients."""
        self.rank.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)

    def before_evaluate(self) -> None:
        if self.sync_buffers:
            broadcast_buffers(self.plain)


def broadcast_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics drift apart on rank-local batches)."""
    for buffer in model.buffers():
        dist.broadcast(buffer, 0)


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The state tensors of a torch optimizer (the local shards of sharded ones)."""
    return [local_tensor(t) for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]


# A strategy's knobs against the types its dataclass fields declare. Hydra hands them to its class as the command line
# spelt them, unchecked (`static_graph=maybe` arrives as the string "maybe"): checked right after the strategy is built,
# before anything uses it.
def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Literal:
        return value in args
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an integer is a number too: bucket_cap_mb=25
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value if args)
    if origin is dict:
        return isinstance(value, dict) and (not args or all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()))
    return isinstance(value, origin or hint)


def _describe(hint: Any) -> str:
    """What a value of `hint` is, in the words of the one-line error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "null"
    if origin is typing.Literal:
        return f"one of {', '.join(map(str, args))}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin in (list, tuple):
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if origin is dict:
        return "a mapping"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return words.get(hint, f"a {getattr(hint, '__name__', hint)}")


def check_knob_types(strategy) -> None:
    """Raise ConfigError naming the first knob of `strategy` (a dataclass) whose value does not fit its field's type."""
    hints = typing.get_type_hints(type(strategy))
    for field in dataclasses.fields(strategy):
        value = getattr(strategy, field.name)
        if not _matches(value, hints[field.name]):
            raise BadValue(f"strategy {strategy.name}: {field.name}={value} is not {_describe(hints[field.name])}")
