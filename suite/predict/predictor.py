"""From planned points to predictions: price what each point's ranks compute, its links and its memory, and
compose its step time and per-rank memory; nothing is launched.

A point's ranks compute at its layout's micro-batch (the whole mini-batch outside pipelines; a tensor-parallel
group's batch under `megatron`) and load its mini-batch each step. Where the point runs on this machine's kind
of device its compute is profiled here (suite.profiling, cached) with the threads a rank of it gets; a point
for a GPU cluster priced from a machine without a GPU is priced from its cluster's datasheet by the roofline
model (suite.predict.roofline; with the cluster's calibrated matmul rate where `make calibrate` ran there), and
its links by NCCL's model of the catalog's fabric (suite.predict.fabric) unless calibrated. The suite's model
adds what the strategy's library costs per step where `make calibrate` measured it on probe networks
(suite.predict.library_overhead). Where `make bench-model` fitted a correction for the cluster
(suite.predict.correction), the variant `fitted` adds it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import torch

from suite.data import published_samples, train_samples
from suite.errors import ConfigError
from suite.layout import threads_per_worker, will_use_cuda
from suite.paths import DamagedRecord, record_path
from suite.predict import correction, library_overhead
from suite.predict.costs import StepTime, checkpointed
from suite.predict.links import link_model
from suite.predict.memory import MIB, Memory, capacity_bytes, rank_memory
from suite.predict.roofline import GPU_RANK_BASE_BYTES, counted, datasheet_profile
from suite.predict.step import VARIANTS, Workload, step_time
from suite.profiling.cache import data_profile, network_profile, rank_base_mb, worker_thread_profile
from suite.profiling.counted import CountedLayer, CountedNetwork
from suite.profiling.profiles import WINDOW_S, LayerProfile, Profile
from suite.runtime.model_transforms import SELECTIVE, SELECTIVE_OP, checkpoint_interval
from suite.shared_names import PRICED_FROM
from suite.sweep.plan import Point

FITTED = "fitted"  # the suite's model plus the cluster's fitted correction
PREDICTORS = (*VARIANTS, FITTED)


@dataclass(frozen=True)
class Prediction:
    point: Point
    step: StepTime
    steps: int  # per epoch
    memory: Memory
    capacity: float | None  # bytes one rank may use; None: unknown
    profiled_on: str  # the device, threads and any compute scaling
    priced_by: str  # where the link costs come from
    corrected_by: str | None = None  # the fitted correction in the step, if any
    library_by: str | None = None  # the measured library overhead in the step, if any
    profiled_at: float | None = None  # when the network's profile was taken (unix s); None: priced, or not recorded
    profiled_window_s: float = WINDOW_S  # the seconds of steps the profile timed the whole network over
    flops_per_sample: float = 0.0  # the model's forward and backward FLOPs per sample (recomputation excluded)
    recomputed_flops_per_sample: float = 0.0  # the forward FLOPs checkpointed blocks run again in backward

    @property
    def epoch_s(self) -> float:
        return self.steps * self.step.total

    @property
    def peak_mb(self) -> float:
        return self.memory.peak / MIB

    @property
    def priced_from(self) -> str:
        """What its compute was priced from: `datasheet`, `calibrated` (the cluster's measured matmul rate in the
        datasheet model) or `profiled` (measured on a device of the cluster's kind)."""
        first = self.profiled_on.split(":", 1)[0]
        return first if first in PRICED_FROM else "profiled"

    @property
    def samples_per_s(self) -> float:
        return self.point.global_batch_size / self.step.total

    @property
    def model_tflops_per_device(self) -> float:
        """The model's FLOPs per second per rank (MFU's numerator: recomputation not counted)."""
        return self.flops_per_sample * self.samples_per_s / self.point.processes / 1e12

    @property
    def hardware_tflops_per_device(self) -> float:
        """The FLOPs a rank executes per second, recomputation included (what Megatron-LM reports)."""
        flops = self.flops_per_sample + self.recomputed_flops_per_sample
        return flops * self.samples_per_s / self.point.processes / 1e12

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.memory.peak <= self.capacity

    def metrics(self) -> dict[str, float]:
        """What a run records beside its measurement, and (a metric of 1) what its compute was priced from."""
        fits = {} if self.fits is None else {"predicted_fits": float(self.fits)}
        return {"predicted_epoch_time_s": self.epoch_s, "predicted_peak_memory_mb": self.peak_mb, **fits,
                f"predicted_from_{self.priced_from}": 1.0}


def steps_per_epoch(cfg, layout) -> int:
    """As the trainer counts them: each replica's shard in whole mini-batches, at most `steps_per_epoch`."""
    samples = train_samples(cfg.dataset) or published_samples(cfg.dataset)[0]
    available = (samples // layout.dp) // layout.mini_batch
    return max(min(cfg.steps_per_epoch or available, available), 1)


def processes_per_node(point: Point) -> int:
    return math.ceil(point.processes / point.cfg.nodes)


def profile_device(cfg) -> torch.device:
    return torch.device("cuda" if will_use_cuda(cfg.cluster) and torch.cuda.is_available() else "cpu")


def from_datasheet(cfg, device: torch.device) -> bool:
    """Whether the point's compute is priced from its cluster's GPU datasheet (suite.predict.roofline): a GPU
    cluster priced from a machine without a GPU."""
    return will_use_cuda(cfg.cluster) and device.type == "cpu"


def base_bytes(point: Point, threads: int) -> float:
    """What a rank of the point's strategy holds before its model: measured on a rank of the same library
    (torch alone, DeepSpeed under `zero`, Horovod) with a negligible network, here; on a GPU priced from its
    datasheet, the roofline model's estimate."""
    if from_datasheet(point.cfg, profile_device(point.cfg)):
        return GPU_RANK_BASE_BYTES
    library = point.strategy.base_memory_of
    return rank_base_mb(library, threads) * MIB


def ranks_at_once(threads: int) -> int:
    """How many ranks of `threads` intra-op threads each this machine's cores run at once."""
    return max(1, (os.cpu_count() or 1) // threads)


def crowding(point: Point) -> float:
    """How many ranks of the point share each slot of its CPU node's cores (the ranks its cores run at once),
    where more than one; 1 on GPUs."""
    if will_use_cuda(point.cfg.cluster):
        return 1.0
    threads = threads_per_worker(point.cfg.cluster.threads_per_worker, processes_per_node(point))
    return max(1.0, processes_per_node(point) / ranks_at_once(threads))


def workload(point: Point, fewer_ranks: bool = False) -> tuple[Workload, torch.device, str]:
    """What the point's step is priced from, the device it was profiled on, and how (for the report);
    `fewer_ranks`: its links from calibrations among fewer ranks than its workers (held out by worker count)."""
    cfg, layout = point.cfg, point.layout
    device = profile_device(cfg)
    threads = threads_per_worker(cfg.cluster.threads_per_worker, processes_per_node(point))
    links = link_model(cfg.cluster, cfg.nodes, point.processes, cfg.workers if fewer_ranks else None)
    if links.missing and point.processes > 1:  # said before profiling, which it would make pointless
        raise ConfigError(links.missing)
    together = processes_per_node(point) if not will_use_cuda(cfg.cluster) else 1  # a node's ranks share its cores
    oversubscription = 1.0
    crowded = crowding(point)
    if layout.pp > 1 and not layout.stages_in_one_process and crowded > 1:
        together, oversubscription = ranks_at_once(threads), crowded  # see step.shared_cores
    if from_datasheet(cfg, device):
        profile = datasheet_profile(cfg, layout.micro_batch_size)
        profiled_on = profile.key["priced_from"]
        # Loader processes on the node's own CPUs, which this machine's say nothing of: where there are some they
        # are taken to keep up with the GPU; without, loading is timed here.
        loaded = cfg.dataset.loader_workers == 0
        data_s = data_profile(cfg, layout.mini_batch, device, threads)[0].batch_s if loaded else 0.0
    else:
        profile, _ = network_profile(cfg, layout.micro_batch_size, device, threads, together, layout.mini_batch)
        data_s = data_profile(cfg, layout.mini_batch, device, threads, together)[0].batch_s
        profiled_on = f"{profile.key['device']}, {threads} thread(s) per process, {together} process(es) at once"
        if profile.taken:
            profiled_on += f", {profile.taken['busy_share']:.0%} of the cores busy with other work"
    if cfg.activation_checkpointing == SELECTIVE:
        profile = attention_recomputed(profile)
    if cfg.activation_checkpointing == SELECTIVE_OP:
        if not from_datasheet(cfg, device):
            profile = with_operator_split(profile, counted(cfg, profile.batch))
        profile = operators_recomputed(profile)
    on_gpus = will_use_cuda(cfg.cluster)
    slowdown = 1.0
    if layout.stages_in_one_process and not on_gpus:
        worker, _ = worker_thread_profile(cfg, layout.micro_batch_size, device, threads, together)
        slowdown = worker.slowdown
        profiled_on += f", forward x{slowdown:.2f} on torchgpipe's worker thread"
    w = Workload(cfg, point.strategy, layout, profile, data_s, links,
                 steps_per_epoch(cfg, layout), stages_overlap=on_gpus, worker_forward_slowdown=slowdown,
                 oversubscription=oversubscription,
                 data_overlaps=on_gpus and cfg.dataset.loader_workers > 0, comm_hides=on_gpus)
    return w, device, profiled_on


def predict(point: Point, variant: str = "suite", fewer_ranks: bool = False) -> Prediction:
    """The point's prediction by the suite's model, Study J's equations, or (`fitted`) the suite's model with its
    cluster's correction fitted by `make bench-model`; `fewer_ranks` as `workload`'s."""
    if variant == FITTED:
        return with_correction(predict(point, fewer_ranks=fewer_ranks))
    w, _, profiled_on = workload(point, fewer_ranks)
    threads = threads_per_worker(point.cfg.cluster.threads_per_worker, processes_per_node(point))
    memory = rank_memory(w, base_bytes(point, threads))
    device_type = "cuda" if will_use_cuda(point.cfg.cluster) else "cpu"
    capacity = capacity_bytes(point.cfg, device_type, processes_per_node(point))
    prediction = Prediction(point, step_time(w, variant), w.steps, memory, capacity, profiled_on, w.links.source,
                            profiled_at=w.profile.taken.get("at"),
                            profiled_window_s=w.profile.taken.get("window_s", WINDOW_S),
                            flops_per_sample=w.profile.flops / w.profile.batch,
                            recomputed_flops_per_sample=recomputed_flops(w.profile, point.cfg) / w.profile.batch)
    return with_library_overhead(prediction, w.profile, fewer_ranks) if variant == "suite" else prediction


def attention_recomputed(profile: Profile) -> Profile:
    """The profile as selective recomputation trains the network: each layer's backward runs its attention cores'
    forward again, and keeps nothing of what they saved (its workspace unchanged). Every strategy's step and
    memory model prices it as it is."""
    layers = tuple(replace(layer, backward_s=layer.backward_s + layer.core_forward_s,
                           saved_bytes=layer.saved_bytes - layer.core_saved_bytes) for layer in profile.layers)
    return replace(profile, layers=layers,
                   backward_s=profile.backward_s + sum(layer.core_forward_s for layer in profile.layers),
                   train_bytes=profile.train_bytes - sum(layer.core_saved_bytes for layer in profile.layers))


def with_operator_split(profile: Profile, network: CountedNetwork) -> Profile:
    """A measured profile with what `selective_op` trades in each decoder block, from the same network counted
    (`network`): what the block keeps, and of its measured forward seconds the share of its forward FLOPs that the
    policy recomputes. An approximation: the recomputed ops are the light ones (norms, activations, elementwise),
    which count no FLOPs but take time, so this share prices the recomputed multiplies alone."""
    def split(layer: LayerProfile, counted_layer: CountedLayer) -> LayerProfile:
        flops = sum(kernel.flops for kernel in counted_layer.forward)
        recomputed = sum(kernel.flops for kernel in counted_layer.op_recomputed)
        return replace(layer, op_recomputed_s=layer.forward_s * recomputed / flops if flops else 0.0,
                       op_recomputed_flops=int(recomputed), op_kept_bytes=counted_layer.op_kept_bytes)
    return replace(profile, layers=tuple(map(split, profile.layers, network.layers)))


def operators_recomputed(profile: Profile) -> Profile:
    """The profile as `selective_op` trains the network (torchtitan's operator policy): each decoder block's
    backward runs again the forward ops the policy does not save, and the block keeps only its input and the
    outputs of those it saves. Every strategy's step and memory model prices it as it is."""
    def trained(layer: LayerProfile) -> LayerProfile:
        if not layer.op_kept_bytes:  # not a decoder block
            return layer
        return replace(layer, backward_s=layer.backward_s + layer.op_recomputed_s, saved_bytes=layer.op_kept_bytes)
    layers = tuple(map(trained, profile.layers))
    freed = sum(plain.saved_bytes - layer.saved_bytes for plain, layer in zip(profile.layers, layers))
    return replace(profile, layers=layers, train_bytes=profile.train_bytes - freed,
                   backward_s=profile.backward_s + sum(layer.op_recomputed_s for layer in profile.layers))


def recomputed_flops(profile: Profile, cfg) -> float:
    """The forward FLOPs that activation checkpointing runs again in backward: of the blocks it wraps, of the
    attention cores (`selective`), or of the ops the operator policy does not save (`selective_op`)."""
    if cfg.activation_checkpointing == SELECTIVE:
        return sum(layer.core_forward_flops for layer in profile.layers)
    if cfg.activation_checkpointing == SELECTIVE_OP:
        return sum(layer.op_recomputed_flops for layer in profile.layers)
    again = checkpointed(list(profile.layers), checkpoint_interval(cfg.activation_checkpointing))
    return sum(layer.forward_flops for layer, a in zip(profile.layers, again) if a)


def with_library_overhead(prediction: Prediction, profile: Profile, fewer_ranks: bool = False) -> Prediction:
    """The prediction with what its strategy's library costs per step on its cluster added to its step, where
    `make calibrate` measured it (suite.predict.library_overhead), on the number of workers nearest the point's
    (`fewer_ranks`: fewer than its own); Study J's equations are kept as published."""
    point = prediction.point
    library = library_overhead.load(point.cfg.cluster.name)
    measured = library and library.measured(point.strategy, point.cfg.workers, fewer_ranks)
    if not measured:
        return prediction
    fitted, source = measured
    step = replace(prediction.step, library=fitted.step_s(profile.param_bytes, profile.param_tensors, crowding(point)))
    return replace(prediction, step=step, library_by=source)


def with_correction(prediction: Prediction) -> Prediction:
    """The prediction with its cluster's correction file added to its step, where it has a fit for the strategy."""
    cluster = prediction.point.cfg.cluster.name
    path = correction.correction_path(cluster)
    fitted = correction.required(cluster)
    strategy = prediction.point.strategy
    if strategy.overhead_key not in fitted.fits:
        return prediction
    step = prediction.step
    added = fitted.step_s(strategy, step.total) - step.total
    return replace(prediction, step=replace(step, fitted=added),
                   corrected_by=f"{path.name} ({fitted.source()})")


def recorded_prediction(point: Point) -> dict[str, float]:
    """The prediction a sweep records with a point's run (the model's own, so that the sweep's report scores it
    held out): for a GPU cluster priced from its datasheet, or a cluster with a calibration record (`make
    calibrate`); none otherwise, so that a sweep never waits on profiling it did not ask for, nor with
    `record_prediction=false`. A damaged calibration file is raised, for the sweep to say."""
    cfg = point.cfg
    if not cfg.record_prediction:
        return {}
    if not from_datasheet(cfg, profile_device(cfg)) and not record_path(cfg.cluster.name).exists():
        return {}
    try:
        return predict(point).metrics()
    except DamagedRecord:
        raise
    except ConfigError:  # e.g. a catalog entry without what the model needs
        return {}
