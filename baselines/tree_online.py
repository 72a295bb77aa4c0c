"""The online hybrid (``tree-online[:TREE_SPEC][@head]``): the online drafter choice, with the head's rounds as trees.

:mod:`~specgym.baselines.tree_hybrid` switches on a fitted match length. Here the choice is the landed online rule
:class:`~specgym.baselines.drafter_online.DrafterOnline` (``drafter-online``: each drafter's runs predicted from the
context lookup and the last round, calibrated to the request as it is decoded, free counterfactual runs of prompt
lookup included, a floor at plain decoding), asked every round among the drafters the tree engine serves: prompt
lookup (its chain at the chosen K), the tree drafter (its round is the inner tree controller's, default
``tree-eagle:fit``, whatever K was chosen) and plain decoding. The rule observes each round as the chain round of the
drafter that played, along the true path, with prompt lookup's run where it did not play (the engines'
``choice_round``), so its calibration of the head learns what the head's trees accept. This is SGLang's
suffix/MTP/none selector (PR #27628) and vLLM's ngram-eagle (PR #24344) with a learned, per-request choice; issue 55's
"hybrid with the lookup drafter" on the generalisation issue's online rule.

The rule prices a head round as the head's chain of its K; a tree of the same depth costs more and accepts more, so
the choice is approximate for trees (the fitted EAGLE-2 tree's rate on the fit split is about 1.07x the chain's on
smollm2).
"""

from __future__ import annotations

from typing import Any

from specgym.baselines.tree_wrapper import TreeWrapper
from specgym.envs.core.drafter_choice import DrafterController, DrafterDecision, check_decision
from specgym.envs.core.kinds import NGRAM_DRAFTER
from specgym.envs.core.rounds import RequestContext
from specgym.envs.core.tree import TreeController, TreeRoundOutcome, TreeShape
from specgym.errors import SpecgymError

#: A round without draft tokens.
PLAIN = TreeShape.from_widths(())


class TreeDrafterChoice(TreeWrapper):
    """A drafter-choice rule picks each round's drafter and K; the tree drafter's rounds are ``tree``'s.

    Args:
        choice: The drafter-choice rule (``drafter-online``).
        tree: The tree controller of the tree drafter's rounds (its ``drafter``: who drafts them, ``head``).
        name: Display name.

    Attributes:
        decision: The choice rule's decision for the round being played (what an inner controller may read).
    """

    def __init__(self, choice: DrafterController, tree: TreeController, name: str) -> None:
        super().__init__(tree)
        self.choice, self.name = choice, name
        self.decision: DrafterDecision | None = None

    @property
    def tree(self) -> TreeController:
        """The tree controller of the tree drafter's rounds (the wrapped one)."""
        return self.inner

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Fit the choice rule on the workload's fit split (its chains) and the inner tree controller."""
        if self.drafter is None:
            raise SpecgymError(f"{self.name}: the trees are drafted by the draft head (tree-online@head); the draft "
                               "model's trees share no engine with prompt lookup's chains here")
        return list(self.choice.prepare(workload, profile)) + self.prepare_inner(workload, profile)

    def reset(self, ctx: RequestContext) -> None:
        """Start a request: the choice rule among prompt lookup and the tree drafter (plain always allowed)."""
        super().reset(ctx)
        self.choice.reset(ctx, [NGRAM_DRAFTER, str(self.drafter)])
        self.tree.reset(ctx)

    def propose_tree(self) -> TreeShape:
        """Not used: the round is the choice rule's (see :meth:`play`)."""
        raise SpecgymError(f"{self.name} plays the drafter its choice rule picks each round: call play(req)")

    def _round(self, req: Any, live: bool) -> TreeRoundOutcome:
        start = req.round_start()
        dec = self.decision = check_decision(self.choice.propose(start), self.choice.name)
        by: str | None
        if dec.plain:
            o, by = (req.play_tree(PLAIN) if live else req.play(PLAIN)), None
        elif dec.drafter == NGRAM_DRAFTER:
            o, by = req.play_lookup(dec.k), NGRAM_DRAFTER
        elif dec.drafter == self.drafter:
            o, by = (self.tree.play_live(req) if live else self.tree.play(req)), dec.drafter
        else:
            raise SpecgymError(f"{self.name}: its choice rule proposed drafter {dec.drafter!r}, which the tree engine "
                               f"does not serve ({NGRAM_DRAFTER}, {self.drafter})")
        self.choice.observe(req.choice_round(o, by, start))
        return o

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round."""
        return self._round(req, live=False)

    def play_live(self, req: Any) -> TreeRoundOutcome:
        """One live round."""
        return self._round(req, live=True)
