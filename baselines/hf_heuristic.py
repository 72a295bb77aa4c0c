"""HFHeuristic: transformers' ``num_assistant_tokens_schedule="heuristic_transient"``.

Source: huggingface/transformers, ``src/transformers/generation/candidate_generator.py``,
``AssistedCandidateGenerator.update_candidate_strategy`` (read at commit 00a11b6a0745b442473aef0221e098d022b8158c):

    if self.assistant_generation_config.num_assistant_tokens_schedule in {"heuristic", "heuristic_transient"}:
        # len(scores[0])-1 is the number of candidates according to the target tokenizer.
        if num_matches == len(scores[0]) - 1:
            self.num_assistant_tokens += 2
        else:
            self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)

and ``GenerationConfig``'s docstring: "heuristic: When all speculative tokens are correct, increase
num_assistant_tokens by 2 else reduce by 1 ... heuristic_transient: Same as heuristic but num_assistant_tokens is
reset to its initial value after each generation call". So: K = 5 at the start of every request (transformers'
historical default ``num_assistant_tokens=5``; newer versions default to 20 with a constant schedule); if all
*drafted* tokens were accepted (``accepted == drafted``, transformers compares with the number of candidates
actually produced, not with the cap) K += 2, else K = max(1, K - 1).

Choices: transformers' counter is unbounded above (only the max-length budget clips the draft); here the state
itself is capped at ``k_max`` (every controller respects the engine's cap), so one failure after a long streak steps
down from k_max instead of from an unbounded value. A round with ``drafted == 0`` (engine clipped the cap to 0 at
the last token) is skipped: it carries no evidence.
"""

from __future__ import annotations

from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import RequestContext, RoundOutcome


class HFHeuristic(Controller):
    """Additive-increase (+2) / subtractive-decrease (-1) draft length, reset per request.

    Args:
        init_k: K at the start of each request (5).
        increase: Step after a fully accepted round (2).
        decrease: Step after a round with a rejection (1).
        k_min: Floor of K (1).
        k_max: Cap of K; ``None`` = the request's ``ctx.k_max``.
    """

    name = "hf-heuristic"
    token_level = False

    def __init__(
        self, init_k: int = 5, increase: int = 2, decrease: int = 1, k_min: int = 1, k_max: int | None = None
    ) -> None:
        self.init_k, self.increase, self.decrease = init_k, increase, decrease
        self.k_min, self.k_max = k_min, k_max
        self._hi = k_max if k_max is not None else init_k
        self.current_k = init_k

    def reset(self, ctx: RequestContext) -> None:
        """``heuristic_transient``: K returns to its initial value for every request."""
        self.ctx = ctx
        self._hi = ctx.k_max if self.k_max is None else min(self.k_max, ctx.k_max)
        self.current_k = max(min(self.k_min, self._hi), min(self._hi, self.init_k))

    def propose(self) -> int:
        """Return the current K."""
        return self.current_k

    def observe(self, outcome: RoundOutcome) -> None:
        """+2 if every drafted token was accepted, else -1."""
        if outcome.drafted <= 0:
            return
        if outcome.accepted == outcome.drafted:
            self.current_k = min(self._hi, self.current_k + self.increase)
        else:
            self.current_k = max(min(self.k_min, self._hi), self.current_k - self.decrease)
