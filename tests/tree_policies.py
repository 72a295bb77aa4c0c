"""Random (untrained) tree-mode policies for tests: what a policy sees, never how well it decides."""

from __future__ import annotations

import numpy as np

from specgym.agents.artifact import PolicyArtifact
from specgym.agents.modes import get_mode
from specgym.envs.gym.tree_env import DEFAULT_SHAPES


def tree_artifact(drafter: str | None, seed: int = 0, extra: tuple[str, ...] = ()) -> PolicyArtifact:
    """A random (untrained) tree policy over the default menu (and ``extra`` entries, e.g. ``eagle:4:4:5``)."""
    row = get_mode("tree")
    names = row.features(row.feature_version)
    rng = np.random.default_rng(seed)
    dims = [len(names), 32, len(DEFAULT_SHAPES) + len(extra)]
    return PolicyArtifact(mode="tree", k_min=0, k_max=8,
                          weights=[rng.normal(0, 2 / np.sqrt(a), (b, a)).astype(np.float32)
                                   for a, b in zip(dims[:-1], dims[1:])],
                          biases=[np.zeros(b, np.float32) for b in dims[1:]], features=names,
                          feature_version=row.feature_version, shapes=[*(list(s) for s in DEFAULT_SHAPES), *extra],
                          drafter=drafter, meta={"training": {"note": "random, untrained (tests)"}})
