"""Configuration of the environments, HighwayEnv style: ``default_config()`` merged with the user's keys."""

from __future__ import annotations

import numbers
import os
from typing import Any

from specgym.errors import SpecgymError


def update_config(config: dict[str, Any], updates: dict[str, Any], what: str = "env") -> None:
    """Merge ``updates`` into ``config`` in place; a key ``config`` does not have is an error naming the valid ones."""
    unknown = sorted(set(updates) - set(config))
    if unknown:
        raise SpecgymError(f"unknown {what} config key(s) {unknown}; valid: {sorted(config)}")
    config.update(updates)


def int_key(config: dict[str, Any], key: str, lo: int = 0, allow_none: bool = False, what: str = "env") -> int | None:
    """``config[key]`` as an int >= ``lo`` (a whole number; ``None`` if ``allow_none``), else a one-line error."""
    value = config[key]
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise SpecgymError(f"{what} config {key}: expected an integer >= {lo}{' or None' if allow_none else ''}, "
                           f"got {value!r}")
    return int(value)


def source_key(config: dict[str, Any], key: str, types: tuple[type, ...], allow_none: bool = False,
               what: str = "env") -> Any:
    """``config[key]`` if it names a file (str or path) or is one of ``types``, else a one-line error."""
    value = config[key]
    if (value is None and allow_none) or isinstance(value, (str, os.PathLike, *types)):
        return value
    names = ["a name", "a path", *[f"a {t.__name__}" for t in types], *(["None"] if allow_none else [])]
    raise SpecgymError(f"{what} config {key}: expected {', '.join(names[:-1])} or {names[-1]}, got {value!r}")


def check_reset_options(options: dict[str, Any] | None, valid: tuple[str, ...]) -> None:
    """Refuse ``reset(options=...)`` keys the env does not read (a typo would otherwise be ignored silently)."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise SpecgymError(f"reset options: expected a dict, got {options!r}")
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise SpecgymError(f"unknown reset option(s) {unknown}; valid: {list(valid)}")
