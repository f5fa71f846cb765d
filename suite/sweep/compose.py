"""Each point's config from its overrides: Hydra composes conf/ (then the site config directories) against the
schema. Light on purpose (Hydra and OmegaConf, no torch): the driver composes every point before it imports the rest
of the suite, so a misspelt name or key is rejected in a second or two, with the nearest name that exists."""

from __future__ import annotations

import sys
import time

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from suite.config import register_schema
from suite.errors import BadValue, ConfigError, composition_error_line
from suite.paths import CONF_DIR, searchpath_overrides


def compose_point(overrides: list[str]) -> DictConfig:
    """The point's config. Call inside Hydra's initialised config directory (`compose_all` does)."""
    try:
        cfg = compose(config_name="config", overrides=overrides + searchpath_overrides())
    except Exception as e:  # Hydra's and OmegaConf's errors already say which key or option is wrong
        raise ConfigError(composition_error_line(e)) from e
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
    """A large grid's count before it is planned (composing a point takes about a tenth of a second), and a line every
    few seconds while it is, on stderr."""

    ANNOUNCED = 100  # points
    EVERY_S = 5.0

    def __init__(self, total: int) -> None:
        self.total, self.start = total, time.monotonic()
        self.shown = self.start
        if total >= self.ANNOUNCED:
            print(f"[plan] {total} points to plan", file=sys.stderr, flush=True)

    def show(self, done: int) -> None:
        now = time.monotonic()
        if now - self.shown >= self.EVERY_S:
            self.shown = now
            print(f"[plan] {done} of {self.total} points planned in {now - self.start:.0f} s", file=sys.stderr,
                  flush=True)


def compose_all(jobs: list[list[str]]) -> list[DictConfig]:
    """Every job's config, in order; a ConfigError with one line per distinct problem if any job does not compose."""
    register_schema()
    GlobalHydra.instance().clear()
    configs, problems = [], {}
    progress = PlanningProgress(len(jobs))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for done, overrides in enumerate(jobs):
            progress.show(done)
            try:
                configs.append(compose_point(overrides))
            except ConfigError as e:
                problems.setdefault(str(e), []).append(job_line(overrides))
    if problems:
        raise ConfigError("\n".join(problem_line(message, where, len(jobs)) for message, where in problems.items()))
    return configs
