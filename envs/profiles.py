"""Cost profiles by shipped name or path: the one place that resolves a profile name through the data catalogue.

The cost model itself (:mod:`specgym.envs.core.cost`, :mod:`specgym.envs.core.batch_cost`) reads no catalogue: the
core layer takes paths and objects from above (``tests/test_structure.py``). The writers live beside the formats
(:func:`~specgym.envs.core.cost.save_profile`, :func:`~specgym.envs.core.batch_cost.save_batch_profile`) and check
what they write with the same rules these readers apply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import specgym.catalogue as catalogue
from specgym.envs.core.batch_cost import BatchCostProfile, batch_profile_from_json
from specgym.envs.core.cost import CostProfile
from specgym.errors import SpecgymError
from specgym.io import read_text


def read_profile_json(name_or_path: str | Path, kind: str = "profile") -> tuple[Path, dict[str, Any]]:
    """The path and the parsed JSON object of a shipped (by name) or given profile file."""
    path = catalogue.resolve(kind, name_or_path)
    try:
        data = json.loads(read_text(path, "cost profile (JSON)"))
    except json.JSONDecodeError as exc:
        raise SpecgymError(f"{path}: not valid JSON ({exc.msg.removesuffix(' at')} at line {exc.lineno})") from None
    return path, data


def load_profile(name_or_path: str | Path) -> CostProfile:
    """Load a profile by shipped name (``speclane-table``) or by path to a JSON file."""
    path, data = read_profile_json(name_or_path)
    return CostProfile.from_dict(data, where=str(path))


def load_batch_profile(name_or_path: str | Path) -> BatchCostProfile:
    """A batched profile by shipped name (``batch-cpu-midpair``) or path to a JSON file."""
    path, data = read_profile_json(name_or_path, "batch_profile")
    return batch_profile_from_json(data, str(path))
