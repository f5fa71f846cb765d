"""Each point's config from its overrides: Hydra composes conf/ (then the site config directories) against the
schema. Light on purpose (Hydra and OmegaConf, no torch): the driver composes every point before it imports the rest
of the suite, so a misspelt name or key is rejected in a second or two, with the nearest name that exists.

A grid's points differ mostly in values (workers, a learning rate, a strategy's knob), not in which files make them:
Hydra composes each distinct choice of files once (about a tenth of a second), and each point is that config with
its values set as Hydra sets them (its own `_apply_overrides_to_config`); a point that fails so is composed whole, so
that its error is Hydra's. Each point's copy of the composed config is unpickled (0.5 ms) rather than deep-copied
(2 ms, most of a point's planning)."""

from __future__ import annotations

import pickle
import sys
import time

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from suite.config import register_schema
from suite.errors import BadValue, ConfigError, composition_error_line
from suite.paths import CONF_DIR, searchpath_overrides, site_config_dirs


def compose_point(overrides: list[str]) -> DictConfig:
    """The point's config. Call inside Hydra's initialised config directory (`compose_all` does)."""
    try:
        cfg = compose(config_name="config", overrides=overrides + searchpath_overrides())
    except Exception as e:  # Hydra's and OmegaConf's errors already say which key or option is wrong
        raise ConfigError(composition_error_line(e)) from e
    return _complete(cfg, overrides)


def _complete(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:  # a config file (a site's cluster, say) that leaves a required key unset
        group = missing[0].split(".")[0]
        choice = next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith(f"{group}=")), "the default")
        raise BadValue(f"{', '.join(missing)} not set: {group}={choice}'s config file must set "
                       f"{'them' if len(missing) > 1 else 'it'}")
    return cfg


def problem_line(message: str, where: list[str], total: int) -> str:
    """One line per distinct problem: a problem of one point names it, one shared by several counts them."""
    if total == 1:
        return message
    if len(where) == 1:
        return f"{where[0]}: {message}"
    if len(where) == total:
        return f"{message} (all {total} points)"
    return f"{message} ({len(where)} of {total} points, e.g. {where[0]})"


def job_line(overrides: list[str]) -> str:
    return " ".join(overrides) or "(defaults)"


class PlanningProgress:
    """A large grid's count before it is planned (a few milliseconds a point: 10,000 take about a minute), and a line
    every few seconds while its points are `done` (composed, then checked), on stderr."""

    ANNOUNCED = 100  # points
    EVERY_S = 5.0

    def __init__(self, total: int, done: str) -> None:
        self.total, self.done, self.start = total, done, time.monotonic()
        self.shown = self.start
        if total >= self.ANNOUNCED and done == "composed":
            print(f"[plan] {total} points to plan", file=sys.stderr, flush=True)

    def show(self, done: int) -> None:
        now = time.monotonic()
        if now - self.shown >= self.EVERY_S:
            self.shown = now
            print(f"[plan] {done} of {self.total} points {self.done} in {now - self.start:.0f} s", file=sys.stderr,
                  flush=True)


class Composer:
    """Points' configs, each distinct choice of config files composed once (see the module's docstring). Use inside
    Hydra's initialised config directory."""

    def __init__(self) -> None:
        self.groups = {str(path.relative_to(directory)) for directory in (CONF_DIR, *site_config_dirs())
                       for path in directory.rglob("*") if path.is_dir()}
        self.parser = OverridesParser.create()
        self.files: dict[tuple[str, ...], bytes | None] = {}  # the pickled config; None: did not compose
        self.complete: dict[tuple[str, ...], bool] = {}  # whether the files leave no required key unset

    def _chooses_files(self, override: str) -> bool:
        key = override.split("=", 1)[0]
        return "=" not in override or key.startswith(("+", "~", "hydra.")) or key.split("@")[0] in self.groups

    def __call__(self, overrides: list[str]) -> DictConfig:
        files = tuple(o for o in overrides if self._chooses_files(o))
        values = [o for o in overrides if not self._chooses_files(o)]
        if files not in self.files:
            try:
                composed = compose(config_name="config", overrides=list(files) + searchpath_overrides())
            except Exception:  # said, as Hydra says it, by composing the point whole
                composed = None
            self.files[files] = None if composed is None else pickle.dumps(composed)
            self.complete[files] = composed is not None and not OmegaConf.missing_keys(composed)
        base = self.files[files]
        if base is None:
            return compose_point(overrides)
        cfg = pickle.loads(base)
        try:
            ConfigLoaderImpl._apply_overrides_to_config(self.parser.parse_overrides(values), cfg)
        except Exception:
            return compose_point(overrides)
        # a value cannot unset a key, but MISSING's string can set one
        return cfg if self.complete[files] and not any("???" in v for v in values) else _complete(cfg, overrides)


def compose_all(jobs: list[list[str]]) -> list[DictConfig]:
    """Every job's config, in order; a ConfigError with one line per distinct problem if any job does not compose."""
    register_schema()
    GlobalHydra.instance().clear()
    configs, problems = [], {}
    progress = PlanningProgress(len(jobs), "composed")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        composer = Composer()
        for done, overrides in enumerate(jobs):
            progress.show(done)
            try:
                configs.append(composer(overrides))
            except ConfigError as e:
                problems.setdefault(str(e), []).append(job_line(overrides))
    if problems:
        raise ConfigError("\n".join(problem_line(message, where, len(jobs)) for message, where in problems.items()))
    return configs
