"""The MLflow store: one run per point, with the names of the contract (DESIGN.md section 2)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from suite.paths import results_dir
from suite.vocabulary import (
    DEVICE_MEMORY,
    EPOCH_METRICS,
    MEMORY_SPLIT,
    SUMMARY_DETAILS,
    SUMMARY_METRICS,
    TRACE_BREAKDOWN,
    Status,
)

# MLflow 3 opens an experiment without this tag on its GenAI overview of traces; this kind opens the runs table.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# Summary details holding one entry per rank: the metrics recorded from each as <name>_rank<i>.
PER_RANK = {"memory_by_rank": ("peak_memory_mb", *MEMORY_SPLIT, *DEVICE_MEMORY),
            "breakdown_by_rank": TRACE_BREAKDOWN}


def tracking_uri(configured: str | None = None, cluster_default: str | None = None) -> str:
    """`tracking.uri=`, else $MLFLOW_TRACKING_URI, else the cluster's tracking server, else the sqlite file."""
    return (configured or os.environ.get("MLFLOW_TRACKING_URI") or cluster_default
            or f"sqlite:///{results_dir() / 'mlflow.db'}")


def store_uri(cfg: DictConfig) -> str:
    """The store a point reports to."""
    return tracking_uri(cfg.tracking.uri, cfg.cluster.get("tracking_uri"))


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def run_params(cfg: DictConfig, knobs: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """The flattened config, plus the short names the contract promises, the point's layout (degrees and
    batches, see suite.strategies.layout) and the strategy's own knobs."""
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    params.update(dataset=cfg.dataset.name, network=cfg.network.name, strategy=cfg.strategy.name, **layout)
    for knob, value in knobs.items():
        params.setdefault(knob, value)
    return params


class Store:
    def __init__(self, uri: str | None = None) -> None:
        self.uri = tracking_uri(uri)
        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)

    def experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:") or self.uri.startswith("file:") or "://" not in self.uri:
            location = (results_dir() / "artifacts" / name).as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
        except MlflowException:  # another writer created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if not found:
                raise
            return found.experiment_id

    def start_sweep_run(self, experiment: str, sweep: str, command: str) -> str:
        """The parent run of one sweep invocation: its points' runs are its children, its report its artifacts."""
        experiment_id = self.experiment_id(experiment)
        for key, value in EXPERIMENT_KIND.items():  # experiments created before the tag existed
            self.client.set_experiment_tag(experiment_id, key, value)
        run = self.client.create_run(experiment_id, run_name=f"sweep {sweep} {time.strftime('%Y-%m-%d %H:%M:%S')}",
                                     tags={"suite.sweep": sweep, "suite.command": command})
        return run.info.run_id

    def finish_sweep_run(self, run_id: str, report_dir: Path | None, failed: bool) -> None:
        if report_dir is not None:
            self.client.log_artifacts(run_id, str(report_dir), "report")
        self.client.set_terminated(run_id, "FAILED" if failed else "FINISHED")

    def runs(self, experiment: str, filter_string: str = "") -> list:
        found = self.client.get_experiment_by_name(experiment)
        if not found:
            return []
        return self.client.search_runs([found.experiment_id], filter_string, max_results=50000,
                                       order_by=["attributes.start_time DESC"])

    def finished_run(self, experiment: str, config_hash: str):
        runs = self.runs(experiment, f"tags.`suite.config_hash` = '{config_hash}' and tags.`suite.status` = 'finished'")
        return runs[0] if runs else None

    def latest_run(self, experiment: str, config_hash: str):
        runs = self.runs(experiment, f"tags.`suite.config_hash` = '{config_hash}'")
        return runs[0] if runs else None

    def speaking_run(self, experiment: str, config_hash: str):
        """The run that speaks for a point: its newest finished run, else its newest run (None: never run)."""
        return self.finished_run(experiment, config_hash) or self.latest_run(experiment, config_hash)

    def run_for_point_dir(self, experiment: str, point_dir: str):
        runs = self.runs(experiment, f"tags.`suite.point_dir` = '{point_dir}'")
        return runs[0] if runs else None

    def record(self, experiment: str, name: str, params: dict[str, Any], tags: dict[str, str],
               epochs: list[dict], summary: dict[str, Any], artifacts: list[Path],
               start_time: float, end_time: float) -> str:
        """Write one complete run of a point; a new run every time, nothing existing is touched."""
        undeclared = summary.keys() - {*SUMMARY_METRICS, *SUMMARY_DETAILS}
        if undeclared:  # a metric the contract does not name would be lost: say so instead
            raise ValueError(f"summary metrics {sorted(undeclared)} are not declared in suite.vocabulary")
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(e[k]), now, int(e["epoch"])) for e in epochs for k in EPOCH_METRICS if k in e]
        metrics += [Metric(k, float(summary[k]), now, 0) for k in SUMMARY_METRICS if k in summary]
        metrics += [Metric(k, float(v), now, 0) for k, v in summary.get("strategy_metrics", {}).items()]
        metrics += [Metric("step_loss", float(v), now, i) for i, v in enumerate(summary.get("step_losses", []))]
        for detail, keys in PER_RANK.items():
            for rank, values in enumerate(summary.get(detail, [])):
                metrics += [Metric(f"{key}_rank{rank}", float(values[key]), now, 0) for key in keys if key in values]
        return self.write_run(experiment, name, params, {**summary.get("run_tags", {}), **tags}, metrics, artifacts,
                              start_time, end_time)

    def write_run(self, experiment: str, name: str, params: dict[str, Any], tags: dict[str, str],
                  metrics: list[Metric], artifacts: list[Path], start_time: float, end_time: float) -> str:
        """Write one complete run, ended as its `suite.status` tag says; its id."""
        run = self.client.create_run(self.experiment_id(experiment), start_time=int(start_time * 1000),
                                     run_name=name, tags=tags)
        self.client.log_batch(run.info.run_id, metrics=metrics,
                              params=[Param(k, str(v)) for k, v in params.items()])
        for path in artifacts:
            if path.is_dir():
                self.client.log_artifacts(run.info.run_id, str(path), path.name)
            elif path.exists():
                self.client.log_artifact(run.info.run_id, str(path))
        status = "FINISHED" if tags["suite.status"] == Status.finished else "FAILED"
        self.client.set_terminated(run.info.run_id, status, end_time=int(end_time * 1000))
        return run.info.run_id
