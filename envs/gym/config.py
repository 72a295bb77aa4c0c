"""Configuration of the environments, HighwayEnv style: ``default_config()`` merged with the user's keys."""

from __future__ import annotations

from typing import Any

from specgym.errors import SpecgymError


def update_config(config: dict[str, Any], updates: dict[str, Any], what: str = "env") -> None:
    """Merge ``updates`` into ``config`` in place; a key ``config`` does not have is an error naming the valid ones."""
    unknown = sorted(set(updates) - set(config))
    if unknown:
        raise SpecgymError(f"unknown {what} config key(s) {unknown}; valid: {sorted(config)}")
    config.update(updates)
