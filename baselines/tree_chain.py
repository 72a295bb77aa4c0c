"""Any chain controller as a tree controller: the width-1 case (``tree-chain:SPEC``).

A chain of K draft tokens is the tree of widths ``(1,) * K``. :class:`ChainAsTree` drives a chain
:class:`~specgym.envs.core.controller.Controller` through the tree engine: its K becomes the chain tree, a
token-level controller's ``keep_drafting`` is asked after each draft token exactly as the chain replay asks it (same
:class:`DraftStep` fields and signals), and it observes the round as the same :class:`RoundOutcome`. On a greedy
trace the results equal the chain replay's, round for round (tested for every baseline).
"""

from __future__ import annotations

from typing import Any

from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.envs.core.signals import DraftSignals
from specgym.envs.core.tree import TreeController, TreeRoundOutcome, TreeShape
from specgym.envs.engines.replay.tree_engine import TreeReplayRequest
from specgym.errors import SpecgymError


class ChainAsTree(TreeController):
    """Play ``inner``'s chains as width-1 trees.

    Args:
        inner: Any chain controller.
    """

    def __init__(self, inner: Controller):
        self.inner = inner
        self.name = f"tree-chain:{inner.name}"
        self._chains: dict[int, TreeShape] = {}

    def reset(self, ctx: RequestContext) -> None:
        """Start a request (the inner controller too)."""
        self.ctx = ctx
        self.inner.reset(ctx)

    def _chain(self, k: int) -> TreeShape:
        tree = self._chains.get(k)
        if tree is None:
            tree = self._chains[k] = TreeShape.chain(k)
        return tree

    def propose_tree(self) -> TreeShape:
        """The chain of the inner controller's K (no token-level stop)."""
        return self._chain(min(self.inner.propose(), self.ctx.k_max))

    def check_live(self) -> None:
        """A token-level inner controller stops drafting token by token: the chain engine runs it live."""
        if self.inner.token_level:
            raise SpecgymError(f"{self.name}: a token-level chain controller stops drafting token by token; run it "
                               f"live as {self.inner.name} (the chain engine)")

    def play_live(self, req: Any) -> TreeRoundOutcome:
        """One live round: the inner controller's K as the width-1 tree; it observes the chain round."""
        cap = max(min(self.inner.propose(), req.context.k_max, req.length - req.position - 1), 0)
        o = req.play_tree(self._chain(cap), stats=True)
        self.inner.observe(RoundOutcome(o.position, cap, o.depth, o.accepted, o.produced, o.time_ms,
                                        req.spine_conf, req.spine_entropy, done=o.done))
        return o

    def play(self, req: TreeReplayRequest) -> TreeRoundOutcome:
        """One round: K, the token-level stops (if any), the width-1 tree, and the inner controller observes."""
        inner = self.inner
        i = req.position
        cap = min(inner.propose(), self.ctx.k_max, req.length - i - 1)
        drafted = cap
        if inner.token_level and cap > 1:
            sig = req.engine.chain.signals
            base = req.engine.workload.offsets[req.r]
            for j in range(1, cap):
                conf, ent = req.draft_features(i + j - 1)
                signals = None if sig is None else DraftSignals(sig, int(base) + i, int(base) + i + j)
                if not inner.keep_drafting(DraftStep(j, cap, i + j - 1, conf, ent, signals)):
                    drafted = j
                    break
        o = req.play(self._chain(drafted))
        rnd = req.as_round(o)
        rnd.planned_k = cap
        if req.engine.chain.signals is not None:
            b = int(req.engine.workload.offsets[req.r]) + i
            rnd.signals = DraftSignals(req.engine.chain.signals, b, b + drafted)
        inner.observe(rnd)
        return o
