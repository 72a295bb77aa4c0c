"""``tree-online``: the online drafter choice (``drafter-online``) picking prompt lookup's chain, the head's tree or
plain decoding every round, in replay (the live rounds are tested with the head trees, tests/test_head_tree.py).

On requests of the shipped real-pair recording: with the head's round played as the head's chain of the chosen K,
it is ``drafter-online`` among prompt lookup and the head, round for round (the same decisions, outcomes and times:
the tree engine reports the rounds as the chain replay does, counterfactual runs included).
"""

from __future__ import annotations

import numpy as np
import pytest

from specgym.agents.specs import make
from specgym.baselines.drafter_online import DrafterOnline
from specgym.baselines.tree_online import TreeDrafterChoice
from specgym.envs.core.drafter_choice import drive_drafters
from specgym.envs.core.tree import TreeController, TreeShape
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError


@pytest.fixture(scope="module")
def wl():
    full = cached_workload("smollm2-greedy")
    return full.subset(np.concatenate([full.split_indices("val")[:12], full.split_indices("test")[:6]]))


class ChosenChain(TreeController):
    """The head's chain of the K the outer choice rule chose (so the hybrid is the chain rule)."""

    drafter = "head"

    def __init__(self) -> None:
        self.outer: TreeDrafterChoice | None = None
        self.name = "chosen-chain"

    def propose_tree(self) -> TreeShape:
        assert self.outer is not None and self.outer.decision is not None
        return TreeShape.chain(self.outer.decision.k)


def test_with_the_heads_chain_it_is_drafter_online_round_for_round(wl):
    profile = wl.profile
    inner = ChosenChain()
    hybrid = TreeDrafterChoice(DrafterOnline(), inner, "t")
    inner.outer = hybrid
    hybrid.prepare(wl, profile)
    rule = DrafterOnline()
    rule.prepare(wl, profile)
    tree_eng, chain_eng = TreeEngine(wl, profile, 8, drafter="head"), TraceEngine(wl, profile, 8)
    lookups = 0
    for r in wl.split_indices("test").tolist():
        rounds = []
        tot = drive_drafters(rule, chain_eng.start(r), ["ngram", "head"], on_round=rounds.append)
        req = tree_eng.start(r)
        hybrid.reset(req.context)
        mine = []
        while not req.done:
            mine.append(hybrid.play(req))
        assert [(o.position, o.accepted, o.produced) for o in mine] == \
            [(o.position, o.accepted, o.produced) for o in rounds]
        assert sum(o.time_ms for o in mine) == pytest.approx(tot.time_ms, rel=1e-9)
        lookups += sum(o.drafter == "ngram" for o in rounds)
    assert lookups > 10


def test_spellings_and_refusals(wl):
    ctrl = make("tree-online@head", 8, kinds=("tree",))
    assert isinstance(ctrl, TreeDrafterChoice) and ctrl.drafter == "head" and ctrl.tree.name == "tree-eagle:fit"
    assert ctrl.name == "tree-online@head"
    assert make("tree-online:tree-static:2-1@head", 8, kinds=("tree",)).tree.name == "tree-static:2-1"
    for bad in ("tree-online:tree-static:2-1@head:1", "tree-online:tree-hybrid", "tree-online:fixed:3"):
        with pytest.raises(SpecgymError) as exc:
            make(bad, 8, kinds=("tree",))
        assert "\n" not in str(exc.value), bad
    with pytest.raises(SpecgymError, match="drafted by the draft head"):
        make("tree-online", 8, kinds=("tree",)).prepare(wl, wl.profile)
