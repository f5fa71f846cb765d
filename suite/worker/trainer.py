"""The training loop shared by every strategy.

Warm-up steps run before the first epoch and are not timed. Each epoch is `steps_per_epoch`
steps (or one pass over this rank's shard), timed with device-synchronised clocks, followed by
an evaluation on the validation set. Per-rank numbers are reduced explicitly once per epoch:
max for times, mean over data-parallel replicas for losses, sums for sample counts.
Time-to-target counts training time only (warm-up and epochs, slowest rank), not evaluation.
With `profile.steps`, the first steps of epoch 1 are traced (suite.runtime.profile) and the communication measured
in the traces is reduced like the phase times (suite.runtime.trace_breakdown).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset

from suite.data import Datasets, build_datasets
from suite.errors import ConfigError, Diverged
from suite.launch_timing import mark
from suite.layout import Layout, node_threads
from suite.models import build_model
from suite.point_dir import PointDir, error_line
from suite.runtime.dist import DistEnv
from suite.runtime.faults import inject_fault
from suite.runtime.manifest import process_settings, rank_info
from suite.runtime.metrics import (
    PHASES,
    CommVolume,
    Device,
    PhaseTimer,
    StepFlops,
    find_peak,
    largest_over_ranks,
    math_dtype,
    peak_memory,
    reset_peak,
    step_flops,
    synchronize,
    utilisation,
)
from suite.runtime.model_transforms import (
    apply_activation_checkpointing,
    compile_blocks,
    convert_to_fp8,
    decoder_blocks,
)
from suite.runtime.numerics import make_precision
from suite.runtime.profile import StepTrace
from suite.runtime.torch_api import set_math
from suite.runtime.trace_breakdown import breakdown, unmeasured_communication
from suite.shared_names import DEVICE_MEMORY, MEMORY_SPLIT, TRACE_BREAKDOWN, Float8Recipe
from suite.strategies.base import RankContext, Strategy

log = logging.getLogger("suite")


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for both tasks: [B, C] vs [B] (classification) or [B, T, V] vs [B, T] (language model)."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def target_metric(cfg, task: str) -> str:
    return cfg.target.metric or ("val_accuracy" if task == "classification" else "val_perplexity")


def reached(metric: str, value: float, target: float) -> bool:
    return value <= target if metric == "val_perplexity" else value >= target


@dataclass
class Loaders:
    train: DataLoader
    val: DataLoader
    sampler: DistributedSampler


def make_loaders(cfg, data: Datasets, layout: Layout, env: DistEnv) -> Loaders:
    """This rank reads its replica's shard: `layout.mini_batch` samples per step."""
    index, count = layout.data_shard(env.rank)
    pin = env.device.type == "cuda"
    workers = cfg.dataset.loader_workers
    sampler = DistributedSampler(data.train, count, index, shuffle=True, seed=cfg.seed, drop_last=True)
    train = DataLoader(data.train, layout.mini_batch, sampler=sampler, drop_last=True,
                       num_workers=workers, pin_memory=pin, persistent_workers=workers > 0)
    # Validation shards are strided without padding, so every sample counts exactly once.
    val_shard = Subset(data.val, range(index, len(data.val), count))
    val = DataLoader(val_shard, layout.mini_batch, num_workers=workers, pin_memory=pin)
    return Loaders(train, val, sampler)


class Trainer:
    def __init__(self, cfg, env: DistEnv, strategy: Strategy, point_dir: PointDir, label: str = "") -> None:
        self.cfg, self.env, self.point_dir = cfg, env, point_dir
        self.label = label
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        set_math(cfg.math.tf32, cfg.math.cudnn_benchmark)
        self.data = build_datasets(cfg.dataset, cfg.seed)
        self.strategy = strategy
        self.layout = strategy.layout(cfg)
        # Built on the host: the strategy moves to the device what this rank holds (a pipeline, one stage).
        model = build_model(cfg.network, cfg.dataset)
        if cfg.fp8 != Float8Recipe.none:  # before any parallelism, as torchtitan converts
            convert_to_fp8(model, cfg.fp8)
        blocks = decoder_blocks(model) if cfg.compile else []
        apply_activation_checkpointing(model, cfg.activation_checkpointing, strategy.checkpoint_fn())
        compile_blocks(model, blocks, env.device)
        self.timer = PhaseTimer(env.device)
        rank = RankContext(cfg, env, self.layout, make_precision(cfg.precision, env.device), self.timer, loss_fn)
        self.parallel = strategy.setup(model, rank)
        # Counts the groups `setup` made too; not where the ranks are MPI's, whose messages it does not see.
        self.comm = CommVolume(strategy.supports.counts_communication and strategy.rank_launcher(cfg) != "mpiexec")
        self.loaders = make_loaders(cfg, self.data, self.layout, env)
        available = len(self.loaders.train)
        self.steps_per_epoch = min(cfg.steps_per_epoch or available, available)
        if self.steps_per_epoch < 1 or (cfg.steps_per_epoch or 0) > available:
            raise ConfigError(
                f"steps_per_epoch={cfg.steps_per_epoch} but the shard holds {available} batches of "
                f"{self.layout.mini_batch}: raise dataset.samples or lower the batch"
            )
        self.metric = target_metric(cfg, self.data.task)
        self.trace = (StepTrace(cfg.profile.steps, self.timer, point_dir.rank_trace(env.rank)) if cfg.profile.steps
                      else None)
        self.global_step = 0
        self.step_losses: list[float] = []
        self.flops: StepFlops | str | None = None  # rank 0's count, or why there is none

    def _batches(self, epoch: int, steps: int, trace: StepTrace | None = None):
        """The epoch's training batches on this rank's device: what its step takes of them, an empty tensor in place
        of the rest (a pipeline's middle stages load no batch at all, its first stage copies no targets; a
        tensor-parallel rank other than its group's first loads none and receives the batch in its step)."""
        self.loaders.sampler.set_epoch(epoch)
        wants = (self.parallel.takes_inputs, self.parallel.takes_targets)
        loader = iter(self.loaders.train) if any(wants) else None
        nothing = torch.empty(0, device=self.env.device)
        for _ in range(steps):
            if trace:
                trace.step()
            with self.timer.phase("data"):
                batch = next(loader) if loader else (nothing, nothing)
                inputs, targets = (t.to(self.env.device, non_blocking=True) if wanted else nothing
                                   for t, wanted in zip(batch, wants))
            yield inputs, targets

    def _step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.global_step += 1
        fault = self.cfg.fault
        if fault.kind and fault.step == self.global_step and fault.rank == self.env.rank:
            inject_fault(fault.kind, self.global_step)
        with self.comm.counted(self.timer.enabled):
            loss = self.parallel.train_step(inputs, targets)
        if self.global_step == 1:
            mark("first_step", self.env.rank)
        return loss

    def _reduce_losses(self, losses: list[torch.Tensor]) -> list[float]:
        if not losses:
            return []
        return self.parallel.reduce_mean(torch.stack(losses).float()).tolist()

    def _max(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.env.device)  # NCCL reduces device tensors only
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _warm_up(self) -> float:
        start = time.perf_counter()
        self.parallel.model.train()
        losses = [self._step(x, y) for x, y in self._batches(0, min(self.cfg.warmup_steps, self.steps_per_epoch))]
        synchronize(*self.parallel.devices)
        (elapsed,) = self._max([time.perf_counter() - start])
        warm_up_losses = self._reduce_losses(losses)
        self._check_finite(warm_up_losses, 1, "warm-up step {}")
        self.step_losses += warm_up_losses
        return elapsed

    def _check_finite(self, losses: list[float], first_step: int, when: str) -> None:
        """Diverged, on every rank alike (the losses are reduced over them), at the first of these steps' training
        losses (from `first_step`; `when` names a step by `{}`) that is nan or infinite.
        Not the validation loss: a network whose training loss stays finite can evaluate to nan (ResNet-152 as a
        2-stage pipeline on a few CIFAR-10-shaped samples, tests/test_pipeline_networks.py), a fault of the metric
        that the run records as it is, not a divergence."""
        for step, loss in enumerate(losses, first_step):
            if not math.isfinite(loss):
                raise Diverged(f"loss {loss} at {when.format(step)}: training diverged "
                               f"(optimizer.lr={self.cfg.optimizer.lr:g})")

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        self.parallel.model.train()
        self.timer.enabled = True
        losses: list[torch.Tensor] = []
        samples = checked = 0
        trace = self.trace if epoch == 1 else None
        if trace:
            trace.start()  # before the clock starts
        synchronize(*self.parallel.devices)
        dist.barrier()  # every rank starts the epoch clock together
        start = time.perf_counter()
        for step, (inputs, targets) in enumerate(self._batches(epoch, self.steps_per_epoch, trace), 1):
            losses.append(self._step(inputs, targets))
            self.timer.steps += 1
            samples += self.layout.mini_batch
            if step % self.cfg.log_every == 0 or step == self.steps_per_epoch:
                # Every rank reduces: under pipelines only the last stage holds the loss. The steps since the last
                # line are checked too, so that a divergence names the step it began at.
                since = self._reduce_losses(losses[checked:])
                self._check_finite(since, checked + 1, f"epoch {epoch} step {{}}")
                loss, checked = since[-1], step
                rate = samples * self.layout.dp / (time.perf_counter() - start)
                if self.env.is_main:
                    log.info("%s epoch %d/%d step %d/%d loss %.4f %.1f samples/s", self.label, epoch,
                             self.cfg.epochs, step, self.steps_per_epoch, loss, rate)
        with self.comm.counted(True):
            self.parallel.finish_epoch()
        synchronize(*self.parallel.devices)
        elapsed = time.perf_counter() - start
        self.timer.enabled = False
        if trace:
            trace.finish()
        self.timer.collect()
        step_losses = self._reduce_losses(losses)
        self.step_losses += step_losses
        self._check_steps_taken(epoch)
        (epoch_time,) = self._max([elapsed])
        global_samples = samples * self.layout.dp  # every replica trains as many steps of a mini-batch
        return {
            "epoch_time_s": epoch_time,
            "throughput_samples_s": global_samples / epoch_time,
            "samples": global_samples,
            "train_loss": sum(step_losses) / len(step_losses),
        }

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.parallel.before_evaluate()
        self.parallel.model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.env.device)  # loss sum, correct, targets
        for batch, (inputs, targets) in enumerate(self.loaders.val):
            if self.cfg.eval_batches is not None and batch >= self.cfg.eval_batches:
                break
            inputs, targets = inputs.to(self.env.device), targets.to(self.env.device)
            with self.parallel.rank.precision.autocast():
                logits = self.parallel.forward(inputs)
            if logits is None:
                continue
            logits, targets = logits.flatten(0, -2).float(), targets.flatten()
            totals[0] += F.cross_entropy(logits, targets, reduction="sum")
            totals[1] += (logits.argmax(-1) == targets).sum()
            totals[2] += targets.numel()
        totals = self.parallel.reduce_sum(totals)
        val_loss = (totals[0] / totals[2]).item()
        if self.data.task == "classification":
            return {"val_loss": val_loss, "val_accuracy": (totals[1] / totals[2]).item()}
        return {"val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 50.0))}

    def count_flops(self) -> StepFlops | str:
        """FLOPs of one replica's step, counted on the meta device (suite.runtime.metrics); else why not."""
        try:
            flops = step_flops(self.cfg.network, self.cfg.dataset, self.data.train[0], self.layout.mini_batch,
                               self.cfg.activation_checkpointing,
                               self.strategy.recomputed_forward_share(self.layout), loss_fn)
        except Exception as e:  # a network the counter cannot run on the meta device: no MFU, and the run says why
            log.warning("%s FLOPs not counted: %s", self.label, error_line(e))
            return f"FLOPs not counted: {error_line(e)}"
        log.info("%s FLOPs per step of one replica: %.4g TFLOP (%.4g with recomputation)", self.label,
                 flops.model / 1e12, flops.hardware / 1e12)
        return flops

    def run(self) -> dict[str, Any]:
        mark("built", self.env.rank)
        # Counted before the warm-up, which the other ranks start only when rank 0 is done with it.
        if self.env.is_main:
            self.flops = self.count_flops()
        dist.barrier()
        reset_peak(*self.parallel.devices)
        train_clock = self._warm_up()
        epochs: list[dict[str, float]] = []
        to_target: dict[str, float] = {}
        for epoch in range(1, self.cfg.epochs + 1):
            metrics = self._train_epoch(epoch)
            train_clock += metrics["epoch_time_s"]
            metrics.update(self.evaluate())
            metrics.update(epoch=epoch, train_time_s=train_clock, ended_at=time.time())
            epochs.append(metrics)
            if self.env.is_main:
                self.point_dir.append_epoch(metrics)
                log.info("%s epoch %d/%d done in %.2fs, %.1f samples/s, train_loss %.4f, %s %.4f", self.label,
                         epoch, self.cfg.epochs, metrics["epoch_time_s"], metrics["throughput_samples_s"],
                         metrics["train_loss"], self.metric, metrics[self.metric])
            target = self.cfg.target.value
            if target is not None and not to_target and reached(self.metric, metrics[self.metric], target):
                to_target = {"time_to_target_s": train_clock, "epochs_to_target": epoch}
        return self._summary(epochs, to_target)

    def _comm_metrics(self) -> dict[str, float]:
        """MiB sent in collectives per timed step, by the rank that sends the most (see suite.runtime.metrics)."""
        if not self.comm.counts:
            return {}
        (mb,) = self._max([self.comm.sent_bytes / 2**20 / max(self.timer.steps, 1)])
        return {"comm_mb_per_step": mb}

    def _check_steps_taken(self, epoch: int) -> None:
        """fp16: Diverged where loss scaling skipped every optimizer step so far (the weights never moved)."""
        skipped = self._skipped_steps().get("fp16_skipped_steps", 0)
        taken = len(self.step_losses)  # warm-up and timed steps
        if skipped and skipped >= taken:
            raise Diverged(f"fp16 loss scaling skipped all {taken:g} optimizer steps by epoch {epoch}: every "
                           "gradient overflowed")

    def _skipped_steps(self) -> dict[str, float]:
        """fp16: the optimizer steps (warm-up included) that loss scaling skipped, on the rank that skipped most."""
        if self.cfg.precision != "fp16":
            return {}
        (skipped,) = self._max([float(self.parallel.skipped_steps())])
        return {"fp16_skipped_steps": skipped}

    def _utilisation(self, seconds: float, steps: int) -> dict[str, Any]:
        """MFU and HFU of `steps` global steps in `seconds` (rank 0; see suite.runtime.metrics)."""
        if isinstance(self.flops, str):
            return {"run_tags": {"suite.mfu_missing": self.flops}}
        device = self.env.device
        if device.type == "cuda":
            devices, measured = self.layout.devices, Device(rank_info(device)["device"])
        else:  # the ranks of a node share its cores: the node is the device
            devices = self.env.world_size // self.env.local_world_size
            threads = node_threads(torch.get_num_threads(), self.env.local_world_size)
            measured = Device(rank_info(device)["device"], threads)
        dtype = math_dtype(self.cfg.precision, device, convolutional=self.cfg.dataset.kind == "image")
        peak = find_peak(self.cfg.cluster, dtype, measured)
        metrics, tags = utilisation(self.flops, self.layout.dp, steps, seconds, devices, peak)
        return {**metrics, "run_tags": tags}

    def _breakdown_metrics(self) -> dict[str, Any]:
        """Communication, computation and idle time per traced step, from each rank's trace; for the strategies
        whose communication all goes through torch.distributed, so that the trace shows all of it."""
        if self.trace is None or not self.comm.enabled:
            return {}
        unmeasured = unmeasured_communication(self.env.backend, self.env.device.type)
        if unmeasured:
            return {"run_tags": {"suite.breakdown_missing": unmeasured}}
        by_rank = [None] * self.env.world_size
        dist.all_gather_object(by_rank, breakdown(self.trace.path))
        return {**{key: max(rank[key] for rank in by_rank) for key in TRACE_BREAKDOWN}, "breakdown_by_rank": by_rank}

    def _summary(self, epochs: list[dict[str, float]], to_target: dict[str, float]) -> dict[str, Any]:
        phases = self.timer.means()
        # A phase no rank timed (torchgpipe's partitions on GPUs, which its own streams run) is left out, not 0.
        phase_max = {p: t for p, t in zip(PHASES, self._max([phases.get(p, -1.0) for p in PHASES])) if t >= 0}
        memory = [None] * self.env.world_size
        dist.all_gather_object(memory, {**peak_memory(*self.parallel.devices,
                                                      ranks_share_gpu=self.cfg.cluster.share_gpus),
                                        **self.parallel.memory_split()})
        total_time = sum(e["epoch_time_s"] for e in epochs)
        breakdown_metrics = self._breakdown_metrics()
        utilisation = self._utilisation(total_time, self.steps_per_epoch * len(epochs)) if self.env.is_main else {}
        run_tags = {**breakdown_metrics.pop("run_tags", {}), **utilisation.pop("run_tags", {})}
        summary = {
            "epoch_time_s_mean": total_time / len(epochs),
            "throughput_samples_s_mean": sum(e["samples"] for e in epochs) / total_time,
            "samples_per_epoch": epochs[-1]["samples"],
            "train_set_samples": len(self.data.train),
            "steps_per_epoch": self.steps_per_epoch,
            "peak_memory_mb": max(m["peak_memory_mb"] for m in memory),
            **largest_over_ranks(memory, (*MEMORY_SPLIT, *DEVICE_MEMORY)),
            **self._skipped_steps(),
            **{f"time_{p}_s": t for p, t in phase_max.items()},
            **self._comm_metrics(),
            **breakdown_metrics,
            **utilisation,
            "run_tags": run_tags,
            "run_params": {**process_settings(), **self.parallel.effective_settings()},
            **to_target,
            "memory_by_rank": memory,
            "strategy_metrics": self.parallel.summary_metrics(memory),
            "step_losses": self.step_losses,
        }
        if self.cfg.save_final_weights:
            state = self.parallel.full_state_dict()
            if self.env.is_main:
                torch.save(state, self.point_dir.weights_file)
        return summary
