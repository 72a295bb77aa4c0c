"""specgym's budget allocator: vLLM's verification budget, with drafting cut too (a token-level stop per request).

The engines trim verification only: the drafter still drafts its full K for every request. A request whose budget
share is ``v`` tokens gains nothing from drafts past ``v``, so this allocator stops each request's draft at its
verified prefix. Each step, with the survivals ``s[r, j]`` of an acceptance estimator (default ``logistic``, the
online per-position model, the predictor these traces can feed) it picks the budget ``B`` maximising

    (n + sum of the B largest s) / step_ms(B)

where ``step_ms(B)`` prices the step the engine will actually run: the B slots verified, the draft phase as long as
the longest winning prefix (one draft forward per position over the requests still drafting, on a grid profile),
the KV cache, and, when the allocator is told the engine's :class:`~specgym.envs.core.switching.SwitchCosts`, the
cost of leaving the current K tier (the switch cost, the slowdown of an uncaptured tier; a tier change is only
considered where the cooldown allows one). Spec ``budget[:ESTIMATOR]``.
"""

from __future__ import annotations

import numpy as np

from specgym.baselines.acceptance_estimators import AcceptanceEstimator, make_estimator
from specgym.baselines.vllm_adaptive import MAX_SLOTS, prefixes, survival, top_slots
from specgym.envs.core.batch import BatchController, BatchDecision, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.switching import SwitchCosts


class BudgetAllocator(BatchController):
    """The rule above.

    Args:
        estimator: Where the survivals come from.
        switch_costs: The engine's switch costs, when the allocator is told them.
    """

    def __init__(self, estimator: AcceptanceEstimator | None = None, switch_costs: SwitchCosts | None = None):
        self.estimator = estimator or make_estimator("logistic")
        self.switch_costs = switch_costs
        self.name = f"budget:{self.estimator.name}"

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        super().reset(profile, k_max)
        self.estimator.reset(MAX_SLOTS, k_max)
        self.tier, self.since = -1, 1 << 30

    def propose(self, state: BatchState) -> BatchDecision:
        self.rank(state)
        return self.allocate()

    def rank(self, state: BatchState) -> None:
        """Rank the step's slots by survival and price every budget (what :meth:`allocate` chooses from)."""
        est, k, n = self.estimator, self.k_max, state.batch
        if len(state.new_slots):
            est.admit(state.new_slots)
        est.see(state)
        self.n = n
        if k == 0:
            self.top = np.zeros(0)
            return
        order, top = top_slots(survival(est.confidences(state.slots)))
        depth = order % k + 1  # the draft position each slot needs
        longest = np.concatenate(([0], np.maximum.accumulate(depth)))
        counts = None
        if self.profile.linear is None:  # per position, the requests still drafting it in each top-B set
            onehot = np.zeros((n * k + 1, k))
            onehot[np.arange(1, n * k + 1), depth - 1] = 1.0
            counts = np.cumsum(onehot, axis=0)
        cost = self.profile.budget_step_ms(n, state.kv_tokens, np.arange(n * k + 1), longest, counts)
        sw = self.switch_costs
        tier = longest
        if sw is not None and not sw.free:
            if sw.captured:  # run at the captured tier above the longest prefix
                tier = _snap(longest, sw.captured)
            cost = cost * np.array([sw.slowdown(int(t)) for t in range(k + 1)])[tier]
            if self.tier >= 0:
                cost = cost + np.where(tier != self.tier, sw.per_switch_ms, 0.0)
                if self.since < sw.cooldown_steps:  # the engine holds the tier: only allocations within it
                    cost = np.where(tier == self.tier, cost, np.inf)
        self.order, self.top, self.cost, self.longest, self.tier_of = order, top, cost, longest, tier

    def best_budget(self, gamma: float = 1.0) -> int:
        """The budget maximising gain / cost with the survivals raised to ``gamma`` (1: the rule; > 1 trusts the
        estimator less, < 1 more; the ranking of the slots is the same for every ``gamma``)."""
        if len(self.top) == 0:
            return 0
        top = self.top if gamma == 1.0 else self.top ** gamma
        gain = self.n + np.concatenate(([0.0], np.cumsum(top)))
        return int(np.argmax(gain / self.cost))

    def allocate(self, gamma: float = 1.0) -> BatchDecision:
        """The step's decision at the best budget under ``gamma`` (after :meth:`rank`)."""
        if len(self.top) == 0:
            return BatchDecision(0, 0)
        n, k = self.n, self.k_max
        budget = self.best_budget(gamma)
        verify = prefixes(self.order, budget, n, k)
        draft = verify.copy()
        tier, longest = self.tier_of, self.longest
        if n and tier[budget] > longest[budget]:  # one request drafts up to the tier the step runs at
            draft[int(np.argmax(verify))] = tier[budget]
        return BatchDecision(verify, draft)

    def observe(self, step: BatchStep) -> None:
        self.estimator.update(step)
        self.since = 0 if step.switched else self.since + 1
        self.tier = step.tier


def _snap(longest: np.ndarray, captured: tuple[int, ...]) -> np.ndarray:
    """Each longest draft rounded up to a captured tier (beyond the largest: itself)."""
    cap = np.asarray(captured)
    idx = np.searchsorted(cap, longest, side="left")
    return np.where(idx < len(cap), cap[np.minimum(idx, len(cap) - 1)], longest)
