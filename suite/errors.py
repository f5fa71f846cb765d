"""Errors that carry one readable line for the user, and SIGTERM as one (`Stopped`)."""

from __future__ import annotations

import argparse
import difflib
import re
import signal
import sys
from collections.abc import Iterable

import yaml
from hydra.errors import MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError


class ConfigError(ValueError):
    """A point that cannot run as configured. Raised before launch; the message is one line."""


class BadValue(ConfigError):
    """A value no machine or strategy could run with (a non-positive count or capacity, a name outside its choices):
    rejected even by a sweep or a prediction that lists the points it cannot run."""


class Diverged(Exception):
    """Training that no longer measures anything: a non-finite loss, or every step skipped by loss scaling. The point
    stops at once and is recorded `diverged`, with the step and the value, never `finished`."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line, `error: ...`, and exit 2, as the suite's other bad input."""

    def error(self, message: str):
        print(f"error: {message} (--help lists the options)", file=sys.stderr)
        sys.exit(2)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def yaml_error_line(error: BaseException) -> str | None:
    """`file:line:column: problem` for a YAML syntax error (or an error caused by one), else None."""
    while error is not None and not isinstance(error, yaml.MarkedYAMLError):
        error = error.__cause__ or error.__context__
    if error is None:
        return None
    mark = error.problem_mark or error.context_mark
    problem = error.problem or error.context or "YAML syntax error"
    return f"{mark.name}:{mark.line + 1}:{mark.column + 1}: {problem}" if mark else problem


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`did you mean ddp? ` for the choice nearest `name` (difflib's ratio of at least 0.6), else ''."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"did you mean {match[0]}? " if match else ""


def _cause(error: BaseException | None, kind) -> BaseException | None:
    while error is not None and not isinstance(error, kind):
        error = error.__cause__ or error.__context__
    return error


def composition_error_line(error: BaseException) -> str:
    """One line for a config that does not compose: a YAML syntax error's place, a config name or key that does not
    exist with the nearest that does (never Hydra's search path, never its `+key` advice, which would add the misspelt
    key beside the real one), a value outside its field's choices or type (`precision=fp8 is not one of fp32, bf16,
    fp16`), else Hydra's own message."""
    where = yaml_error_line(error)
    if where:
        return where
    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, name = error.missing_cfg_file.rpartition("/")
        group = group.replace("/", ".")
        options = [option for option in error.options if not option.endswith("_schema")]  # the suite's dataclasses
        return (f"{group}={name}: no such {group}; {did_you_mean(name, options)}({group}: {', '.join(options)})")
    unknown = _cause(error, (ConfigAttributeError, ConfigKeyError))
    if unknown is not None and unknown.full_key and unknown.parent_node is not None:
        parent, _, key = unknown.full_key.rpartition(".")
        given = re.search(r"use \+(\S+)", str(error))
        keys = sorted(k for k in map(str, unknown.parent_node.keys()) if not k.startswith("_") and k != "hydra")
        return (f"{given[1] if given else unknown.full_key}: {parent or 'the config'} has no key {key}; "
                f"{did_you_mean(key, keys)}(its keys: {', '.join(keys)})")
    cause = _cause(error, ValidationError)
    if cause is None or not cause.full_key:
        return " ".join(str(error).split())
    problem = str(cause).splitlines()[0]
    choices = re.fullmatch(r"Invalid value '.*', expected one of \[(.*)\]", problem)
    if choices:
        return f"{cause.full_key}={cause.value} is not one of {choices[1]}"
    return f"{cause.full_key}={cause.value}: {problem}"


class Stopped(BaseException):
    """SIGTERM arrived: the job hit its time limit, was preempted or cancelled, or the sweep was stopped.

    Before a job's time limit the job script stops its ranks with SIGTERM, or with SIGUSR2 where their launcher
    turns SIGTERM into SIGKILL (srun); LSF also sends SIGUSR2 at the run limit itself. Raised as an exception (not an
    `Exception`, so that no library's error handling swallows it) it unwinds the training loop: the epochs already
    completed are on disk, the rank writes its error report, and the point ends as `timeout`."""


def _raise_stopped(signum: int, frame) -> None:
    raise Stopped(f"stopped by {signal.Signals(signum).name} (a time limit, a preemption or a cancel)")


def raise_on_sigterm() -> None:
    for stop in (signal.SIGTERM, signal.SIGUSR2):
        signal.signal(stop, _raise_stopped)
