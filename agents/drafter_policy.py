"""A drafter-mode exported policy as a :class:`~specgym.envs.core.drafter_choice.DrafterController` (numpy only).

It observes through :class:`~specgym.envs.core.drafter_features.DrafterFeatureTracker`, the code
``specgym/SpecDecodeDrafter-v0`` trains it with, and plays the argmax of its actor's logits as the round's
(drafter, K) (:func:`~specgym.envs.core.drafter_features.decision_of`): the same protocol in the env, the harness
and a live engine. The tracker computes the feature version the artifact records, so a policy trained before the
online features (version 2) sees exactly the vector it was trained on.

**The guard** (as a chain policy's, :mod:`specgym.agents.policy_controller`): a policy exported with the range of
every feature it saw in training and the teacher ``drafter-marginal`` hands a round whose observation leaves that
range to the teacher, which runs in lockstep (fitted in :meth:`DrafterPolicyController.prepare` on the workload's
fit split, as the rule itself is) and so decides with its state warm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specgym.agents.policy_controller import PolicyNetwork, RangeGuard
from specgym.baselines.drafter_marginal import DrafterMarginal
from specgym.envs.core.drafter_choice import DrafterController, DrafterDecision
from specgym.envs.core.drafter_features import SLOTS, DrafterFeatureTracker, decision_of, feature_bounds
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
        # the vector of the version it was trained on (a version-2 policy: version 3's prefix, exactly)
        self.tracker = DrafterFeatureTracker(artifact.k_max, artifact.feature_version)
        self.teacher: DrafterMarginal | None = None
        self.guard: RangeGuard | None = None
        if artifact.teacher is not None and artifact.obs_low is not None:
            self.teacher = DrafterMarginal()
            self.guard = RangeGuard(artifact, *feature_bounds(artifact.feature_version), self.name)

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Fit the teacher (a guarded policy); a note when the workload holds fewer drafters than the policy
        chooses between (its other slots then mean a plain step), so such a run is never silent."""
        if self.teacher is not None:
            self.teacher.prepare(workload, profile)
        names = list(getattr(workload, "drafter_names", ()))
        if len(names) < 2:
            return [f"a drafter-choice policy on a workload with one drafter ({', '.join(names) or 'draft'}): it "
                    f"chooses only that drafter's K or no draft"]
        return []

    def guard_stats(self) -> dict[str, Any] | None:
        """The guard's record (None without one), as a chain policy's."""
        return None if self.guard is None else self.guard.stats()

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request; the engine must allow the policy's k_max (its action space)."""
        if ctx.k_max < self.artifact.k_max:
            raise SpecgymError(f"policy {self.name} needs k_max >= {self.artifact.k_max}, the engine allows "
                               f"{ctx.k_max}")
        super().reset(ctx, drafters)
        self.tracker.reset(ctx, drafters)
        if self.teacher is not None:
            self.teacher.reset(ctx, drafters)

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The argmax action's decision; outside the training range, the teacher's."""
        obs = self.tracker.observation(start)
        if self.teacher is not None:
            taught = self.teacher.propose(start)
            if self.guard is not None and self.guard.outside(obs):
                return taught
        return decision_of(self.network.act(obs), self.drafters[:SLOTS], self.artifact.k_max)

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn the verified round (the teacher too)."""
        self.tracker.update(outcome)
        if self.teacher is not None:
            self.teacher.observe(outcome)
