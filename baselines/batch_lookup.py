"""Batch-aware prompt-lookup K (``batch-marginal``): each step, every request's K priced with the serving engine's
own measured step costs at the step's batch size.

In a serving engine a request's draft tokens are verified in the same forward as every other request's, so they cost
the whole batch: at batch 16 on a CPU one more token in the step costs about what a whole sequence's token does,
at batch 1 a fraction of the step. A single-request cost profile cannot see this; a batched cost profile
(:class:`~specgym.envs.core.batch_cost.BatchCostProfile`) can: the step time ``S(b, x)`` of ``b`` sequences verifying
``x`` drafts each on average (:meth:`~specgym.envs.core.batch_cost.BatchCostProfile.budget_step_ms`), measured in the
engine itself (``specgym bench vllm --proposer specgym`` measures it in vLLM with the proposer drafting exactly K
filler tokens per row, :func:`specgym.envs.engines.serving.vllm_profile.step_profile`), interpolated linearly in
``x`` and in ``b``.

**The choice** (:meth:`BatchLookupK.choose`). The lookup runs first; row ``i`` has ``L_i`` candidate tokens (0: no
match) and ``P_i(j)``, the probability that its first ``j`` are all accepted, from acceptance counts per draft
position, pooled over requests by the lookup's match length (Beta prior) and shrunk towards the request's own counts.
The step produces ``b + sum_i E_i`` tokens, ``E_i = P_i(1) + ... + P_i(K_i)``, in ``S(b, sum_i K_i / b)``. Taking the
candidate tokens in decreasing ``P`` (each row's in order: ``P_i`` falls with ``j``), the rule keeps the prefix that
maximises tokens per ms; no prefix beating ``b / S(b, 0)`` gives K = 0 for every row. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specgym.envs.core.batch_cost import BatchCostProfile

#: The spec name (``batch-marginal[:FILE]``, FILE a batched cost profile measured in the serving engine).
NAME = "batch-marginal"
#: The measuring rule (``fill:K``): every row drafts exactly K copies of its last token, to time a step verifying K
#: drafts per row (the batched profile :class:`BatchLookupK` prices with).
FILL = "fill"


@dataclass
class RequestCounts:
    """One request's acceptance counts per draft position: ``tried[j]`` drafts that reached position ``j`` (the
    ones before it accepted), ``accepted[j]`` of them accepted."""

    tried: np.ndarray
    accepted: np.ndarray


class BatchLookupK:
    """The batch-aware K of every row of a step (module docstring).

    Args:
        profile: The serving engine's batched cost profile (step time by batch size and tokens verified).
        k_max: The largest K.
        max_n: The longest n-gram the lookup matches (pooled counts per match length ``1..max_n``).
        prior_mean: Prior acceptance of a draft token (before any is judged).
        prior_strength: Pseudo-counts of that prior.
        request_strength: Pseudo-counts of the pooled estimate against a request's own counts.
    """

    def __init__(self, profile: BatchCostProfile, k_max: int, max_n: int = 4, prior_mean: float = 0.35,
                 prior_strength: float = 2.0, request_strength: float = 4.0):
        profile.check_k_max(k_max)
        self.profile = profile
        self.k_max, self.max_n = int(k_max), int(max_n)
        self.prior = (float(prior_mean) * prior_strength, (1.0 - float(prior_mean)) * prior_strength)
        self.request_strength = float(request_strength)
        self.name = NAME
        self.tried = np.zeros((self.max_n + 1, self.k_max))
        self.accepted = np.zeros((self.max_n + 1, self.k_max))

    def new_request(self) -> RequestCounts:
        """Fresh counts for a request the proposer starts tracking."""
        return RequestCounts(np.zeros(self.k_max), np.zeros(self.k_max))

    def observe(self, req: RequestCounts, match_n: int, drafted: int, accepted: int) -> None:
        """The step verified ``drafted`` tokens of a lookup of match length ``match_n`` and accepted ``accepted``."""
        if drafted <= 0:
            return
        reached = min(int(accepted) + 1, int(drafted))  # positions judged: the accepted ones and the first rejected
        ok = np.arange(reached) < accepted
        n = min(max(int(match_n), 0), self.max_n)
        self.tried[n, :reached] += 1.0
        self.accepted[n, :reached] += ok
        req.tried[:reached] += 1.0
        req.accepted[:reached] += ok

    def survival(self, req: RequestCounts, match_n: int, length: int) -> np.ndarray:
        """``P(1) .. P(length)``: the probability that the first ``j`` candidate tokens are all accepted."""
        n = min(max(int(match_n), 0), self.max_n)
        a, b = self.prior
        pooled = (self.accepted[n, :length] + a) / (self.tried[n, :length] + a + b)
        s = self.request_strength
        q = (req.accepted[:length] + s * pooled) / (req.tried[:length] + s)
        return np.cumprod(q)

    def choose(self, rows: list[tuple[RequestCounts, int, int]], batch: int) -> np.ndarray:
        """K per row of a step of ``batch`` sequences; ``rows``: ``(counts, match length, candidate tokens)`` each
        (0 candidates: the lookup found nothing, K = 0)."""
        ks = np.zeros(len(rows), dtype=np.int64)
        values, owner = [], []
        for i, (req, n, length) in enumerate(rows):
            length = min(int(length), self.k_max)
            if length > 0:
                values.append(self.survival(req, n, length))
                owner.append(np.full(length, i))
        if not values:
            return ks
        p, who = np.concatenate(values), np.concatenate(owner)
        order = np.argsort(-p, kind="stable")  # each row's tokens stay in order (P falls with j; ties keep order)
        b = max(int(batch), 1)
        gain = b + np.concatenate([[0.0], np.cumsum(p[order])])
        cost = self.step_ms(b, len(p))
        best = int(np.argmax(gain / cost))
        np.add.at(ks, who[order[:best]], 1)
        return ks

    def step_ms(self, batch: int, most: int) -> np.ndarray:
        """``out[t]``: a step of ``batch`` sequences verifying ``t = 0..most`` drafts in all, non-decreasing in ``t``
        (a running maximum: noise on a busy machine can make more drafts look cheaper, which no engine step is)."""
        verified = np.arange(most + 1, dtype=np.float64)
        ms = self.profile.budget_step_ms(batch, 0, verified, (verified > 0).astype(np.float64))
        return np.maximum.accumulate(ms)
