"""The marginal rule over drafters (``drafter-marginal[:ADAPT]``): the (drafter, K) of most expected tokens per ms.

Rule: before each round, for every drafter ``d`` and cap ``K`` (``K = 0``: a plain step), predict the round's tokens
``E_d(K) = 1 + sum_{j<=K} P(run_d >= j)`` (:class:`~specgym.envs.core.run_predictor.RunPredictor`, from the context
lookup and the position) and its cost ``time_d(K, kv)`` (the cost profile's round table of ``d`` at the request's KV
cache), and play the pair with the largest ``E_d(K) / time_d(K, kv)``: the decision that maximises the expected
rate of this round (the marginal rule's objective, :mod:`specgym.baselines.marginal`, with the drafter as a second
choice).

**Recent acceptance.** Each drafter's predicted accepted tokens are scaled by how that drafter did on this request so
far: ``c_d`` = an exponential average (weight ``ADAPT`` per round, default 0.3) of its accepted drafts over their
predicted ``E_d(drafted) - 1``, started at 1 (both sides censored at the drafted count, so the ratio is unbiased).
``ADAPT = 0``: the predictor alone.

The predictor is fitted on the **train split** of the workload being served (:meth:`DrafterMarginal.prepare`), or
given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterController, DrafterDecision
from specgym.envs.core.rounds import RequestContext, RoundOutcome, RoundStart
from specgym.envs.core.run_predictor import MAX_RUN, RunPredictor
from specgym.envs.engines.trace_engine import TraceEngine
from specgym.errors import SpecgymError


def fit_on_train(workload: Any, profile: CostProfile) -> RunPredictor:
    """A :class:`RunPredictor` of every drafter of ``workload``, counted on its train split."""
    train = workload.split_indices("train")
    if len(train) == 0:
        raise SpecgymError(f"workload {workload.name!r} has no 'train' split to fit the run predictor on")
    engine = TraceEngine(workload, profile, 1)
    idx = np.concatenate([np.arange(workload.offsets[r], workload.offsets[r + 1]) for r in train.tolist()])
    position = np.concatenate([np.arange(int(n)) for n in workload.lengths[train]])
    lookup = workload.lookup_len[idx] if workload.lookup_len is not None else None
    runs = {d: engine.runs(d)[idx] for d in workload.drafter_names}
    return RunPredictor.fit(runs, lookup, position, {"workload": workload.name, "split": "train"})


class DrafterMarginal(DrafterController):
    """Most predicted tokens per unit time over every (drafter, K).

    Args:
        predictor: A fitted run predictor (``None``: fitted in :meth:`prepare`).
        adapt: Weight of each round in a drafter's recent-acceptance scale (0: none).
    """

    family = "predictor"

    def __init__(self, predictor: RunPredictor | None = None, adapt: float = 0.3) -> None:
        if not 0.0 <= adapt <= 1.0:
            raise SpecgymError(f"drafter-marginal: ADAPT must be in [0, 1], got {adapt!r}")
        self.predictor, self.adapt = predictor, float(adapt)
        self._given = predictor is not None
        self.name = "drafter-marginal" if adapt == 0.3 else f"drafter-marginal:{adapt:g}"
        self._tables: dict[tuple[int, int, str], tuple[np.ndarray, np.ndarray]] = {}
        self._kinds: dict[str, str] = {}
        self._scale: dict[str, float] = {}
        self._caps = np.arange(1, MAX_RUN + 2, dtype=np.float64)  # a round with cap K produces at most K + 1

    def prepare(self, workload: Any, profile: CostProfile) -> None:
        """Fit the predictor on the workload's train split (unless one was given); learn its drafters' kinds."""
        self._kinds = {d: str(workload.drafter_info(d)["kind"]) for d in workload.drafter_names}
        if not self._given:
            self.predictor = fit_on_train(workload, profile)

    def _costs(self, drafter: str) -> tuple[np.ndarray, np.ndarray]:
        prof, k_max = self.ctx.profile, self.ctx.k_max
        key = (id(prof), k_max, drafter)
        got = self._tables.get(key)
        if got is None:
            table = prof.round_table(k_max, prof.pricing_drafter(drafter, self._kinds.get(drafter)))
            got = self._tables[key] = (table.base, table.per_kv)
        return got

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request: every drafter's recent-acceptance scale back to 1."""
        super().reset(ctx, drafters)
        if self.predictor is None:
            raise SpecgymError(f"{self.name} has no run predictor: call prepare(workload, profile) first")
        self.check_drafters([d for d in self.predictor.drafters if d in drafters] or list(self.predictor.drafters))
        self._use = [d for d in drafters if d in self.predictor.drafters]
        self._scale = {d: 1.0 for d in self._use}
        self._start = RoundStart(0, ctx.prompt_len, -1)

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The (drafter, K) of the largest predicted rate."""
        k_max = self.ctx.k_max
        best, best_dec = -1.0, DrafterDecision(NO_DRAFTER, 0)
        assert self.predictor is not None
        for d in self._use:
            exp = self.predictor.expected_tokens(d, start.lookup_len, start.position)[: k_max + 1]
            exp = np.minimum(1.0 + self._scale[d] * (exp - 1.0), self._caps[: k_max + 1])
            base, per_kv = self._costs(d)
            rate = exp / (base + per_kv * start.kv)
            k = int(np.argmax(rate))
            if rate[k] > best:
                best, best_dec = float(rate[k]), DrafterDecision(d if k else NO_DRAFTER, k)
        self._start = start
        return best_dec

    def observe(self, outcome: RoundOutcome) -> None:
        """Update the drafter's recent-acceptance scale from a verified round."""
        d = outcome.drafter
        if self.adapt == 0.0 or outcome.drafted == 0 or d not in self._scale or self.predictor is None:
            return
        pred = float(self.predictor.expected_tokens(d, self._start.lookup_len, self._start.position)[
            min(outcome.drafted, MAX_RUN)]) - 1.0
        ratio = outcome.accepted / pred if pred > 1e-6 else 1.0
        self._scale[d] = (1.0 - self.adapt) * self._scale[d] + self.adapt * min(ratio, 4.0)

