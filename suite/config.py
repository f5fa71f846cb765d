"""Typed schema of one grid point.

Hydra composes `conf/` against these dataclasses, so a misspelt key or a value of the
wrong type is a composition error instead of being silently ignored. Strategy knobs differ
per strategy; they are checked by instantiating the strategy class (see `suite.strategies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from suite.shared_names import (
    AttentionKernel,
    Device,
    FaultKind,
    Float8Recipe,
    GradCompression,
    OptimizerName,
    PrecisionName,
)


@dataclass
class DatasetConfig:
    name: str = MISSING  # mnist | cifar10 | imagenet | highres | digits | tokens | wikitext103
    kind: str = MISSING  # image | tokens
    source: str = "synthetic"  # synthetic | real | digits
    path: str | None = None  # root of the real dataset (source=real)
    samples: int | None = None  # training samples (images) or sequences (tokens); None = published size
    val_samples: int | None = None
    num_classes: int = 0  # images
    channels: int = 0  # images
    image_size: int = 0  # images: side of the square input fed to the network
    vocab_size: int = 0  # tokens
    seq_len: int = 0  # tokens: context length of one sample
    # DataLoader worker processes per rank; null: as the data needs them (suite.layout.loader_workers), decided
    # when the point is planned: 4 on GPUs, none on CPU
    loader_workers: int | None = None


@dataclass
class NetworkConfig:
    """A family and one of its named sizes (declared in suite.models: GPT2_SIZES, RESNET_SIZES, ...), which
    conf/network/<name>.yaml selects. The rest is filled in as the point composes (suite.models.resolve_network):
    the architecture, GPT-2's dimensions not overridden, and the name it is recorded by, that of what is built."""

    family: str = MISSING  # gpt2 | llama3 | resnet | vgg | mobilenet
    size: str | None = MISSING  # gpt2: nano, tiny, mini, mini_wide, small, medium; llama3: nano, tiny, 8b, 70b, 405b;
    # resnet: 18, 50, 152; vgg: 11, 16; mobilenet: v2. After composition: the size of what is built, null for a
    # decoder of dimensions no size has.
    name: str | None = None  # set from what is built: gpt2_tiny, resnet18, or gpt2_L4_H4_E96 (not a size)
    arch: str | None = None  # set from family and size: gpt2 | llama3 | resnet18 | resnet50 | vgg11 | vgg16 | ...
    width: float = 1.0  # channel multiplier (vgg, mobilenet_v2) for small test variants
    dropout: float = 0.0
    n_layer: int | None = None  # gpt2, llama3; null = the size's (0 for the other families)
    n_head: int | None = None  # gpt2, llama3
    n_embd: int | None = None  # gpt2, llama3
    n_kv_head: int | None = None  # llama3: key-value heads, each shared by n_head / n_kv_head query heads
    ffn_dim_multiplier: float | None = None  # llama3: its feed-forward width is 2/3 x 4 x n_embd times this,
    multiple_of: int | None = None  # llama3: rounded up to a multiple of this
    attention: AttentionKernel = AttentionKernel.auto  # gpt2, llama3: the kernel of scaled_dot_product_attention


@dataclass
class OptimizerConfig:
    name: OptimizerName = OptimizerName.sgd
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4
    eps: float = 1e-8  # adam, adamw, lamb: added to the root of the second moment


@dataclass
class GradCompressionConfig:
    """Gradients compressed before they are all-reduced (ddp: DDP communication hooks)."""

    name: GradCompression = GradCompression.none
    rank: int = 1  # powersgd: rank of the low-rank approximation (PowerSGD's matrix_approximation_rank)
    start_iter: int = 2  # powersgd: plain all-reduce before this step (torch needs >= 2 for its error feedback)


@dataclass
class TargetConfig:
    """Time-to-accuracy: the first epoch whose validation metric reaches `value`."""

    metric: str | None = None  # val_accuracy (higher is better) | val_perplexity (lower); None = the task's
    value: float | None = None


@dataclass
class FaultConfig:
    """Fault injection for testing how failures are recorded: kind error | oom | hang | exit."""

    kind: FaultKind | None = None
    step: int = 1  # global training step (warm-up included) at which it fires
    rank: int = 0


@dataclass
class MathConfig:
    """How float32 work runs on GPUs: what `precision=fp32` means there."""

    # Float32 matrix products and cuDNN convolutions in TF32 on Ampere and later: true both (PyTorch 1.7-1.11's
    # default, which Study N's PyTorch 1.8 ran on A100), false neither, null torch's default (matmul no, conv yes).
    tf32: bool | None = None
    cudnn_benchmark: bool = False  # cuDNN tries the algorithms of each convolution shape first (DDLBench sets it)


@dataclass
class ProfileConfig:
    """A torch.profiler trace of the first timed steps on every rank (suite.runtime.profile)."""

    steps: int = 0  # steps of the first epoch traced; 0 = no profiler at all


@dataclass
class QueueConfig:
    """One of a site's batch queues as its documentation states it (each cluster config cites the page)."""

    name: str = MISSING
    min_nodes: int = 1
    max_nodes: int | None = None  # None: no limit documented
    min_time_min: int = 0
    max_time_min: int | None = None
    # Jobs one user may have queued or running in it: the site's per-user limit, or its per-project one, which a
    # user's own jobs count against. A sweep packs its points into no more jobs than this. None: no limit.
    max_jobs: int | None = None
    # The queue hands out GPUs of one node, not nodes (Sophia's by-gpu): a job's GPU count must be one of these,
    # one GPU to each rank.
    gpus: list[int] | None = None
    pick: bool = True  # chosen by a job's nodes and time when no queue is named; False: only when named


@dataclass
class JobConfig:
    """How a point is submitted to a batch scheduler. Not part of a point's identity (its config hash)."""

    account: str | None = None  # Slurm --account, LSF -G (Lassen: your bank), PBS -A (ALCF: your project)
    queue: str | None = None  # Slurm partition, LSF or PBS queue; None = picked from `queues`, else the site's default
    # The site's queues, first preferred: a named queue must take the job, else the first that does is picked
    # (launchers.site_rules). []: nothing checked, the site decides.
    queues: list[QueueConfig] = field(default_factory=list)
    time_limit_min: int = 60  # per job; `stop_margin_s` before it the ranks are stopped and recorded `timeout`
    # Seconds before the time limit when the running point's ranks get SIGTERM, save and are recorded, and no further
    # point starts: Slurm's --signal, LSF's -wa/-wt, and on PBS, which warns nobody, the job script's own timer.
    stop_margin_s: int = 120
    exclusive: bool = True  # Slurm: the nodes to this job alone (--exclusive), no other job's noise; false: shared
    # Memory of each rank, GB (Slurm: --mem of ranks per node x this); None = all of each node's memory (--mem=0)
    mem_per_worker_gb: float | None = None
    # CPU cores given to each rank; None = hardware.cores_per_node / workers_per_node
    cores_per_worker: int | None = None
    account_required: bool = False  # the site rejects jobs without an account: check it before submitting
    points_per_job: int = 1  # >1 packs that many points, one after another, into one allocation
    launcher: str | None = None  # command that starts a point's ranks; None = the scheduler's (srun, jsrun,
    # mpiexec); placeholders {ranks} {nodes} {ranks_per_node} {cores} {gpus}
    setup: list[str] = field(default_factory=list)  # shell lines before the ranks start (modules, conda, env)
    directives: list[str] = field(default_factory=list)  # extra scheduler options, e.g. "--constraint=v100"
    # Whether a job's last step records its points in the store itself; None = only into a tracking server. Else
    # it judges them and leaves them to `make collect` on the login node, the one process that writes a sqlite
    # store (many jobs writing one sqlite file over a network file system may lose a run or damage the file).
    record_in_job: bool | None = None
    # PBS: what each node's chunk asks for after `select=<nodes>:`; placeholders {ranks_per_node} {ncpus} {ngpus};
    # None = "ncpus={ncpus}:mpiprocs={ranks_per_node}:ngpus={ngpus}" (the ranks' cores and GPUs)
    select: str | None = None
    # Prefixes of the file systems the compute nodes mount: the job's python, working directory, results and
    # store must be under one. None: not checked.
    shared_paths: list[str] | None = None
    successor: str | None = None  # a retired machine: nothing is submitted; its points are priced and reported


class IntraNodeFabric(StrEnum):
    """How the GPUs of a node reach each other (`hardware.intra_node_fabric`)."""

    pcie = "pcie"  # no NVLink: through PCIe (and the CPUs' interconnect)
    nvlink_pairs = "nvlink_pairs"  # NVLink bridges two GPUs; the pairs reach each other through PCIe
    nvlink_mesh = "nvlink_mesh"  # every GPU linked directly to every other (Polaris's 4 A100s)
    nvlink_hybrid_cube_mesh = "nvlink_hybrid_cube_mesh"  # DGX-1: 8 GPUs, each linked to 4 of the others
    nvswitch = "nvswitch"  # every GPU's links go to NVSwitches: any pair at a GPU's full NVLink bandwidth


@dataclass
class HardwareConfig:
    """What the performance model needs to know about a machine: the node's numbers from its cluster file, the GPU's
    from the GPU type it lists in `defaults` (conf/cluster/gpu/, docs/clusters.md "Hardware catalog"). None: unknown.
    Bandwidths are GB/s (1e9 bytes/s) in one direction."""

    nodes: int | None = None  # nodes in the machine: a point needing more is rejected
    cores_per_node: int | None = None
    cpu: str | None = None
    cpu_memory_gb: float | None = None  # per node
    gpu: str | None = None
    device_memory_gb: float | None = None  # per GPU; on CPU, if set, per rank (held to it: suite.runtime.metrics)
    fp64_tflops: float | None = None  # peak per GPU, FP64 on the vector units (not FP64 tensor cores)
    # Dense matmul peak per device, TFLOP/s, by math dtype (fp32, tf32, bf16, fp16): the vendor's datasheet. MFU
    # divides by a measured peak (`make calibrate`) where there is one, else by this.
    peak_tflops: dict[str, float] | None = None
    fp8_tflops: float | None = None  # dense FP8 tensor-core peak per GPU (Hopper on), outside the suite's dtypes
    device_memory_bandwidth_gbs: float | None = None  # HBM (or GDDR) bandwidth of one GPU
    sm_count: int | None = None  # streaming multiprocessors per GPU
    compute_capability: float | None = None  # the GPU's (8.0: Ampere, 9.0: Hopper): which kernels it runs
    boost_clock_mhz: float | None = None  # the GPU's boost clock
    nvlink_generation: int | None = None  # None: no NVLink, or not documented
    nvlink_bandwidth_gbs: float | None = None  # one direction, all of one GPU's NVLinks together
    pcie_generation: int | None = None  # of the GPU's host link
    intra_node_fabric: IntraNodeFabric | None = None
    nic: str | None = None  # the inter-node network and its adapter, e.g. "InfiniBand HDR (ConnectX-6)"
    nics_per_node: int | None = None  # inter-node network adapters (ports) that the node's GPUs use
    nic_bandwidth_gbs: float | None = None  # one direction, one adapter
    intra_node_bandwidth_gbs: float | None = None  # GB/s, one direction, between two GPUs of a node
    # NVLink pairs: one direction, between the two GPUs of a pair (the NVLinks that join them, which on a Power9
    # node are half of a V100's: the rest go to the CPU)
    nvlink_pair_bandwidth_gbs: float | None = None
    intra_node_latency_us: float | None = None
    inter_node_bandwidth_gbs: float | None = None  # GB/s, one direction, injection bandwidth of a node
    inter_node_latency_us: float | None = None


@dataclass
class ClusterConfig:
    name: str = MISSING
    scheduler: str = "local"  # local (ranks started on this machine) | slurm | lsf | pbs
    workers_per_node: int = 1  # GPUs per node, or CPU worker processes per node
    threads_per_worker: int | None = None  # CPU intra-op threads per rank; None = cores / local ranks
    device: Device = Device.auto
    # More ranks than GPUs on a node, sharing them over gloo (NCCL refuses two ranks on one GPU): for checking the
    # GPU paths of multi-rank strategies on a one-GPU machine; its timings say nothing of scaling.
    share_gpus: bool = False
    # The GPU each rank takes, indexed by its local rank (modulo the length), where the node's GPU numbering does not
    # follow its cores' (Polaris: [3, 2, 1, 0]); None = the local rank's own number.
    gpu_order: list[int] | None = None
    tracking_uri: str | None = None  # an MLflow server the cluster's jobs report to (see `make mlflow-server`)
    # The names published GPU measurements give this system (`hardware.system`, matched whole): they are priced on it.
    systems: list[str] = field(default_factory=list)
    job: JobConfig = field(default_factory=JobConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)


@dataclass
class TrackingConfig:
    uri: str | None = None  # None = $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db
    experiment: str = "adhoc"


@dataclass
class PointConfig:
    dataset: DatasetConfig = MISSING
    network: NetworkConfig = MISSING
    strategy: Any = MISSING  # {_target_: suite.strategies.<module>.<Class>, knobs...}
    cluster: ClusterConfig = MISSING
    # Whose implementation the model prices the point as (conf/framework/): the suite's own, which is the only one a
    # sweep runs; another (`framework=megatron_lm`) is priced by `make predict` as that framework would run it.
    framework: Any = MISSING
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    grad_compression: GradCompressionConfig = field(default_factory=GradCompressionConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    math: MathConfig = field(default_factory=MathConfig)

    workers: int = 1  # ranks (one per GPU, or CPU processes)
    nodes: int | None = None  # None = ceil(workers / cluster.workers_per_node)
    batch_size: int = 32  # per worker; the strategy's batch rule turns it into the global batch
    # Gradient accumulation outside pipelines: each rank trains grad_accum micro-batches of batch_size one after the
    # other, their gradients summed, then steps once (global batch = batch_size x grad_accum x replicas); a
    # pipeline's micro-batches are its own (strategy.micro_batches).
    grad_accum: int = 1
    epochs: int = 3
    steps_per_epoch: int | None = None  # None = one full pass over the training set
    warmup_steps: int = 2  # untimed training steps before the first epoch
    eval_batches: int | None = None  # None = the whole validation set
    precision: PrecisionName = PrecisionName.fp32
    # fp8 linear layers (torchao's float8 training) under precision=bf16: none | tensorwise | rowwise; a GPU of
    # compute capability 8.9 or more (Ada, Hopper and later) runs them
    fp8: Float8Recipe = Float8Recipe.none
    # torch.compile of each decoder block (inductor), as torchtitan compiles a model; priced with its fused kernels
    compile: bool = False
    # none | every (each block) | k (every k-th block) | selective (each block's attention core: Megatron-LM's) |
    # selective_op (each decoder block under torchtitan's operator policy: matmul and attention outputs kept)
    activation_checkpointing: str = "none"
    seed: int = 0
    repeat: int = 0  # index of a repeated measurement of the same point (a sweep's `repeats`); part of its identity
    timeout_s: int = 1800  # the driver kills a point that runs longer and records `timeout`
    log_every: int = 10  # progress line every N steps
    save_final_weights: bool = False  # rank 0 writes the full state dict (used by equivalence tests)
    # The performance model's prediction recorded beside the measurement, where the cluster has a calibration
    # record (the driver profiles the network first, once per network and batch; false: neither).
    record_prediction: bool = True


@dataclass
class CalibrationSettings:
    """What `make calibrate` measures: collectives and send/recv over message sizes min_bytes x size_factor^k up
    to max_bytes, and a dense matmul per math dtype. Each measurement runs for about `seconds` (the ranks agree
    on the iterations from one timed trial), at least `min_iterations` and at most `max_iterations` times, after
    `warmup_iterations` untimed ones."""

    min_bytes: int = 4096
    max_bytes: int = 256 * 2**20
    size_factor: int = 4
    seconds: float = 0.2
    min_iterations: int = 2
    max_iterations: int = 100
    warmup_iterations: int = 1
    matmul_n: int | None = None  # n of the n x n x n product; None: 8192 on GPU, 2048 on CPU
    matmul_seconds: float = 1.0
    dtypes: list[str] | None = None  # math dtypes of the matmul; None: fp32 and bf16, and tf32 and fp16 on GPU
    # Strategies whose library overhead is then measured on probe networks here (suite.tools.overhead_probes); None:
    # every strategy's; []: none. Not by a batch cluster's job.
    probe_strategies: list[str] | None = None
    probe_passes: int = 3  # runs of each probe, in passes over all of them; its step is their median


@dataclass
class CalibrationConfig:
    """A calibration job (`make calibrate`): its ranks, where they run, where the record goes."""

    cluster: ClusterConfig = MISSING
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="calibration"))
    workers: int | None = None  # ranks; None: every GPU of `nodes` nodes (here: this machine's GPUs, else 2)
    nodes: int = 1
    timeout_s: int = 1800


def is_calibration(cfg) -> bool:
    """Whether a job's config is a calibration's (else a grid point's)."""
    return "calibration" in cfg


def register_schema() -> None:
    cs = ConfigStore.instance()
    cs.store(name="point_schema", node=PointConfig)
    cs.store(name="calibration_schema", node=CalibrationConfig)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConfig)
    cs.store(group="network", name="network_schema", node=NetworkConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
