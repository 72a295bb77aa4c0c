"""vLLM adaptive verification (``enable_adaptive_verification``; vllm#47808, the online estimator #52228; v0.32).

As ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`` runs it (read, not copied), each step:

1. each request's per-position confidences from the *previous* step (a new request: 1.0) give survival
   probabilities ``s[r, j] = prod_{i <= j} c[r, i]``;
2. the draft budget ``B`` maximises

       (num_sampling_requests + sum of the B largest s) / (draft_cost[num_requests] + verify_cost[non_draft + B])

   over ``B = 0 .. num_requests * K`` (``non_draft``: one sampled token per request);
3. the ``B`` slots with the highest survival are verified, which gives every request a prefix (survival falls along
   a request's draft);
4. the drafter still drafts its full ``K``: only verification is trimmed.

The cost tables come from the batched profile the engine prices with (vLLM profiles its own at start-up: draft cost
by request count, verify cost by total tokens, padded to the CUDA-graph capture sizes); this rule is given the
batch's KV total too (``BatchState.kv_tokens``), like every budget rule here, so the rules differ only in their
allocation. The confidences come from an :mod:`~specgym.baselines.acceptance_estimators` estimator (default
``ema``: vLLM's EMA of confidence, alpha 0.8).
"""

from __future__ import annotations

import numpy as np

from specgym.baselines.acceptance_estimators import AcceptanceEstimator, make_estimator
from specgym.envs.core.batch import BatchController, BatchDecision, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile

#: Slots an estimator holds (the CLI's largest batch).
MAX_SLOTS = 4096


def survival(conf: np.ndarray) -> np.ndarray:
    """``s[r, j] = prod_{i <= j} c[r, i]``."""
    return np.cumprod(conf, axis=1)


def top_slots(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, sorted_s)``: the flat (request-major) slots by falling survival, ties in request-major order, so
    that any top-B set is a prefix of every request's draft."""
    flat = s.ravel()
    order = np.argsort(-flat, kind="stable")
    return order, flat[order]


def prefixes(order: np.ndarray, budget: int, n: int, width: int) -> np.ndarray:
    """Tokens verified per request when the first ``budget`` slots of ``order`` win."""
    return np.bincount(order[:budget] // width, minlength=n).astype(np.int64)


class VLLMAdaptiveVerification(BatchController):
    """The rule above. Spec ``vllm-adaptive[:ESTIMATOR]``.

    Args:
        estimator: Where the confidences come from.
        num_speculative_tokens: The drafter's ``K`` (``None``: the engine's ``k_max``).
    """

    def __init__(self, estimator: AcceptanceEstimator | None = None, num_speculative_tokens: int | None = None):
        self.estimator = estimator or make_estimator("ema")
        self.num_speculative_tokens = num_speculative_tokens
        self.name = f"vllm-adaptive:{self.estimator.name}"

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        super().reset(profile, k_max)
        self.k = min(self.num_speculative_tokens or k_max, k_max)
        self.estimator.reset(MAX_SLOTS, self.k)

    def propose(self, state: BatchState) -> BatchDecision:
        est, k, n = self.estimator, self.k, state.batch
        if len(state.new_slots):
            est.admit(state.new_slots)
        est.see(state)
        if k == 0:
            return BatchDecision(0, 0)
        order, top = top_slots(survival(est.confidences(state.slots)))
        gain = n + np.concatenate(([0.0], np.cumsum(top)))
        cost = self.profile.budget_step_ms(n, state.kv_tokens, np.arange(n * k + 1), k)
        budget = int(np.argmax(gain / cost))
        return BatchDecision(prefixes(order, budget, n, k), k)

    def observe(self, step: BatchStep) -> None:
        self.estimator.update(step)
