"""What a point's run holds and what its tags say about it: the params recorded (the flattened config and the
contract's short names), the digest that says they are unchanged, the verdict tags and the status a run reads as."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from suite.shared_names import Status


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def run_params(cfg: DictConfig, knobs: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """The flattened config, plus the short names the contract promises, the point's layout (degrees and
    batches, see suite.layout) and the strategy's own knobs."""
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    params.update(dataset=cfg.dataset.name, network=cfg.network.name, strategy=cfg.strategy.name, **layout)
    for knob, value in knobs.items():
        params.setdefault(knob, value)
    return params


INCOMPLETE = "incomplete"  # the status of a point's run whose recording stopped part-way (a full disk, a crash)
# The status of a point's run whose params are no longer those it was recorded with (its store edited by hand): its
# config hash no longer says what it measured, so neither the report nor a resumed sweep trusts it.
INCONSISTENT = "inconsistent"
PARAMS_DIGEST = "suite.params_digest"
# The tags that say how a point ended: Store.write_run writes them after everything else, just before it ends the run.
VERDICT = ("suite.status", "suite.error")


def params_digest(params: dict[str, Any]) -> str:
    """A digest of a run's params as MLflow keeps them (strings), recorded with the run and checked when it is read."""
    return hashlib.sha256(json.dumps(sorted((k, str(v)) for k, v in params.items())).encode()).hexdigest()[:16]


def complete(run) -> bool:
    """Whether a point's run was recorded to the end: Store.write_run writes its verdict (`suite.status`) and then
    ends it (`ended_as`), last of all; a run ended without its verdict (KILLED by a recorder that found it
    half-written) is not."""
    return run.info.status in ("FINISHED", "FAILED", "KILLED") and "suite.status" in run.data.tags


def ended_as(tags: dict[str, str]) -> str:
    """MLflow's status of a point's run: FINISHED, KILLED where the sweep was stopped during it (`suite.interrupted`:
    Ctrl-C or a scheduler's SIGTERM; its `suite.status` says failed or timeout), else FAILED."""
    if tags["suite.status"] == Status.finished:
        return "FINISHED"
    return "KILLED" if "suite.interrupted" in tags else "FAILED"



def source_tags(git_sha: str) -> dict[str, str]:
    """MLflow's standard run metadata, which its UI shows in the Source, Version and User columns: the code (the
    suite's commit, left out where it is unknown: an installed wheel), what ran it, and who."""
    commit = {"mlflow.source.git.commit": git_sha} if git_sha != "unknown" else {}
    return {**commit, "mlflow.source.name": "suite", "mlflow.source.type": "LOCAL", "mlflow.user": user()}


def user() -> str:
    """Who runs this: the login name, else the uid (a container's user may have no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def run_status(run) -> str:
    """How a point ended as its run says (the `suite.status` tag); `incomplete` if the run is not complete,
    `inconsistent` if its params are not those it was recorded with."""
    if not complete(run):
        return INCOMPLETE
    digest = run.data.tags.get(PARAMS_DIGEST)  # runs recorded before the digest was have none
    if digest is not None and digest != params_digest(run.data.params):
        return INCONSISTENT
    return run.data.tags.get("suite.status", "?")

