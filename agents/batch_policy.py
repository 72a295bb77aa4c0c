"""A batch-mode exported policy as a :class:`~specgym.envs.core.batch.BatchController` (numpy only).

It observes through :class:`~specgym.envs.core.batch.BatchFeatureTracker`, the code ``specgym/SpecDecodeBatch-v0``
trains it with, and picks the argmax of its actor's logits as the step's K.

**The guard** (as a chain policy's, :mod:`specgym.agents.policy_controller`): a policy exported with the range of
every feature it saw in training and the teacher ``goodput`` hands a step whose observation leaves that range to the
goodput rule, which the tracker already computes (its last feature, :meth:`BatchFeatureTracker.goodput_k`), so the
teacher decides with its state warm. :func:`batch_decision` is that one decision; ``specgym export --to sglang``
copies it into its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from specgym.agents.policy_controller import PolicyNetwork, RangeGuard
from specgym.envs.core.batch import BATCH_FEATURE_NAMES, BatchController, BatchFeatureTracker, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.errors import SpecgymError

if TYPE_CHECKING:  # the artifact's module imports the mode table, which imports this one
    from specgym.agents.artifact import PolicyArtifact

#: The bound range of every batch feature (each is clipped to 1, the draft ratio to 2: ``BATCH_FEATURE_DOCS``): the
#: guard's margin is a share of it.
BATCH_FEATURE_LOW = np.zeros(len(BATCH_FEATURE_NAMES))
BATCH_FEATURE_HIGH = np.array([2.0 if name == "draft_ratio" else 1.0 for name in BATCH_FEATURE_NAMES])


def batch_decision(network: Any, tracker: Any, guard: Any, state: Any) -> int:
    """The step's K: the actor's argmax on the tracker's observation; where ``guard`` (a :class:`RangeGuard`, or
    None) finds the observation outside the training range, the goodput rule's K, the policy's teacher."""
    obs = tracker.observation(state)
    if guard is not None and guard.outside(obs):
        return tracker.goodput_k(state.batch)
    return network.act(obs)


class BatchPolicyController(BatchController):
    """Runs a batch-mode policy artifact.

    Args:
        artifact: The loaded policy (mode ``batch``).
        name: Display name.
    """

    def __init__(self, artifact: PolicyArtifact, name: str | None = None):
        artifact.validate()
        artifact.require(("batch",), "a serving-step policy controller")
        self.artifact = artifact
        self.name = name or "ppo-batch"
        self.network = PolicyNetwork(artifact)
        self.tracker = BatchFeatureTracker(artifact.k_max)
        self.guard: RangeGuard | None = None
        if artifact.teacher is not None and artifact.obs_low is not None:
            self.guard = RangeGuard(artifact, BATCH_FEATURE_LOW, BATCH_FEATURE_HIGH, self.name)

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        if k_max < self.artifact.k_max:
            raise SpecgymError(f"policy {self.name} needs k_max >= {self.artifact.k_max}, the engine allows {k_max}")
        super().reset(profile, k_max)
        self.tracker.reset(profile)

    def propose(self, state: BatchState) -> int:
        return batch_decision(self.network, self.tracker, self.guard, state)

    def observe(self, step: BatchStep) -> None:
        self.tracker.update(step)

    def guard_stats(self) -> dict[str, Any] | None:
        """The guard's record (None without one), as a chain policy's."""
        return None if self.guard is None else self.guard.stats()
