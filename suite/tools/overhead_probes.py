"""The library-overhead probes of `make calibrate`: each strategy's probe networks run through the sweep driver
like any point, then priced by the model, whose difference from the measured step `suite.predict.library_overhead` fits.
Measuring lives here, beside calibration, because it needs both the sweep and the predictor, neither of which
imports the other."""

from __future__ import annotations

import statistics
from pathlib import Path

from suite.errors import ConfigError
from suite.predict.library_overhead import EXPERIMENT, Probe, save
from suite.predict.predictor import crowding, workload
from suite.predict.step import step_time
from suite.records.store import Store, store_uri
from suite.shared_names import Status
from suite.strategies import missing_library, strategy_class, strategy_names
from suite.sweep.driver import run_sweep
from suite.sweep.plan import plan

PROBE = ["dataset=tokens", "network=gpt2_tiny", "dataset.seq_len=32", "dataset.samples=256",
         "dataset.val_samples=16", "batch_size=8", "epochs=2", "warmup_steps=2", "steps_per_epoch=8",
         "log_every=100", "eval_batches=1", "optimizer.name=adam", "optimizer.lr=0.001"]
NARROW = ["network.n_embd=32", "network.n_head=2", "dataset.vocab_size=256"]
SHAPES = {"narrow": ["network.n_layer=2", *NARROW],  # 0.13 MB in 28 tensors
          "wide": ["network.n_layer=2", "network.n_embd=512", "network.n_head=4", "dataset.vocab_size=4096"],  # 32 MB
          "deep": ["network.n_layer=8", *NARROW]}  # 0.42 MB in 100 tensors
def probe_settings() -> dict[str, list[str]]:
    """Per overhead key, the strategy as its probes run it (each strategy's `probes`): on the calibration's workers
    (at least two) unless they say otherwise (`single`)."""
    return {key: [f"strategy={name}", *overrides] for name in strategy_names()
            for key, overrides in strategy_class(name).probes().items()}


def probe_overrides(key: str, workers: int) -> list[str]:
    """A strategy's probe settings on a calibration of `workers` ranks."""
    own = probe_settings()[key]
    return own if any(o.startswith("workers=") for o in own) else [*own, f"workers={max(workers, 2)}"]


def check_keys(keys: list[str]) -> None:
    known = probe_settings()
    unknown = sorted(set(keys) - known.keys())
    if unknown:
        raise ConfigError(f"calibration.probe_strategies: {', '.join(unknown)} not among {', '.join(known)}")


def installed_keys() -> tuple[list[str], list[str]]:
    """Every probe key whose strategy's library this environment has, and the lines saying which it has not."""
    keys, missing = [], []
    for key, overrides in probe_settings().items():
        spec = strategy_class(overrides[0].removeprefix("strategy="))
        lacking = missing_library(spec)
        (missing.append(f"{key}: {lacking}") if lacking else keys.append(key))
    return keys, missing


def measure(cluster: str, keys: list[str], passes: int, workers: int) -> Path:
    """Run the probes of `keys` on `cluster` here on `workers` ranks (`probe_overrides`), `passes` times over all of
    them (a new run each: a probe's runs are minutes apart, and one that a swing of the machine slowed is
    outvoted), fit and save their overheads."""
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
            priced[probe] = (outcome.point.strategy.overhead_key, w.profile.param_bytes, w.profile.param_tensors,
                             step_time(w).total)
            placed[probe] = crowding(outcome.point), outcome.point.cfg.workers
        metrics = store.client.get_run(outcome.run_id).data.metrics
        steps.setdefault(probe, []).append(metrics["epoch_time_s_mean"] / metrics["steps_per_epoch"])
        run_ids.append(outcome.run_id)
    measured = [Probe(*priced[i], statistics.median(steps[i]), tuple(steps[i]), *placed[i]) for i in range(len(probes))]
    return save(cluster, measured, run_ids, workers)
