"""The lookup switch (``lookup-switch[:M:KN:KH[@MODEL]]``): the two-line rule a reader writes first.

Rule: if the last ``m`` tokens occurred earlier in the context (the context lookup matched at least ``m`` tokens),
draft ``K_n`` tokens by prompt lookup; otherwise draft ``K_h`` tokens with a model drafter (the draft head, the
draft model). It is :class:`~specgym.baselines.lookup_rule.LookupRule` with its four choices fitted rather than fixed:
without arguments, ``m`` (1..4), ``K_n`` and ``K_h`` (1..k_max) and the model drafter are the combination of least
replayed time on the workload's fit split (:attr:`Workload.fit_split`), under the profile it serves with
(:func:`fit_switch`: every combination and request replayed at once, a few hundred milliseconds). The strongest
simple baseline of a drafter-choice table: a gain over the best single drafter that this rule also gets is the
rule's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.baselines.lookup_rule import LookupRule
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.errors import SpecgymError

#: The match lengths the fit tries (vLLM's prompt lookup matches 1..4 tokens).
MATCH_LENGTHS = (1, 2, 3, 4)


@dataclass(frozen=True)
class SwitchFit:
    """The fitted switch and what it was fitted on.

    Attributes:
        lookup: The lookup drafter.
        m: The match length that switches to prompt lookup.
        k_lookup: Prompt lookup's cap.
        k_model: The model drafter's cap.
        model: The model drafter.
        time_ms: Its replayed time on the fit split.
        candidates: How many combinations were replayed.
    """

    lookup: str
    m: int
    k_lookup: int
    k_model: int
    model: str
    time_ms: float
    candidates: int


def fit_switch(workload: Any, profile: CostProfile, k_max: int, split: str | None = None) -> SwitchFit:
    """The switch of least replayed time on ``split`` (default: the fit split): every ``(m, K_n, K_h, model)``
    played on every request at once, round by round, with the trace engine's semantics (a cap clipped to the
    request's end, no lookup match: a plain step, each drafter's runs and round table)."""
    lookup = [d for d in workload.drafter_names if workload.drafter_info(d)["kind"] == "lookup"]
    models = [d for d in workload.drafter_names if workload.drafter_info(d)["kind"] != "lookup"]
    if not lookup or not models or workload.lookup_len is None:
        raise SpecgymError(f"lookup-switch: workload {workload.name} needs a lookup drafter, a model drafter and the "
                           f"context lookup of every start to fit on (it holds {', '.join(workload.drafter_names)}); "
                           f"give the switch instead: lookup-switch:M:KN:KH@MODEL")
    engine = TraceEngine(workload, profile, k_max)
    reqs = workload.split_indices(split or workload.fit_split)
    grid = np.array([(m, kn, kh, i) for m in MATCH_LENGTHS for kn in range(1, k_max + 1)
                     for kh in range(1, k_max + 1) for i in range(len(models))], dtype=np.int64)
    m, kn, kh, mi = (np.repeat(col, len(reqs)) for col in grid.T)
    start = np.tile(workload.offsets[reqs].astype(np.int64), len(grid))
    end = np.tile(workload.offsets[reqs + 1].astype(np.int64), len(grid))
    kv0 = np.tile(workload.prompt_len[reqs].astype(np.int64), len(grid)) - start
    tables = [engine.table_for(d) for d in (lookup[0], *models)]
    base = np.stack([t.base for t in tables])  # (1 + models, k_max + 1): row 0 prompt lookup
    per_kv = np.stack([t.per_kv for t in tables])
    runs = np.stack([engine.runs(d) for d in (lookup[0], *models)])
    caps = engine.proposal_caps(lookup[0])
    found = workload.lookup_len.astype(np.int64)
    pos, total = start.copy(), np.zeros(len(start))
    live = np.arange(len(start))
    while len(live):
        g = pos[live]
        use = found[g] >= m[live]
        row = np.where(use, 0, 1 + mi[live])
        drafted = np.minimum(np.where(use, kn[live], kh[live]), end[live] - g - 1)
        if caps is not None:
            drafted = np.where(use, np.minimum(drafted, caps[g]), drafted)
        accepted = np.minimum(runs[row, g], drafted)
        total[live] += base[row, drafted] + per_kv[row, drafted] * (kv0[live] + g)
        pos[live] = g + accepted + 1
        live = live[pos[live] < end[live]]
    per_candidate = total.reshape(len(grid), len(reqs)).sum(axis=1)
    best = int(np.argmin(per_candidate))
    b_m, b_kn, b_kh, b_i = (int(x) for x in grid[best])
    return SwitchFit(lookup[0], b_m, b_kn, b_kh, models[b_i], float(per_candidate[best]), len(grid))


class LookupSwitch(LookupRule):
    """Prompt lookup at ``K_n`` on a match of ``m`` tokens, else a model drafter at ``K_h``; fitted when not given.

    Args:
        m, k_lookup, k_model, model: The switch (all given, or none: fitted in :meth:`prepare`).
        lookup: The lookup drafter's name.
        k_max: The largest cap the fit tries (the engine's; at most what the profile prices).
    """

    family = "rule"

    def __init__(self, m: int | None = None, k_lookup: int | None = None, k_model: int | None = None,
                 model: str | None = None, lookup: str = "ngram", k_max: int = DEFAULT_K_MAX) -> None:
        given = (m, k_lookup, k_model)
        if any(x is None for x in given) and any(x is not None for x in given):
            raise SpecgymError("lookup-switch: give M, KN and KH together (lookup-switch:M:KN:KH[@MODEL]), or none "
                               "to fit them")
        self.fitted: SwitchFit | None = None
        self.k_max = k_max
        self._fits = m is None
        super().__init__(m or 3, lookup, k_lookup, k_model or 1, model)
        self._name()

    def _name(self) -> None:
        model = f"@{self.model}" if self.model else ""
        self.name = "lookup-switch" if self._fits else f"lookup-switch:{self.n}:{self.k_lookup}:{self.k_model}{model}"

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Fit the switch on the workload's fit split under ``profile`` (a given switch fits nothing)."""
        if not self._fits:
            return []
        fit = fit_switch(workload, profile, min(profile.max_k, self.k_max))
        self.fitted, self.n, self.k_lookup, self.k_model, self.model = fit, fit.m, fit.k_lookup, fit.k_model, fit.model
        self.lookup = fit.lookup
        return [f"fitted on {workload.name}'s {workload.fit_split} split: prompt lookup at K = "
                f"{fit.k_lookup} on a match of {fit.m}+ tokens, else {fit.model} at K = {fit.k_model} "
                f"({fit.candidates} combinations replayed)"]
