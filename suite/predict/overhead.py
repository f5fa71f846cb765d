"""What a strategy's library costs per step beyond the model's compute and collectives: measured on probe
networks by `make calibrate`, added to every prediction of the suite's model.

The model prices a step from a profile of the plain network and the calibrated collectives. A strategy's library
does more per step than either holds: DeepSpeed's engine (its flat buffers, the fp32 partition's copies), the
per-module hooks of ZeRO-3 and FSDP, DTensor's dispatch under `megatron`, Horovod's background thread and its
negotiation per tensor, a pipeline schedule's bookkeeping. Each strategy runs three probe networks that no
benchmark scores (GPT-2: two narrow blocks, two wide blocks, eight narrow blocks) through the sweep driver like
any point, in several passes over all of them (the median of a probe's runs); what its measured step takes
beyond the model's prediction is fitted as a fixed time, a time per parameter byte (copies into and out of flat
buffers) and a time per parameter tensor (hooks, messages and kernel launches per tensor), solved from the three
probes. The per-byte and per-tensor terms are no less than 0 (a wider or deeper network is not cheaper to hook;
where one would be, the fit goes without it); the fixed term is signed: where the model prices a strategy too
dearly on the probes, it takes that back. The overhead is a rank's CPU work: on a node whose ranks share its
cores more crowded than the probes' (more ranks than cores run at once), it grows with the ranks to a core.

The probes run on the calibration's workers (`single` on one): kept per cluster in
results/calibration/<cluster>.overhead.yaml (the latest) and <cluster>.w<workers>.overhead.yaml (the latest of
each number of workers) beside the calibration records, per `correction_key` (ZeRO-3 apart from stages 1-2); a
point takes the fit of the number of workers nearest its own. Where there is none, the model adds nothing and
says so.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from suite.errors import ConfigError
from suite.predict.correction import correction_key
from suite.predict.links import nearest
from suite.records.calibration import calibration_files, read_record, reading, record_path
from suite.strategies.base import Strategy
from suite.vocabulary import Status

EXPERIMENT = "library_overhead"  # the probes' runs
PROBE = ["dataset=tokens", "network=gpt2_tiny", "dataset.seq_len=32", "dataset.samples=256",
         "dataset.val_samples=16", "batch_size=8", "epochs=2", "warmup_steps=2", "steps_per_epoch=8",
         "log_every=100", "eval_batches=1", "optimizer.name=adam", "optimizer.lr=0.001"]
NARROW = ["network.n_embd=32", "network.n_head=2", "dataset.vocab_size=256"]
SHAPES = {"narrow": ["network.n_layer=2", *NARROW],  # 0.13 MB in 28 tensors
          "wide": ["network.n_layer=2", "network.n_embd=512", "network.n_head=4", "dataset.vocab_size=4096"],  # 32 MB
          "deep": ["network.n_layer=8", *NARROW]}  # 0.42 MB in 100 tensors
# Per correction key, the strategy as its probes run it: on the calibration's workers (at least two) but `single`.
STRATEGIES = {
    "single": ["strategy=single", "workers=1"],
    "ddp": ["strategy=ddp"],
    "horovod": ["strategy=horovod"],
    "zero": ["strategy=zero", "strategy.zero_stage=1"],
    "zero3": ["strategy=zero", "strategy.zero_stage=3"],
    "fsdp": ["strategy=fsdp"],
    "megatron": ["strategy=megatron", "strategy.tp=2"],
    "gpipe": ["strategy=gpipe", "strategy.micro_batches=4"],
    "gpipe_dist": ["strategy=gpipe_dist", "strategy.micro_batches=4"],
    "1f1b": ["strategy=1f1b", "strategy.micro_batches=4"],
    "pipedream": ["strategy=pipedream"],
}


def probe_overrides(key: str, workers: int) -> list[str]:
    """A strategy's probe settings on a calibration of `workers` ranks."""
    own = STRATEGIES[key]
    return own if any(o.startswith("workers=") for o in own) else [*own, f"workers={max(workers, 2)}"]


@dataclass(frozen=True)
class Overhead:
    fixed_s: float
    per_byte_s: float  # per byte of the network's parameters
    per_tensor_s: float  # per parameter tensor
    crowding: float = 1.0  # the probes' ranks per slot of their node's cores (predictor.crowding)
    workers: int = 2  # the probes'

    def step_s(self, param_bytes: float, param_tensors: int, crowding: float | None = None) -> float:
        """On a node whose ranks share its cores `crowding` to a slot: the overhead is a rank's CPU work (Python,
        hooks, copies), which takes longer in proportion to the share of a core the rank gets."""
        scale = 1.0 if crowding is None else crowding / self.crowding
        return (self.fixed_s + self.per_byte_s * param_bytes + self.per_tensor_s * param_tensors) * scale


@dataclass(frozen=True)
class Probe:
    """One probe point, per training step."""

    key: str
    param_bytes: float
    param_tensors: int
    predicted_s: float
    measured_s: float  # the median of its passes'
    passes_s: tuple[float, ...] = ()  # each run's step
    crowding: float = 1.0  # ranks per slot of its node's cores
    workers: int = 2

    @property
    def residual_s(self) -> float:
        return self.measured_s - self.predicted_s


def fit(probes: list[Probe]) -> dict[str, Overhead]:
    """Per key, the least-squares fit of its probes' residuals: a fixed term, and of the per-byte and per-tensor
    terms those that the probes tell apart and that come out no less than 0 (the subset that fits best)."""
    fits = {}
    for key in dict.fromkeys(p.key for p in probes):
        mine = [p for p in probes if p.key == key]
        residuals = np.array([p.residual_s for p in mine])
        columns = {"per_byte_s": np.array([p.param_bytes for p in mine], dtype=float),
                   "per_tensor_s": np.array([p.param_tensors for p in mine], dtype=float)}
        best: tuple[float, Overhead] | None = None
        for size in (0, 1, 2):
            for terms in itertools.combinations(columns, size):
                scale = [max(columns[t].max(), 1.0) for t in terms]  # columns of one magnitude: a conditioned matrix
                a = np.column_stack([np.ones(len(mine)), *(columns[t] / s for t, s in zip(terms, scale))])
                if np.linalg.matrix_rank(a) < a.shape[1]:
                    continue
                solution = np.linalg.lstsq(a, residuals, rcond=None)[0]
                if any(solution[1:] < 0):
                    continue
                error = float(np.sum((a @ solution - residuals) ** 2))
                if best is None or error < best[0] - 1e-15:  # fewer terms first: one that adds nothing is left out
                    terms_s = {t: float(v / s) for t, v, s in zip(terms, solution[1:], scale)}
                    best = error, Overhead(float(solution[0]), terms_s.get("per_byte_s", 0.0),
                                           terms_s.get("per_tensor_s", 0.0), max(p.crowding for p in mine),
                                           max(p.workers for p in mine))
        fits[key] = best[1]
    return fits


def overhead_path(cluster: str, workers: int | None = None) -> Path:
    """The latest probes' fits, or with `workers` the latest of a calibration of that many workers."""
    return record_path(cluster).with_name(f"{cluster}{'' if workers is None else f'.w{workers}'}.overhead.yaml")


@dataclass(frozen=True)
class LibraryOverhead:
    """A cluster's measured overheads: per correction key and number of workers probed, the newest fit and where
    it comes from."""

    fits: dict[str, dict[int, tuple[Overhead, str]]]

    def measured(self, strategy: Strategy, workers: int, fewer_workers: bool = False) -> tuple[Overhead, str] | None:
        """The fit for the strategy probed on the number of workers nearest `workers` (`fewer_workers`: fewer than
        them only), and its source; None where none was."""
        probed = {count: found for count, found in self.fits.get(correction_key(strategy), {}).items()
                  if not fewer_workers or count < workers}
        return probed[nearest(probed, workers)] if probed else None


def load(cluster: str) -> LibraryOverhead | None:
    """Every overhead file of the cluster (the latest and the latest of each number of workers probed)."""
    newest: dict[tuple[str, int], tuple[str, Overhead, str]] = {}
    for path in calibration_files(cluster, "overhead"):
        record = read_record(path)
        with reading(path):
            date = str(record["date"])
            for key, f in record["strategies"].items():  # files of before per-tensor terms, crowding, workers: none
                fitted = Overhead(float(f["fixed_s"]), float(f["per_byte_s"]), float(f.get("per_tensor_s", 0.0)),
                                  float(f.get("crowding", 1.0)), int(f.get("workers", 1 if key == "single" else 2)))
                if (key, fitted.workers) not in newest or date > newest[key, fitted.workers][0]:
                    newest[key, fitted.workers] = date, fitted, f"{path.name} (probes of {date})"
    if not newest:
        return None
    fits: dict[str, dict[int, tuple[Overhead, str]]] = {}
    for (key, workers), (_, fitted, source) in sorted(newest.items()):
        fits.setdefault(key, {})[workers] = fitted, source
    return LibraryOverhead(fits)


def save(cluster: str, probes: list[Probe], run_ids: list[str], workers: int) -> Path:
    """The fits and the probes they were solved from, of a calibration of `workers` ranks: as the cluster's latest
    and the latest of that many."""
    strategies = {key: {"fixed_s": f.fixed_s, "per_byte_s": f.per_byte_s, "per_tensor_s": f.per_tensor_s,
                        "crowding": f.crowding, "workers": f.workers,
                        "probes": [{"param_bytes": p.param_bytes, "param_tensors": p.param_tensors,
                                    "predicted_s": p.predicted_s, "measured_s": p.measured_s,
                                    "passes_s": list(p.passes_s)}
                                   for p in probes if p.key == key]}
                  for key, f in fit(probes).items()}
    record = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "experiment": EXPERIMENT, "runs": run_ids,
              "strategies": strategies}
    text = ("# Per-step overhead of each strategy's library beyond the performance model, measured on probe networks\n"
            "# by `make calibrate` (suite/predict/overhead.py). Seconds, bytes and tensors.\n"
            + yaml.safe_dump(record, sort_keys=False))
    for path in (overhead_path(cluster, workers), overhead_path(cluster)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def check_keys(keys: list[str]) -> None:
    unknown = sorted(set(keys) - STRATEGIES.keys())
    if unknown:
        raise ConfigError(f"calibration.probe_strategies: {', '.join(unknown)} not among {', '.join(STRATEGIES)}")


def measure(cluster: str, keys: list[str], passes: int, workers: int) -> Path:
    """Run the probes of `keys` on `cluster` here on `workers` ranks (`probe_overrides`), `passes` times over all of
    them (a new run each: a probe's runs are minutes apart, and one that a swing of the machine slowed is
    outvoted), fit and save their overheads."""
    from suite.predict.predictor import crowding, workload
    from suite.predict.step import step_time
    from suite.records.store import Store, store_uri
    from suite.sweep.driver import run_sweep
    from suite.sweep.plan import plan

    check_keys(keys)
    probes = [[*PROBE, *shape, *probe_overrides(key, workers), f"cluster={cluster}"] for key in keys
              for shape in SHAPES.values()]
    points = plan([[*probe, f"repeat={n}"] for n in range(passes) for probe in probes], experiment=EXPERIMENT)
    which = {point.config_hash: index % len(probes) for index, point in enumerate(points)}
    store = Store(store_uri(points[0].cfg))
    priced: dict[int, tuple[str, float, int, float]] = {}
    placed: dict[int, tuple[float, int]] = {}  # crowding, workers
    steps: dict[int, list[float]] = {}
    run_ids = []
    for outcome in run_sweep(points, store, force=True):
        if outcome.status != Status.finished:
            raise ConfigError(f"probe {outcome.point.label} ({' '.join(outcome.point.overrides)}) "
                              f"{outcome.status}: {outcome.error} (run {outcome.run_id})")
        probe = which[outcome.point.config_hash]
        if probe not in priced:
            w, _, _ = workload(outcome.point)
            priced[probe] = (correction_key(outcome.point.strategy), w.profile.param_bytes, w.profile.param_tensors,
                             step_time(w).total)
            placed[probe] = crowding(outcome.point), outcome.point.cfg.workers
        metrics = store.client.get_run(outcome.run_id).data.metrics
        steps.setdefault(probe, []).append(metrics["epoch_time_s_mean"] / metrics["steps_per_epoch"])
        run_ids.append(outcome.run_id)
    measured = [Probe(*priced[i], statistics.median(steps[i]), tuple(steps[i]), *placed[i]) for i in range(len(probes))]
    return save(cluster, measured, run_ids, workers)
