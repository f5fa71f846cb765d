"""Sweep files and Hydra's sweep syntax: conf/sweep/<name>.yaml read and checked, and override lines expanded into
the jobs a sweep plans (suite.sweep.plan)."""

from __future__ import annotations

import itertools

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from suite.errors import ConfigError, yaml_error_line
from suite.paths import config_file, config_names, name_problem


def parse_overrides(overrides: list[str]) -> list[Override]:
    """Hydra's parse of the overrides; ConfigError naming the first that is not one."""
    without_value = [o for o in overrides if "=" not in o and not o.startswith("~")]  # `~key` deletes a key
    if without_value:
        raise ConfigError(f"{without_value[0]!r} is not an override: give key=value, e.g. strategy=ddp")
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:  # its message's last line links Hydra's grammar
        problem = " ".join(line.strip() for line in e.message.splitlines()[:-1])
        raise ConfigError(f"override {e.override!r} does not parse: {problem}") from e


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Hydra's own sweep syntax, as its basic sweeper expands it: `strategy=single,ddp workers=1,2` is the cartesian
    product, `range(0,3)` three values."""
    parsed = parse_overrides(overrides)
    if not multirun:
        sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
        if sweeps:
            raise ConfigError(f"{sweeps[0]!r} is a sweep: add -m (--multirun) to run every value")
        return [overrides]
    choices: dict[str, list[str]] = {}  # a key given twice keeps its first place and its last value, as Hydra's
    for override in parsed:
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            raise ConfigError(f"{override.input_line!r} is not a list of values to run (e.g. optimizer.lr=0.1,0.01)")
    return [list(job) for job in itertools.product(*choices.values())]


SWEEP_KEYS = ("workloads", "common", "points", "repeats", "invalid_points", "report", "study_settings")


def sweep_file(name: str) -> DictConfig:
    """conf/sweep/<name>.yaml: `common` overrides, `points` (one override line each, or `line:` and the `clusters:`
    it runs on, where a study ran some frameworks on some of its machines only), optional `workloads` (named
    override lines that points and `common` reuse through OmegaConf interpolation, `- ${workloads.gpt2}
    strategy=ddp workers=1,2`), `repeats` (each point measured that many times, `repeat=0..N-1`), `invalid_points`
    (reject | record), `report` (the tables and figures of its report, see analysis.views) and `study_settings`
    (what a study's sweep runs unlike the suite's defaults, each a `setting` and its `source`: the report's
    caption; not part of any point). Its interpolations are checked here and resolved as it is read; an override
    that interpolates the point's own config escapes it: `\\${dataset.name}`."""
    problem = name_problem(name)
    if problem:
        raise ConfigError(f"sweep name {name!r} {problem}")
    path = config_file(f"sweep/{name}.yaml")
    if not path.exists():
        known = ", ".join(config_names("sweep"))
        raise ConfigError(f"no sweep {name!r} in conf/sweep (known: {known})")
    try:
        sweep = OmegaConf.load(path)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error_line(e) or f"{path}: {' '.join(str(e).split())}") from e
    if not isinstance(sweep, DictConfig) or not sweep.get("points"):
        what = "has no points" if isinstance(sweep, DictConfig) else "is not a mapping"
        raise ConfigError(f"{path}: {what} (a sweep file maps `points` to a list of override lines)")
    unknown = sorted(set(sweep.keys()) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"sweep {name}: unknown key(s) {', '.join(unknown)} (known: {', '.join(SWEEP_KEYS)})")
    workloads = OmegaConf.to_container(sweep, resolve=False).get("workloads", {})
    if not isinstance(workloads, dict) or not all(isinstance(line, str) for line in workloads.values()):
        raise ConfigError(f"sweep {name}: workloads is not a mapping of names to override lines")
    _check_interpolations(name, sweep, workloads)
    if sweep.get("invalid_points", "reject") not in ("reject", "record"):
        raise ConfigError(f"sweep {name}: invalid_points={sweep.invalid_points} is not reject or record")
    settings = OmegaConf.to_container(sweep).get("study_settings", [])
    if not isinstance(settings, list) or not all(isinstance(s, dict) and s.keys() == {"setting", "source"}
                                                 and all(isinstance(v, str) for v in s.values()) for s in settings):
        raise ConfigError(f"sweep {name}: study_settings is not a list of `setting: ..., source: ...` entries")
    _check_points(name, OmegaConf.to_container(sweep, resolve=True).get("points", []))
    repeats = sweep.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"sweep {name}: repeats={repeats} is not a positive integer")
    return sweep


def _check_points(name: str, points) -> None:
    clusters = config_names("cluster")
    for entry in points if isinstance(points, list) else [points]:
        if isinstance(entry, str):
            continue
        if not (isinstance(entry, dict) and entry.keys() == {"line", "clusters"} and isinstance(entry["line"], str)
                and isinstance(entry["clusters"], list) and entry["clusters"]):
            raise ConfigError(f"sweep {name}: point {entry!r} is neither an override line nor `line: ..., clusters: "
                              "[...]`")
        unknown = [c for c in entry["clusters"] if c not in clusters]
        if unknown:
            raise ConfigError(f"sweep {name}: point {entry['line']!r} names cluster(s) {', '.join(map(str, unknown))}"
                              f" (known: {', '.join(clusters)})")


def _check_interpolations(name: str, sweep: DictConfig, workloads: dict) -> None:
    """ConfigError naming the sweep, the entry and the key, for an interpolation (`${workloads.gpt2}`) that names
    nothing, before any of it is read."""
    try:
        OmegaConf.to_container(sweep, resolve=True)
    except OmegaConfBaseException as e:
        problem = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = f" {e.full_key}:" if getattr(e, "full_key", None) else ""
        raise ConfigError(f"sweep {name}:{where} {problem} (workloads: {', '.join(workloads) or 'none'})") from e


def repeat_overrides(repeats: int) -> list[str]:
    """Each point measured `repeats` times: the repeat index is part of its identity (config hash), so that
    resuming skips the repeats that finished and no run is overwritten."""
    if repeats < 1:
        raise ConfigError(f"repeats must be positive, got {repeats}")
    return [f"repeat=range(0,{repeats})"] if repeats > 1 else []


def _lines(name: str, repeats: int | None) -> list[tuple[list[str], tuple[str, ...]]]:
    """Each point's override line, `common` first, repeated `repeats` times (default: the file's), and the clusters it
    runs on (none named: every cluster)."""
    sweep = sweep_file(name)
    common = list(sweep.get("common", []))
    repeat = repeat_overrides(repeats or sweep.get("repeats", 1))
    return [(common + entry.split() + repeat, ()) if isinstance(entry, str)
            else (common + entry["line"].split() + repeat, tuple(entry["clusters"]))
            for entry in OmegaConf.to_container(sweep, resolve=True)["points"]]


def sweep_lines(name: str, repeats: int | None = None) -> list[list[str]]:
    """The override lines of a sweep file, `common` first, each repeated `repeats` times (default: the file's)."""
    return [line for line, _ in _lines(name, repeats)]


def default_cluster() -> str:
    """The cluster of a point that names none (conf/config.yaml's defaults)."""
    defaults = OmegaConf.load(config_file("config.yaml")).defaults
    return next(entry.cluster for entry in defaults if isinstance(entry, DictConfig) and "cluster" in entry)


def sweep_jobs(name: str, overrides: list[str], repeats: int | None = None) -> list[list[str]]:
    """The jobs of a sweep file with the command line's `overrides` (every line a sweep): a line that names the
    clusters it runs on gives none on another cluster."""
    default = default_cluster()
    jobs = []
    for line, clusters in _lines(name, repeats):
        for job in expand(line + overrides, multirun=True):
            cluster = next((o.split("=", 1)[1] for o in reversed(job) if o.startswith("cluster=")), default)
            if not clusters or cluster in clusters:
                jobs.append(job)
    return jobs
