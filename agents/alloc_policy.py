"""The learned allocator (mode ``alloc``): a policy that sets the budget of specgym's budget allocator each step.

The budget rule (:class:`~specgym.baselines.budget_allocator.BudgetAllocator`) ranks every (request, draft
position) slot of the step by its survival and verifies (and drafts) the top ``B``; ``B`` maximises the expected
tokens per step time. Given calibrated survivals that ranking is the right split across requests: the gain is a sum
over slots and the price depends only on ``B`` and the longest winning prefix. What the rule gets wrong is the
*budget*: the online estimator is miscalibrated by load, request age and position (it learns from the labels of
the prefixes it verified), and a step's gain ignores what the next steps lose. So the policy chooses, each step,
a calibration exponent ``gamma`` from :data:`ALLOC_GAMMAS`: the budget maximises ``(n + sum of the B largest
s**gamma) / step_ms(B)`` (``gamma = 1`` is the rule, the behaviour-cloning teacher; larger trusts the estimator
less). The ranking, and so the split, is the rule's for every ``gamma``.

Observation (:data:`ALLOC_FEATURE_NAMES`): the batch features of
:class:`~specgym.envs.core.batch.BatchFeatureTracker`, plus what the survivals of the step say (the rule's budget
per slot, the mean survival, the survival of the rule's last verified slot, the mean survival of the first draft
position). :class:`AllocCore` computes them for the env (``specgym/SpecDecodeAlloc-v0``), behaviour cloning and
the exported controller alike. The survivals come from the budget rule's default estimator, ``logistic``, or, for
a run given an acceptance predictor (``--hyperparams predictor=NAME``), from that predictor on the drafter's signals
of the step's drafts (``budget:predictor:NAME``, the engine's ``draft_view``); the predictor is embedded in the
exported policy, and the rule with the same estimator is the teacher and the validation reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specgym.agents.policy_controller import PolicyNetwork
from specgym.baselines.acceptance_estimators import DraftView, make_estimator
from specgym.baselines.budget_allocator import BudgetAllocator
from specgym.envs.core.acceptance_predictor import AcceptancePredictor
from specgym.envs.core.batch import (
    BATCH_FEATURE_DOCS,
    BATCH_FEATURE_NAMES,
    BatchController,
    BatchDecision,
    BatchFeatureTracker,
    BatchState,
    BatchStep,
)
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.switching import SwitchCosts
from specgym.errors import SpecgymError

if TYPE_CHECKING:  # the artifact's module imports the mode table, which imports this one
    from specgym.agents.artifact import PolicyArtifact

#: The action menu: calibration exponents of the survivals (index :data:`TEACHER_ACTION` is the budget rule).
ALLOC_GAMMAS = (0.5, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0, 3.0)
TEACHER_ACTION = ALLOC_GAMMAS.index(1.0)
#: The estimator behind the survivals (the budget rule's default).
ALLOC_ESTIMATOR = "logistic"

ALLOC_FEATURE_NAMES = (*BATCH_FEATURE_NAMES, "rule_budget", "mean_survival", "marginal_survival", "first_survival")
ALLOC_FEATURE_DOCS = (*BATCH_FEATURE_DOCS, "the budget rule's B / (batch * k_max)",
                      "mean survival over every slot of the step", "survival of the rule's last verified slot",
                      "mean survival of the first draft position over the batch")


def teacher(predictor: AcceptancePredictor | None = None) -> BudgetAllocator:
    """The budget rule an alloc policy calibrates (its behaviour-cloning teacher and validation reference)."""
    if predictor is None:
        return BudgetAllocator(make_estimator(ALLOC_ESTIMATOR))
    return BudgetAllocator(DraftView(predictor, "policy"))


class AllocCore:
    """The budget rule plus the observation of the learned allocator: one object for the env and the controller.

    Lifecycle per run: ``reset(profile, k_max)``; per step ``observation(state)`` -> ``decide(action)`` ->
    ``update(step)``.

    Args:
        k_max: Largest draft per request.
        predictor: The acceptance predictor behind the survivals (``None``: the ``logistic`` estimator).
    """

    def __init__(self, k_max: int, predictor: AcceptancePredictor | None = None):
        self.k_max = int(k_max)
        self.predictor = predictor
        self.rule = teacher(predictor)
        self.tracker = BatchFeatureTracker(self.k_max)

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        """A new run on hardware priced by ``profile``."""
        self.rule.reset(profile, k_max)
        self.tracker.reset(profile)

    def observation(self, state: BatchState) -> np.ndarray:
        """The observation before a step (ranks and prices the step's slots)."""
        rule = self.rule
        rule.rank(state)
        base = self.tracker.observation(state)
        top = rule.top
        if len(top) == 0:
            extra = np.zeros(4, np.float32)
        else:
            b = rule.best_budget(1.0)
            first = float(top[rule.order % self.k_max == 0].mean())
            extra = np.array([b / len(top), float(top.mean()), float(top[b - 1]) if b else 1.0, first], np.float32)
        return np.concatenate([base, extra]).astype(np.float32)

    def decide(self, action: int) -> BatchDecision:
        """The step's decision under the ``action``-th calibration exponent."""
        return self.rule.allocate(ALLOC_GAMMAS[int(action)])

    def update(self, step: BatchStep) -> None:
        """Fold one verified step in."""
        self.rule.observe(step)
        self.tracker.update(step)


class AllocPolicyController(BatchController):
    """Runs an ``alloc``-mode policy artifact (numpy only): the argmax of its actor picks the step's ``gamma``.

    Args:
        artifact: The loaded policy (mode ``alloc``).
        name: Display name.
    """

    def __init__(self, artifact: PolicyArtifact, name: str | None = None):
        artifact.validate()
        artifact.require(("alloc",), "the learned allocator")
        self.artifact = artifact
        self.name = name or "alloc-ppo"
        self.network = PolicyNetwork(artifact)
        self.predictor = (None if artifact.predictor is None else
                          AcceptancePredictor.from_dict(artifact.predictor, where=f"policy {self.name}"))
        self.core = AllocCore(artifact.k_max, self.predictor)

    @property
    def estimator(self) -> object:
        """The survivals' estimator (a harness gives the engine its ``workload_signal``, as for the rules)."""
        return self.core.rule.estimator

    @property
    def switch_costs(self) -> SwitchCosts | None:
        """The engine's switch costs, when the allocator is told them (the rule then prices tier changes)."""
        return self.core.rule.switch_costs

    @switch_costs.setter
    def switch_costs(self, value: SwitchCosts | None) -> None:
        self.core.rule.switch_costs = value

    def teacher(self) -> BudgetAllocator:
        """A fresh copy of the rule this policy calibrates."""
        return teacher(self.predictor)

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        if k_max < self.artifact.k_max:
            raise SpecgymError(f"policy {self.name} needs k_max >= {self.artifact.k_max}, the engine allows {k_max}")
        super().reset(profile, k_max)
        told = self.switch_costs
        self.core = AllocCore(self.artifact.k_max, self.predictor)
        self.core.rule.switch_costs = told
        self.core.reset(profile, self.artifact.k_max)

    def propose(self, state: BatchState) -> BatchDecision:
        return self.core.decide(self.network.act(self.core.observation(state)))

    def observe(self, step: BatchStep) -> None:
        self.core.update(step)
