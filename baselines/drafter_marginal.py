"""The marginal rule over drafters (``drafter-marginal``): the (drafter, K) of most expected tokens per ms.

Rule: before each round, for every drafter ``d`` and cap ``K`` (``K = 0``: a plain step), predict the round's tokens
``E_d(K) = 1 + sum_{j<=K} P(run_d >= j)`` (:class:`~specgym.envs.core.run_predictor.RunPredictor`, from the context
lookup, the position and the previous round's outcome) and its cost ``time_d(K, kv)`` (the cost profile's round
table of ``d`` at the request's KV cache), and play the pair with the largest ``E_d(K) / time_d(K, kv)``: the
decision that maximises the expected rate of this round (the marginal rule's objective,
:mod:`specgym.baselines.marginal`, with the drafter as a second choice).

The predictor is fitted on the **fit split** (:attr:`~specgym.envs.workloads.workload.Workload.fit_split`: train,
or val where the draft model was trained on the train prompts) of the workload being served (:func:`fit_on_fit_split`,
:meth:`DrafterMarginal.prepare`), or given. Its recent-round estimate needs the rounds a policy plays: the fit rolls
this rule out on the fit split with the lookup x position estimate alone, records every round start (its
features and every drafter's run there), and counts on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterController, DrafterDecision, drive_drafters
from specgym.envs.core.kinds import NGRAM_DRAFTER
from specgym.envs.core.rounds import RequestContext, RoundOutcome, RoundStart
from specgym.envs.core.run_predictor import MAX_RUN, RunPredictor, recent_code
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.errors import SpecgymError


def fit_on_fit_split(workload: Any, profile: CostProfile, k_max: int = MAX_RUN, split: str | None = None
                     ) -> RunPredictor:
    """A :class:`RunPredictor` of every drafter of ``workload``, counted on its fit split (the train split, or val
    where the draft model was trained on the train prompts: :attr:`Workload.fit_split`; module docstring), or on
    ``split`` (a fit on data unlike use: how a rule fares when its fit is wrong)."""
    split = split or workload.fit_split
    fitted = workload.split_indices(split)
    engine = TraceEngine(workload, profile, min(k_max, profile.max_k))
    idx = np.concatenate([np.arange(workload.offsets[r], workload.offsets[r + 1]) for r in fitted.tolist()])
    position = np.concatenate([np.arange(int(n)) for n in workload.lengths[fitted]])
    lookup = workload.lookup_len[idx] if workload.lookup_len is not None else None
    names = workload.drafter_names
    runs = {d: engine.runs(d)[idx] for d in names}
    meta = {"workload": workload.name, "split": split}
    coarse = RunPredictor.fit(runs, lookup, position, meta)
    rule = DrafterMarginal(coarse)
    rule.prepare(workload, profile)
    rows: list[tuple[int, int, int, int]] = []
    for r in fitted.tolist():
        rule.record = []
        drive_drafters(rule, engine.start(r), names)
        rows += [(r, *x) for x in rule.record]
    rec = np.array(rows, dtype=np.int64).reshape(-1, 4)  # (request, position, lookup, recent)
    at = workload.offsets[rec[:, 0]] + rec[:, 1]
    rounds = ({d: engine.runs(d)[at] for d in names}, rec[:, 2], rec[:, 1], rec[:, 3])
    return RunPredictor.fit(runs, lookup, position, meta, rounds)


class DrafterMarginal(DrafterController):
    """Most predicted tokens per unit time over every (drafter, K).

    Args:
        predictor: A fitted run predictor (``None``: fitted in :meth:`prepare` on the workload's fit split).
    """

    family = "predictor"

    def __init__(self, predictor: RunPredictor | None = None) -> None:
        self.predictor = predictor
        self._given = predictor is not None
        self.name = "drafter-marginal"
        self._tables: dict[tuple[int, int, str], tuple[np.ndarray, np.ndarray]] = {}
        self._kinds: dict[str, str] = {}
        self._fitted: dict[str, RunPredictor] = {}
        self._caps = np.arange(1, MAX_RUN + 2, dtype=np.float64)  # a round with cap K produces at most K + 1
        self._recent = 0
        self.record: list[tuple[int, int, int]] | None = None  # round starts, when a fit rolls the rule out

    def prepare(self, workload: Any, profile: CostProfile) -> list[str]:
        """Fit the predictor on the workload's fit split (unless one was given); learn its drafters' kinds.

        Returns:
            A note when a given predictor was fitted on another workload (it still runs: a deliberate transfer).
        """
        self._kinds = {d: str(workload.drafter_info(d)["kind"]) for d in workload.drafter_names}
        if not self._given:
            key = f"{workload.name}:{id(workload)}:{profile.name}"
            if key not in self._fitted:
                self._fitted[key] = fit_on_fit_split(workload, profile)
            self.predictor = self._fitted[key]
            return []
        fitted_on = (self.predictor.meta or {}).get("workload") if self.predictor is not None else None
        if fitted_on is not None and fitted_on != workload.name:
            return [f"its run predictor was fitted on {fitted_on}, not on {workload.name}"]
        return []

    def _costs(self, drafter: str) -> tuple[np.ndarray, np.ndarray]:
        prof, k_max = self.ctx.profile, self.ctx.k_max
        key = (id(prof), k_max, drafter)
        got = self._tables.get(key)
        if got is None:
            kind = self._kinds.get(drafter, "lookup" if drafter == NGRAM_DRAFTER else None)
            prof = prof.with_drafter(drafter, kind)
            table = prof.round_table(k_max, prof.pricing_drafter(drafter, kind))
            got = self._tables[key] = (table.base, table.per_kv)
        return got

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request (no previous round)."""
        super().reset(ctx, drafters)
        if self.predictor is None:
            raise SpecgymError(f"{self.name} has no run predictor: call prepare(workload, profile) first")
        self._use = [d for d in drafters if d in self.predictor.drafters]
        if not self._use:
            self.check_drafters(self.predictor.drafters)
        self._index = {d: i for i, d in enumerate(self.predictor.drafters)}
        self._recent = 0

    def expected(self, drafter: str, start: RoundStart) -> np.ndarray:
        """``(MAX_RUN + 1,)`` expected tokens of a round of ``drafter`` at caps 0..MAX_RUN from ``start`` (the run
        predictor's; a subclass may adjust them)."""
        assert self.predictor is not None
        return self.predictor.expected_tokens(drafter, start.lookup_len, start.position, self._recent)

    def rates(self, start: RoundStart) -> dict[str, np.ndarray]:
        """Every drafter's expected tokens per ms at caps 0..k_max from ``start`` (K = 0: a plain step)."""
        k_max = self.ctx.k_max
        caps = self._caps[: k_max + 1]
        out = {}
        for d in self._use:
            base, per_kv = self._costs(d)
            out[d] = np.minimum(self.expected(d, start)[: k_max + 1], caps) / (base + per_kv * start.kv)
        return out

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The (drafter, K) of the largest predicted rate."""
        best, best_dec = -1.0, DrafterDecision(NO_DRAFTER, 0)
        for d, rate in self.rates(start).items():
            k = int(np.argmax(rate))
            if rate[k] > best:
                best, best_dec = float(rate[k]), DrafterDecision(d if k else NO_DRAFTER, k)
        if self.record is not None:
            self.record.append((start.position, start.lookup_len, self._recent))
        return best_dec

    def observe(self, outcome: RoundOutcome) -> None:
        """Remember the round's outcome (the next round's recent-round code)."""
        name = outcome.drafter or self.drafters[0]  # None: the engine's default drafter
        self._recent = recent_code(self._index.get(name, -1), outcome.drafted, outcome.accepted)
