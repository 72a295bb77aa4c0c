"""A batch-mode exported policy as a :class:`~specgym.envs.core.batch.BatchController` (numpy only).

It observes through :class:`~specgym.envs.core.batch.BatchFeatureTracker`, the code ``specgym/SpecDecodeBatch-v0``
trains it with, and picks the argmax of its actor's logits as the step's K.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specgym.agents.policy_controller import PolicyNetwork
from specgym.envs.core.batch import BatchController, BatchFeatureTracker, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.errors import SpecgymError

if TYPE_CHECKING:  # the artifact's module imports the mode table, which imports this one
    from specgym.agents.artifact import PolicyArtifact


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

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        if k_max < self.artifact.k_max:
            raise SpecgymError(f"policy {self.name} needs k_max >= {self.artifact.k_max}, the engine allows {k_max}")
        super().reset(profile, k_max)
        self.tracker.reset(profile)

    def propose(self, state: BatchState) -> int:
        return self.network.act(self.tracker.observation(state))

    def observe(self, step: BatchStep) -> None:
        self.tracker.update(step)
