"""Parallelisation strategies, one module each, selected by `_target_` in conf/strategy/*.yaml."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import OmegaConf

from suite.errors import ConfigError
from suite.strategies.base import Strategy
from suite.strategies.knob_types import check_knob_types

__all__ = ["Strategy", "build_strategy"]


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
