"""Parallelisation strategies, one module each, selected by `_target_` in conf/strategy/*.yaml."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf
from packaging.version import Version

from suite.errors import ConfigError
from suite.paths import REPO_ROOT, config_file, config_names
from suite.strategies.base import Library, Strategy, check_knob_types

__all__ = ["Strategy", "build_strategy", "label", "missing_library", "older_torch", "strategy_class", "strategy_names"]


def build_strategy(cfg) -> Strategy:
    """Instantiate the strategy of a point; an unknown knob, or one of the wrong type, is a ConfigError naming it."""
    node = cfg.strategy
    try:
        strategy = instantiate(node, _convert_="all")
    except Exception as e:  # hydra wraps the constructor's TypeError in InstantiationException
        cause = e.__cause__ or e
        name = OmegaConf.select(node, "name", default="?")
        raise ConfigError(f"strategy {name}: {str(cause).splitlines()[0]}") from e
    if not isinstance(strategy, Strategy):
        raise ConfigError(f"strategy _target_ {node._target_} is not a suite Strategy")
    check_knob_types(strategy)
    return strategy


@functools.cache
def strategy_class(name: str) -> type[Strategy] | None:
    """The spec class that conf/strategy/<name>.yaml (or a site config directory's) selects (its `_target_`): the one
    place a strategy's facts are declared, which the predictor and the reports ask; None for a name no config has
    (a run recorded by another version of the suite)."""
    path = config_file(f"strategy/{name}.yaml")
    target = OmegaConf.load(path).get("_target_") if path.exists() else None
    return get_class(target) if target else None


def strategy_names() -> list[str]:
    """Every configured strategy (conf/strategy/*.yaml and the site config directories')."""
    return config_names("strategy")


def label(name: str) -> str:
    """The name studies and reports give strategy `name` (its spec's `label`), else `name` itself."""
    spec = strategy_class(name)
    return (spec.label if spec else "") or name


def missing_library(strategy: Strategy) -> str | None:
    """Why this environment cannot start the strategy's ranks, in one line: a library it requires that is not
    installed in it (its module, or a script of it the launch runs from beside the interpreter); None if none."""
    venv = Path(sys.prefix)
    shown = ".venv" if venv == REPO_ROOT / ".venv" else str(venv)  # as the Makefile's VENV names it
    for library in strategy.requires:
        if (importlib.util.find_spec(library.module) is None
                or not all(Path(sys.executable).with_name(script).exists() for script in library.executables)):
            return f"{library.name} is not installed in {shown}: run `{install_command(library, shown)}`"
    return None


def older_torch(strategy: Strategy, present: str) -> str | None:
    """Why a torch of version `present` (the environment's that runs the ranks) cannot run the strategy's ranks, in
    one line; None if it can. Releases are compared, so that a pre-release of a version (NVIDIA's containers ship
    torch 2.6.0a0+git...) counts as that version."""
    if Version(present).release >= Version(strategy.needs_torch).release:
        return None
    return f"strategy {strategy.name} needs torch >= {strategy.needs_torch}, this environment has torch {present}"


def install_command(library: Library, venv: str) -> str:
    """What installs `library` into the environment `venv`: its own make target, or for a dependency of the suite
    `make setup`, once the stamp that says all of them are installed is gone."""
    make_venv = "" if venv == ".venv" else f" VENV={venv}"
    stamp = f"rm -f {venv}/.installed-* && " if library.make_target == "setup" else ""
    return f"{stamp}make {library.make_target}{make_venv}"
