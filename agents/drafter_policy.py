"""A drafter-mode exported policy as a :class:`~specgym.envs.core.drafter_choice.DrafterController` (numpy only).

It observes through :class:`~specgym.envs.core.drafter_features.DrafterFeatureTracker`, the code
``specgym/SpecDecodeDrafter-v0`` trains it with, and plays the argmax of its actor's logits as the round's
(drafter, K) (:func:`~specgym.envs.core.drafter_features.decision_of`): the same protocol in the env, the harness
and a live engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specgym.agents.policy_controller import PolicyNetwork
from specgym.envs.core.drafter_choice import DrafterController, DrafterDecision
from specgym.envs.core.drafter_features import DrafterFeatureTracker, decision_of
from specgym.envs.core.rounds import RequestContext, RoundOutcome, RoundStart
from specgym.errors import SpecgymError

if TYPE_CHECKING:  # the artifact's module imports the mode table, which imports this one
    from specgym.agents.artifact import PolicyArtifact


class DrafterPolicyController(DrafterController):
    """Runs a drafter-mode policy artifact.

    Args:
        artifact: The loaded policy (mode ``drafter``).
        name: Display name.
    """

    family = "learned"

    def __init__(self, artifact: PolicyArtifact, name: str | None = None):
        artifact.validate()
        artifact.require(("drafter",), "drafter choice")
        self.artifact = artifact
        self.name = name or "ppo-drafter"
        self.network = PolicyNetwork(artifact)
        self.tracker = DrafterFeatureTracker(artifact.k_max)

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """A note when the workload holds fewer drafters than the policy chooses between (its other slots then
        mean a plain step), so such a run is never silent."""
        names = list(getattr(workload, "drafter_names", ()))
        if len(names) < 2:
            return [f"a drafter-choice policy on a workload with one drafter ({', '.join(names) or 'draft'}): it "
                    f"chooses only that drafter's K or no draft"]
        return []

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request; the engine must allow the policy's k_max (its action space)."""
        if ctx.k_max < self.artifact.k_max:
            raise SpecgymError(f"policy {self.name} needs k_max >= {self.artifact.k_max}, the engine allows "
                               f"{ctx.k_max}")
        super().reset(ctx, drafters)
        self.tracker.reset(ctx, drafters)

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The argmax action's decision."""
        return decision_of(self.network.act(self.tracker.observation(start)), self.drafters[:2], self.artifact.k_max)

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn the verified round."""
        self.tracker.update(outcome)
