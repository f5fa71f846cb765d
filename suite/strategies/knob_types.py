"""Strategy knobs against the types their dataclass fields declare.

Hydra hands a strategy's knobs to its class as the command line spelt them, unchecked: `static_graph=maybe`
arrives as the string "maybe". Checked right after the strategy is built, before anything uses it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from suite.errors import BadValue


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Literal:
        return value in args
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an integer is a number too: bucket_cap_mb=25
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value if args)
    if origin is dict:
        return isinstance(value, dict) and (not args or all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()))
    return isinstance(value, origin or hint)


def _describe(hint: Any) -> str:
    """What a value of `hint` is, in the words of the one-line error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "null"
    if origin is typing.Literal:
        return f"one of {', '.join(map(str, args))}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin in (list, tuple):
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if origin is dict:
        return "a mapping"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return words.get(hint, f"a {getattr(hint, '__name__', hint)}")


def check_knob_types(strategy) -> None:
    """Raise ConfigError naming the first knob of `strategy` (a dataclass) whose value does not fit its field's type."""
    hints = typing.get_type_hints(type(strategy))
    for field in dataclasses.fields(strategy):
        value = getattr(strategy, field.name)
        if not _matches(value, hints[field.name]):
            raise BadValue(f"strategy {strategy.name}: {field.name}={value} is not {_describe(hints[field.name])}")
