"""What a strategy's library costs per step beyond the model's compute and collectives: measured on probe
networks by `make calibrate` (suite.tools.overhead_probes), fitted here, added to every prediction of the suite's
model.

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
each number of workers) beside the calibration records, per strategy `overhead_key` (ZeRO-3 apart from stages 1-2); a
point takes the fit of the number of workers nearest its own. Where there is none, the model adds nothing and
says so.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from suite.paths import calibration_files, read_record, reading, record_path
from suite.predict.links import nearest
from suite.strategies.base import Strategy

EXPERIMENT = "library_overhead"  # the runs of the probes (suite.tools.overhead_probes) a fit is solved from


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
        probed = {count: found for count, found in self.fits.get(strategy.overhead_key, {}).items()
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
            "# by `make calibrate` (suite/predict/library_overhead.py). Seconds, bytes and tensors.\n"
            + yaml.safe_dump(record, sort_keys=False))
    for path in (overhead_path(cluster, workers), overhead_path(cluster)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path
