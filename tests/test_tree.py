"""Tree drafts: exact greedy tree replay against a brute-force walk, chains as width-1 trees, Sequoia's program
against brute force, the clairvoyant tree oracle as a limit, the tree env and refusals."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from specgym import make_controller
from specgym.agents.specs import Traits, all_specs, make
from specgym.baselines.tree_eagle import eagle_tree
from specgym.baselines.tree_oracle import tree_oracle_request
from specgym.baselines.tree_static import expected_accepted, sequoia_tree, sequoia_values
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.tree import TreeShape
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.gym.tree_env import SpecDecodeTreeEnv
from specgym.envs.workloads.trace_format import workload_from_requests
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.runner import run_controller
from specgym.eval.tree_runner import run_tree_controller

PROFILE = CostProfile("steep", 1.0, tuple(10.0 + 0.7 * n for n in range(9)), 0.3, source="synthetic")
SHAPES = [(1,), (2,), (2, 1), (2, 2, 1), (3, 1, 2), (1, 3), (4, 2, 1, 1), (2, 2, 2, 2)]


def _workload(n_req=12, temperature=0.0, seed=0):
    rng = np.random.default_rng(seed)
    reqs = []
    for r in range(n_req):
        n = int(rng.integers(5, 60))
        rank = np.minimum(rng.geometric(0.55, n) - 1, 20).astype(np.int32)
        topk = np.sort(rng.dirichlet(np.ones(10), n)[:, :8], axis=1)[:, ::-1].astype(np.float32)
        reqs.append({"request_id": f"r{r}", "category": "c", "temperature": temperature, "prompt_len": 4,
                     "p_accept": (rank == 0).astype(np.float32), "draft_conf": topk[:, 0],
                     "draft_entropy": np.ones(n, np.float32), "target_rank": rank, "draft_topk": topk,
                     "split": "train" if r % 3 else "test"})
    return workload_from_requests("ranks", {"kind": "synthetic", "generator": "tests"}, PROFILE, reqs)


def _brute_accepted(widths, ranks, room):
    """The definition: depth d is in the tree iff every rank up to d is below its depth's width."""
    a = 0
    while a < min(len(widths), room) and ranks[a] < widths[a]:
        a += 1
    return a


@pytest.mark.parametrize("widths", SHAPES)
def test_tree_replay_equals_brute_force_walk(widths):
    wl = _workload()
    eng = TreeEngine(wl, PROFILE)
    tree = TreeShape.from_widths(widths)
    assert tree.nodes == sum(int(np.prod(widths[: d + 1])) for d in range(len(widths)))
    pos = np.arange(wl.n_positions)
    end = np.repeat(wl.offsets[1:], wl.lengths)
    acc, depth = eng.accepted(pos, end, tree)
    for i in range(wl.n_positions):
        room = int(end[i] - i - 1)
        assert acc[i] == _brute_accepted(widths, wl.target_rank[i:].tolist(), room)
        assert depth[i] == min(room, len(widths))
    for r in range(wl.n_requests):  # the scalar request and the vectorised replay agree
        req, t, rounds = eng.start(r), 0.0, 0
        while not req.done:
            o = req.play(tree)
            t, rounds = t + o.time_ms, rounds + 1
        out = eng.run_static([r], tree)
        assert out["time_ms"][0] == pytest.approx(t) and out["rounds"][0] == rounds


@pytest.mark.parametrize("k", range(0, 9))
def test_width_one_trees_equal_the_chain_replay(k):
    wl = _workload()
    chain = VectorReplay(TraceEngine(wl, PROFILE, 8, seed=0))
    chain.run_fixed(k)
    out = TreeEngine(wl, PROFILE).run_static(np.arange(wl.n_requests), TreeShape.chain(k))
    np.testing.assert_array_equal(out["accepted"], chain.accepted_total)
    np.testing.assert_array_equal(out["rounds"], chain.rounds)
    np.testing.assert_allclose(out["time_ms"], chain.time_ms, rtol=0, atol=1e-9)


def _rank_trees(n, depth):
    """Every rank-closed tree with at most n nodes and depth at most ``depth`` (nested child lists)."""
    if depth == 0 or n == 0:
        return [[]]
    out = [[]]
    for c in range(1, n + 1):
        for sizes in itertools.product(range(0, n), repeat=c):
            if sum(sizes) + c <= n:
                for subs in itertools.product(*[_rank_trees(s, depth - 1) for s in sizes]):
                    tree = list(subs)
                    if tree not in out:
                        out.append(tree)
    return out


def _value(tree, p):
    return sum((p[r] if r < len(p) else 0.0) * (1 + _value(sub, p)) for r, sub in enumerate(tree))


def _size(tree):
    return sum(1 + _size(s) for s in tree)


def _depth(tree):
    return max((1 + _depth(s) for s in tree), default=0)


def test_sequoia_program_is_optimal_against_brute_force():
    p = np.array([0.55, 0.2, 0.1, 0.05])
    G, _ = sequoia_values(p, 5, 3)
    for n in range(6):
        for depth in range(4):
            best = max(_value(t, p) for t in _rank_trees(n, depth))
            assert G[depth, n] == pytest.approx(best)
    prof = CostProfile("flatish", 0.5, tuple(10.0 + 0.2 * n for n in range(9)), 0.1, source="synthetic")
    tree, rate = sequoia_tree(p, prof, node_budget=5, max_depth=3)
    brute = max(((1 + _value(t, p)) / prof.tree_round_time(_depth(t), _size(t)) for t in _rank_trees(5, 3) if t),
                default=0.0)
    assert rate == pytest.approx(max(brute, 1 / prof.t_ar_ms))
    assert (1 + expected_accepted(tree, p)) / prof.tree_round_time(tree.depth, tree.nodes) == pytest.approx(rate)


def test_clairvoyant_tree_oracle_beats_every_static_tree():
    wl = _workload()
    eng = TreeEngine(wl, PROFILE, node_budget=30)
    oracle = np.array([tree_oracle_request(eng, r)[0] for r in range(wl.n_requests)])
    for widths in SHAPES + [(1,) * 8, ()]:
        out = eng.run_static(np.arange(wl.n_requests), TreeShape.from_widths(widths))
        assert (oracle <= out["time_ms"] + 1e-9).all()


def test_eagle_tree_is_rank_closed_and_within_budget():
    rng = np.random.default_rng(3)
    for _ in range(50):
        topk = np.sort(rng.dirichlet(np.ones(12), 5)[:, :8], axis=1)[:, ::-1]
        tree = eagle_tree(topk, beam=3, budget=10)  # TreeShape validates rank-closure
        assert tree.nodes == 10 and tree.depth <= 5


def test_tree_env_check_env_and_reward_convention():
    env = gym.make("specgym/SpecDecodeTree-v0", workload=_workload(), profile=PROFILE).unwrapped
    assert isinstance(env, SpecDecodeTreeEnv)
    check_env(env)
    env.reset(seed=1)
    done, ret, tokens, time_ms = False, 0.0, 0, 0.0
    while not done:
        _, reward, done, _, info = env.step(int(env.action_space.sample()))
        ret += reward
        tokens, time_ms = tokens + info["produced"], time_ms + info["time_ms"]
    assert ret == pytest.approx(tokens - time_ms / PROFILE.t_ar_ms)


def test_sampled_and_rankless_traces_are_refused(mix_workload):
    with pytest.raises(SpecgymError, match="sampled"):
        TreeEngine(_workload(temperature=0.8), PROFILE)
    with pytest.raises(SpecgymError, match="target_rank"):
        TreeEngine(mix_workload)


def test_verify_nodes_extrapolates_linearly_beyond_the_measured_list():
    assert PROFILE.verify_nodes(9) == PROFILE.verify(9) and not PROFILE.verify_extrapolated(9)
    assert PROFILE.verify_extrapolated(10) and PROFILE.verify_nodes(12) == pytest.approx(10.0 + 0.7 * 11)
    with pytest.raises(SpecgymError, match="limit"):
        PROFILE.verify_nodes(66)
    assert PROFILE.tree_round_time(4, 4) == PROFILE.round_time(4)


def test_eval_all_includes_tree_rows_only_with_ranks(mix_workload):
    rep = evaluate(EvalConfig(_workload(), "all", split="all", bootstrap=0))
    names = [row["spec"] for row in rep["rows"]]
    assert {"tree-sequoia", "tree-eagle", "tree-static:2-2-1", "tree-oracle"} <= set(names)
    eagle = next(row for row in rep["rows"] if row["spec"] == "tree-eagle")
    assert eagle["approximate"] and "approximate" in eagle["controller"]
    oracle = next(row for row in rep["rows"] if row["spec"] == "tree-oracle")
    assert all(oracle["total_time_ms"] <= row["total_time_ms"] + 1e-6 for row in rep["rows"] if row.get("tree")
               and not row["approximate"])
    rep = evaluate(EvalConfig(mix_workload, "all", bootstrap=0, max_requests=5))
    assert not any(row["spec"].startswith("tree") for row in rep["rows"])


def _walk(counts, ranks, room):
    """Brute-force walk of a breadth-first child-count tree: rebuild the nested paths and follow the ranks."""
    paths, queue, nxt = {0: ()}, [0], 1
    while queue:
        v = queue.pop(0)
        for r in range(counts[v]):
            paths[nxt] = paths[v] + (r,)
            queue.append(nxt)
            nxt += 1
    present = set(paths.values())
    a = 0
    while a < room and tuple(ranks[: a + 1]) in present:
        a += 1
    return a


def test_general_rank_trees_replay_as_the_brute_force_walk():
    wl = _workload(seed=4)
    eng = TreeEngine(wl, PROFILE)
    p = np.array([0.6, 0.2, 0.1, 0.05])
    for budget, depth in ((3, 2), (7, 3), (12, 5), (20, 8)):
        tree, _ = sequoia_tree(p, CostProfile("cheap", 0.1, (10.0,) * 9, source="synthetic"), budget, depth)
        counts = [int((row >= 0).sum()) for row in tree.child]
        pos = np.arange(wl.n_positions)
        end = np.repeat(wl.offsets[1:], wl.lengths)
        acc, _ = eng.accepted(pos, end, tree)
        for i in range(wl.n_positions):
            room = min(int(end[i] - i - 1), tree.depth)
            assert acc[i] == _walk(counts, wl.target_rank[i:].tolist(), room)


def test_tree_specs_on_sampled_traces_are_refused_and_left_out_of_all():
    sampled = _workload(temperature=0.8)
    rep = evaluate(EvalConfig(sampled, "all", split="all", bootstrap=0))
    assert not any(row["spec"].startswith("tree") for row in rep["rows"])
    with pytest.raises(SpecgymError, match="sampled"):
        evaluate(EvalConfig(sampled, "fixed:2,tree-sequoia", split="all", bootstrap=0))


@pytest.mark.parametrize("spec", [*(s for s in all_specs(Traits.anything(), 8, ("chain",))[0]
                                    if not s.startswith("fixed:")), *(f"fixed:{k}" for k in range(9))])
def test_every_chain_controller_is_the_width_one_case(spec):
    """Through the tree engine as width-1 trees (``tree-chain:SPEC``), every chain baseline gives the chain
    replay's results exactly: same tokens, rounds, drafted and accepted counts and times."""
    wl = _workload(seed=5)
    req = np.arange(wl.n_requests)
    chain = run_controller(TraceEngine(wl, PROFILE, 8, seed=0), req, make_controller(spec), trace=[0])
    tree = run_tree_controller(TreeEngine(wl, PROFILE), req, make(f"tree-chain:{spec}", 8, kinds=("tree",)))
    for col in ("tokens", "rounds", "drafted", "accepted"):
        np.testing.assert_array_equal(getattr(tree, col), getattr(chain, col))
    np.testing.assert_allclose(tree.time_ms, chain.time_ms, rtol=0, atol=1e-9)
