"""tree-predicted: the spine tree's decisions on synthetic inputs, and its replay on the midpair."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.agents.specs import make
from specgym.baselines.tree_predicted import SpineRound, spine_tree
from specgym.envs.core.cost import CostProfile
from specgym.envs.profiles import load_profile
from specgym.errors import SpecgymError

GPU = load_profile("gpu-like-published")
NO_SIDES = np.zeros(7)


def grow(profile: CostProfile, accept: list[float], sides: np.ndarray, next_accept: float, depth: int = 8):
    """Drive one SpineRound with fixed per-depth signals (synthetic)."""
    rnd = SpineRound(profile, depth)
    a_next = next_accept
    while rnd.before_forward(a_next):
        a = accept[min(rnd.forwards - 1, len(accept) - 1)]
        if not rnd.take(a, sides):
            break
    return rnd


def test_spine_tree_shape():
    t = spine_tree([3, 1, 2])
    assert (t.depth, t.nodes) == (3, 6)
    assert t.accepted([0, 0, 1], 3) == 3 and t.accepted([2, 0, 0], 3) == 1 and t.accepted([0, 1, 0], 3) == 1
    assert t.accepted([1, 0, 0], 3) == 1  # side nodes are leaves
    assert spine_tree([]).nodes == 0


def test_confident_spine_goes_deep_and_narrow():
    rnd = grow(GPU, [0.97], NO_SIDES + 0.005, 0.97)
    assert rnd.forwards == 8 and rnd.widths == [1] * 8


def test_unsure_spine_goes_wide_and_shallow():
    sides = np.array([0.3, 0.15, 0.1, 0.05, 0.02, 0.01, 0.005])
    rnd = grow(GPU, [0.2], sides, 0.2)
    assert rnd.widths and rnd.widths[0] >= 4 and len(rnd.widths) <= 2


def test_no_forward_when_drafting_cannot_pay():
    steep = CostProfile(name="steep", draft_ms=15.0, verify_ms=[20.0, 40.0], round_overhead_ms=0.0)
    rnd = grow(steep, [0.5], NO_SIDES, 0.5)
    assert rnd.forwards == 0 and rnd.tree().nodes == 0


def test_every_node_raises_the_expected_rate():
    sides = np.array([0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.001])
    rnd = grow(GPU, [0.7, 0.6, 0.5], sides, 0.6)
    tree = rnd.tree()
    assert tree.nodes == rnd.nodes and tree.depth == len(rnd.widths)
    rate = (1 + rnd.expected) / GPU.tree_round_time(rnd.forwards, rnd.nodes)
    node_ms = GPU.verify_nodes(3) - GPU.verify_nodes(2)
    kept = sides[: rnd.widths[0] - 1]  # depth 1: on_spine = 1
    assert (kept > rate * node_ms * 0.99).all()
    assert rnd.widths[0] == 8 or sides[rnd.widths[0] - 1] < rate * node_ms * 1.2


def test_spec_needs_a_predictor():
    with pytest.raises(SpecgymError, match="needs a predictor"):
        make("tree-predicted", 8, kinds=("tree",))
    with pytest.raises(SpecgymError, match="unknown acceptance predictor"):
        make("tree-predicted:nope", 8, kinds=("tree",))


def test_replay_beats_sequoia_on_the_midpair():
    """Deterministic replay on the shipped midpair-greedy test split, gpu-like-published (the README's figure)."""
    from specgym.eval.harness import EvalConfig, evaluate

    rep = evaluate(EvalConfig(workload="midpair-greedy", controllers="fixed:4,tree-sequoia,tree-predicted:midpair",
                              profile="gpu-like-published", bootstrap=200))
    rows = {r["spec"]: r for r in rep["rows"]}
    assert rep["best_static_tree"] == "tree-sequoia"
    pred = rows["tree-predicted:midpair"]
    assert pred["speedup_vs_best_static_tree"] > 1.05
    assert pred["ci95"]["speedup_vs_best_static_tree"][0] > 1.0
