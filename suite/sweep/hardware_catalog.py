"""Where a cluster's hardware numbers come from: its file in conf/cluster/ and the catalog entries it lists in its
`defaults` (a GPU type from conf/cluster/gpu/, a NIC from conf/cluster/nic/; docs/clusters.md, "Hardware catalog"),
so that a bad number is reported against the file that holds it, and a catalog entry that lacks a number the
performance model needs is refused."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from suite.paths import CONF_DIR, REPO_ROOT, config_file

# The catalog's config groups under conf/cluster/ and what an entry of each must give.
REQUIRED = {"gpu": ("gpu", "device_memory_gb", "device_memory_bandwidth_gbs", "peak_tflops"),
            "nic": ("nic", "nic_bandwidth_gbs")}
MISSING = object()


@dataclass(frozen=True)
class Layer:
    """One file's part of a cluster's `hardware`, in Hydra's merge order (a later layer overrides an earlier)."""

    path: Path
    group: str  # "cluster", or the catalog group of the entry ("gpu", "nic")
    hardware: dict

    def value(self, dotted: str) -> object:
        tree: object = self.hardware
        for name in dotted.split("."):
            if not isinstance(tree, dict) or name not in tree:
                return MISSING
            tree = tree[name]
        return tree


def _layers(conf_dir: Path, path: Path, group: str, chosen: dict[str, str]) -> list[Layer]:
    """The layers of one config file: its defaults (a same-group parent, catalog entries) and itself (`_self_`,
    last unless placed), with `chosen` (a child's `override <group>: <name>`) replacing a parent's choices."""
    config = yaml.safe_load(path.read_text()) or {}  # it composed: Hydra has read it already
    if group == "cluster":
        own = config.get("hardware") or {}
    else:  # a catalog entry's keys are the hardware's (its `# @package cluster.hardware`)
        own = {key: value for key, value in config.items() if key != "defaults"}
    defaults = list(config.get("defaults") or [])
    if "_self_" not in defaults:
        defaults.append("_self_")
    overrides = {key.removeprefix("override ").strip(): name for entry in defaults if isinstance(entry, dict)
                 for key, name in entry.items() if key.startswith("override ")}
    chosen = {**overrides, **chosen}
    layers = []
    for entry in defaults:
        if entry == "_self_":
            layers.append(Layer(path, group, own))
        elif isinstance(entry, str):  # a parent in the same group; `cluster_schema` is the schema, not a file
            parent = path.parent / f"{entry}.yaml"
            if parent.exists():
                layers += _layers(conf_dir, parent, group, chosen)
        else:
            for key, name in entry.items():
                if key in REQUIRED:
                    entry_file = _find(conf_dir, f"cluster/{key}/{chosen.get(key, name)}.yaml")
                    layers += _layers(conf_dir, entry_file, key, {})
    return layers


def _find(conf_dir: Path, relative: str) -> Path:
    """conf_dir/relative; for the suite's own conf/, a site directory's file where conf/ has none."""
    return config_file(relative) if conf_dir == CONF_DIR else conf_dir / relative


def cluster_layers(conf_dir: Path, cluster: str) -> tuple[Layer, ...]:
    """The layers of conf/cluster/<cluster>.yaml (or a site directory's); none for a cluster without a file (a name
    given on the command line)."""
    path = _find(conf_dir, f"cluster/{cluster}.yaml")
    return _cluster_layers(conf_dir, path) if path.exists() else ()


@functools.cache
def _cluster_layers(conf_dir: Path, path: Path) -> tuple[Layer, ...]:
    """`conf_dir` and the file's path key the cache: tests compose from copies of conf/ and site directories."""
    return tuple(_layers(conf_dir, path, "cluster", {}))


def source(cluster: str, dotted: str, value: object) -> Path | None:
    """The file that gives `hardware.<dotted>` its composed `value`; None where a command-line override set it."""
    for layer in reversed(cluster_layers(CONF_DIR, cluster)):
        found = layer.value(dotted)
        if found is not MISSING:
            return layer.path if found == value else None
    return None


def entries(cluster: str) -> dict[str, Path]:
    """The catalog entry of each group that the cluster takes its numbers from (the last one Hydra merges)."""
    return {layer.group: layer.path for layer in cluster_layers(CONF_DIR, cluster) if layer.group in REQUIRED}


def shown(path: Path) -> Path:
    """A catalog file as a user names it: from the repository's root (conf/cluster/...) where it is under it."""
    return path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
