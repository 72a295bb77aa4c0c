"""The hybrid (``tree-hybrid[:M:KN][:TREE_SPEC][@DRAFTER]``): a prompt-lookup chain or a drafter's tree, per round.

Lookup and trees win in different places. Where the text repeats its context (code edits, extraction, a quoted
passage, a loop) prompt lookup drafts long runs for free; elsewhere a tree of the draft head's top candidates gets
more per verify than any chain. The rule is SAM-Decoding's per-round switch (a suffix match long enough: copy it;
else the model drafter) and vLLM's ngram-eagle proposer (PR #24344) with a tree as the model side: if the last ``m``
tokens occurred earlier in the context (the context lookup matched at least ``m`` tokens), draft ``K_n`` tokens by
prompt lookup; otherwise play the inner tree controller's round (default ``tree-eagle:fit``, EAGLE-2 with its
parameters fitted; ``@head``: trees drafted by the draft head).

Without ``M:KN`` both are fitted on the workload's fit split after the inner controller prepares (:func:`fit_hybrid`:
the inner tree's round at every position replayed once, every ``(m, K_n)`` walked over every request at once; ``m``
of 5 never switches, so the fit may keep the tree alone). Fitting needs an inner controller whose round depends on
nothing but its position (a static tree, EAGLE-2's rule); others take ``M:KN`` given. The lookup-switch of the chain
tables (:mod:`~specgym.baselines.lookup_switch`) is this rule with a chain as the model side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.baselines.lookup_switch import MATCH_LENGTHS
from specgym.baselines.tree_eagle import EagleTree
from specgym.baselines.tree_eagle_fit import eagle_outcomes, walk_totals
from specgym.baselines.tree_wrapper import TreeWrapper
from specgym.envs.core.rounds import DEFAULT_K_MAX, RequestContext
from specgym.envs.core.tree import TreeController, TreeRoundOutcome, TreeShape
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.errors import SpecgymError

#: The match length that never switches to prompt lookup (the context lookup matches at most 4 tokens).
NEVER = max(MATCH_LENGTHS) + 1


@dataclass(frozen=True)
class HybridFit:
    """The fitted switch and what it was fitted on.

    Attributes:
        m: The match length that switches to prompt lookup (:data:`NEVER`: the tree every round).
        k_lookup: Prompt lookup's cap.
        time_ms: Its replayed time on the fit split.
        split: The split fitted on.
        candidates: How many ``(m, K_n)`` were replayed.
    """

    m: int
    k_lookup: int
    time_ms: float
    split: str
    candidates: int


def inner_outcomes(engine: TreeEngine, reqs: np.ndarray, inner: TreeController) -> tuple[np.ndarray, np.ndarray]:
    """Accepted tokens and time of ``inner``'s round at every position of ``reqs`` (flat), all at once: a static
    tree's or EAGLE-2's; one line for a controller whose round depends on more than its position."""
    reqs = np.asarray(reqs, np.int64)
    wl = engine.workload
    starts, ends = wl.offsets[reqs].astype(np.int64), wl.offsets[reqs + 1].astype(np.int64)
    shape = inner.static_shape()
    if shape is not None:
        g = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
        end = np.repeat(ends, ends - starts)
        acc, depth = engine.accepted(g, end, shape)
        time_ms = np.asarray(engine.times(shape))[depth]
        if engine.per_kv is not None:
            kv = np.repeat(wl.prompt_len[reqs].astype(np.int64) - starts, ends - starts) + g
            time_ms = time_ms + np.asarray(engine.per_kv)[np.minimum(depth, 1)] * kv
        return acc, time_ms
    if isinstance(inner, EagleTree):
        return eagle_outcomes(engine, reqs, inner.depth, inner.beam, inner.budget)
    raise SpecgymError(f"tree-hybrid fits its switch on {inner.name}'s round at every position, which depends on "
                       f"more than the position: give the switch (tree-hybrid:M:KN:{inner.name})")


def fit_hybrid(engine: TreeEngine, inner: TreeController, k_max: int, split: str | None = None) -> HybridFit:
    """The ``(m, K_n)`` of least replayed time on ``split`` (default: the fit split) with ``inner`` as the model side:
    ``m`` in 1..4 and :data:`NEVER`, ``K_n`` in 1..``k_max``; ties go to the first (shortest match, smallest cap)."""
    wl = engine.workload
    split = split or wl.fit_split
    reqs = wl.split_indices(split)
    found, runs, caps, base, per_kv = engine.lookup_columns()
    t_acc, t_time = inner_outcomes(engine, reqs, inner)
    starts, ends = wl.offsets[reqs].astype(np.int64), wl.offsets[reqs + 1].astype(np.int64)
    g = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
    rem = np.repeat(ends, ends - starts) - g - 1
    kv = np.repeat(wl.prompt_len[reqs].astype(np.int64) - starts, ends - starts) + g
    cap = rem if caps is None else np.minimum(rem, caps[g])
    grid = [(m, k) for m in (*MATCH_LENGTHS, NEVER) for k in range(1, k_max + 1)]
    acc = np.empty((len(grid), len(g)), np.int64)
    tm = np.empty((len(grid), len(g)))
    for c, (m, k) in enumerate(grid):
        drafted = np.minimum(k, cap)
        use = found[g] >= m
        acc[c] = np.where(use, np.minimum(runs[g], drafted), t_acc)
        tm[c] = np.where(use, base[drafted] + per_kv[drafted] * kv, t_time)
    lengths = ends - starts
    local = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    totals = walk_totals(acc, tm, local, lengths)
    best = int(np.argmin(totals))
    return HybridFit(grid[best][0], grid[best][1], float(totals[best]), split, len(grid))


class TreeHybrid(TreeWrapper):
    """Prompt lookup at ``K_n`` on a context match of ``m`` tokens, else ``inner``'s tree (module docstring).

    Args:
        inner: The tree controller of the rounds without a long enough match.
        m: The match length that switches to prompt lookup (with ``k_lookup``; both ``None``: fitted).
        k_lookup: Prompt lookup's cap.
        k_max: The largest cap the fit tries.
    """

    def __init__(self, inner: TreeController, m: int | None = None, k_lookup: int | None = None,
                 k_max: int = DEFAULT_K_MAX) -> None:
        if (m is None) != (k_lookup is None):
            raise SpecgymError("tree-hybrid: give M and KN together (tree-hybrid:M:KN[:TREE_SPEC]), or neither to fit "
                               "them")
        if m is not None and k_lookup is not None and not (1 <= m <= NEVER and 1 <= k_lookup <= k_max):
            raise SpecgymError(f"tree-hybrid:M:KN needs M in 1..{NEVER} and KN in 1..{k_max}, got {m}:{k_lookup}")
        super().__init__(inner)
        self.m, self.k_lookup, self.k_max = m, k_lookup, k_max
        self.fitted: HybridFit | None = None
        self._fits = m is None
        self._label = "tree-hybrid" + ("" if self._fits else f":{m}:{k_lookup}") + f":{inner.name}"
        self.name = self._label

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Prepare the inner controller, then fit ``(m, K_n)`` on the fit split (a given switch fits nothing)."""
        notes = self.prepare_inner(workload, profile)
        if not self._fits:
            return notes
        engine = TreeEngine(workload, profile, self.k_max, drafter=self.drafter)
        fit = fit_hybrid(engine, self.inner, min(self.k_max, engine.chain.k_max))
        self.fitted, self.m, self.k_lookup = fit, fit.m, fit.k_lookup
        switch = (f"prompt lookup at K = {fit.k_lookup} on a match of {fit.m}+ tokens, else the tree"
                  if fit.m < NEVER else "the tree every round (no match length paid for prompt lookup)")
        return notes + [f"fitted on {workload.name}'s {fit.split} split: {switch} ({fit.candidates} switches "
                        f"replayed{', approximate' if self.approximate else ''})"]

    def reset(self, ctx: RequestContext) -> None:
        """Start a request (the inner controller too)."""
        self._ready()
        super().reset(ctx)
        self.inner.reset(ctx)

    def _ready(self) -> None:
        if self.m is None:
            raise SpecgymError(f"{self.name}: call prepare(workload, profile) first (it fits the switch on the "
                               "workload's fit split)")

    def propose_tree(self) -> TreeShape:
        """Not used: the round is a lookup chain or the inner controller's (see :meth:`play`)."""
        raise SpecgymError("tree-hybrid plays a lookup chain or its inner controller's round: call play(req)")

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round: a lookup chain on a long enough match, else the inner controller's round."""
        if req.lookup_len() >= self.m:
            return req.play_lookup(self.k_lookup)
        return self.inner.play(req)

    def play_live(self, req: Any) -> TreeRoundOutcome:
        """One live round, as :meth:`play`."""
        if req.lookup_len() >= self.m:
            return req.play_lookup(self.k_lookup)
        return self.inner.play_live(req)
