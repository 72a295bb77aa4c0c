"""The lookup rule (``lookup-rule[:N]``): prompt lookup when the context repeats, else the draft model.

Rule (issue 25): if the last ``n`` tokens occurred earlier in the context (the context lookup's match length is at
least ``n``), draft with the n-gram (prompt-lookup) drafter at cap ``k_lookup``; otherwise draft with the model
drafter (EAGLE) at cap ``k_model`` (10). It reads only token ids, so it runs wherever the engine computes the lookup;
where it cannot (lookup -1) it always uses the model drafter.
"""

from __future__ import annotations

from collections.abc import Sequence

from specgym.envs.core.drafter_choice import DrafterController, DrafterDecision
from specgym.envs.core.rounds import RequestContext, RoundStart
from specgym.errors import SpecgymError


class LookupRule(DrafterController):
    """N-gram drafter when the lookup matched ``n`` tokens, else the model drafter.

    Args:
        n: Match length that switches to the lookup drafter (1..4, default 3).
        lookup: The lookup drafter's name.
        k_lookup: Its cap (``None``: the engine's ``k_max``).
        k_model: The model drafter's cap (clipped to ``k_max``).
        model: The model drafter's name (``None``: the engine's first drafter that is not ``lookup``).
    """

    family = "rule"

    def __init__(self, n: int = 3, lookup: str = "ngram", k_lookup: int | None = None, k_model: int = 10,
                 model: str | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4:
            raise SpecgymError(f"lookup-rule: the match length N must be in 1..4, got {n!r}")
        self.n, self.lookup, self.k_lookup, self.k_model, self.model = n, lookup, k_lookup, k_model, model
        self.name = f"lookup-rule:{n}"
        self._on = self._off = DrafterDecision(lookup, 0)

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request; refuse an engine without both drafters."""
        super().reset(ctx, drafters)
        model = self.model or next((d for d in drafters if d != self.lookup), self.lookup)
        self.check_drafters([self.lookup, model])
        self._on = DrafterDecision(self.lookup, min(ctx.k_max if self.k_lookup is None else self.k_lookup, ctx.k_max))
        self._off = DrafterDecision(model, min(self.k_model, ctx.k_max))

    def propose(self, start: RoundStart) -> DrafterDecision:
        """Lookup drafter on a match of ``n`` tokens, else the model drafter."""
        return self._on if start.lookup_len >= self.n else self._off
