"""Run a tree controller (or the clairvoyant tree oracle) over requests of a tree replay engine.

Results are :class:`~specgym.eval.runner.RunResult` records, so tree rows sit in the same table as the chains:
``drafted`` counts verified draft *nodes* (so ``mean K`` is nodes per round and ``waste`` the share of nodes not
accepted), ``accepted`` the accepted tokens. Static trees replay all requests at once
(:meth:`TreeEngine.run_static`); dynamic ones (EAGLE-2) round by round. :func:`run_live_tree` drives a tree
controller over the live engine (:mod:`specgym.envs.engines.live_tree`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specgym.baselines.tree_chain import ChainAsTree
from specgym.baselines.tree_eagle import EagleTree
from specgym.baselines.tree_oracle import tree_oracle_request
from specgym.baselines.tree_static import StaticTree
from specgym.envs.core.rounds import RoundOutcome
from specgym.envs.core.signals import TOPK
from specgym.envs.core.tree import TreeController
from specgym.envs.engines.live_engine import LiveEngine
from specgym.envs.engines.live_tree import LiveTreeRequest, LiveTreeResult
from specgym.envs.engines.tree_engine import TreeEngine
from specgym.errors import SpecgymError
from specgym.eval.runner import RunResult

APPROXIMATE = " (approximate)"


def run_tree_controller(engine: TreeEngine, requests: np.ndarray, ctrl: TreeController) -> RunResult:
    """Serve ``requests`` with ``ctrl``; an approximate controller's row name says so."""
    requests = np.asarray(requests, dtype=np.int64)
    name = ctrl.name + (APPROXIMATE if ctrl.approximate else "")
    if isinstance(ctrl, StaticTree):
        out = engine.run_static(requests, ctrl.propose_tree())
        return RunResult(name, requests, out["tokens"], out["time_ms"], out["rounds"], out["nodes"],
                         out["accepted"])
    n = len(requests)
    cols = {k: np.zeros(n, np.int64) for k in ("tokens", "rounds", "nodes", "accepted")}
    time_ms = np.zeros(n)
    topk = engine.workload.draft_topk
    for idx, r in enumerate(requests.tolist()):
        req = engine.start(r)
        ctrl.reset(req.context)
        base = int(engine.workload.offsets[r])
        while not req.done:
            if isinstance(ctrl, ChainAsTree) or getattr(ctrl, "plays_rounds", False):
                o = ctrl.play_round(req)  # type: ignore[attr-defined]
            elif isinstance(ctrl, EagleTree):
                rows = np.zeros((ctrl.depth, TOPK), np.float32)
                if topk is not None:
                    got = topk[base + req.position : base + min(req.position + ctrl.depth, req.length)]
                    rows[: len(got)] = got
                o = req.play(ctrl.tree_for(rows), draft_depth=ctrl.depth, approximate=True)
            else:
                o = req.play(ctrl.propose_tree())
            ctrl.observe(o)
            cols["tokens"][idx] += o.produced
            cols["rounds"][idx] += 1
            cols["nodes"][idx] += o.nodes
            cols["accepted"][idx] += o.accepted
            time_ms[idx] += o.time_ms
    return RunResult(name, requests, cols["tokens"], time_ms, cols["rounds"], cols["nodes"], cols["accepted"])


def run_tree_oracle(engine: TreeEngine, requests: np.ndarray, name: str = "tree-oracle") -> RunResult:
    """The clairvoyant tree oracle's schedule per request (:mod:`specgym.baselines.tree_oracle`)."""
    requests = np.asarray(requests, dtype=np.int64)
    res = [tree_oracle_request(engine, r) for r in requests.tolist()]
    return RunResult(name, requests, engine.workload.lengths[requests].astype(np.int64),
                     np.array([x[0] for x in res]), np.array([x[1] for x in res], np.int64),
                     np.array([x[2] for x in res], np.int64), np.array([x[3] for x in res], np.int64))


def check_live_tree(ctrl: TreeController) -> None:
    """Raise one line unless :func:`run_live_tree` can drive ``ctrl``."""
    if getattr(ctrl, "plays_rounds", False) and not isinstance(ctrl, ChainAsTree) and \
            not hasattr(ctrl, "observe_round"):
        raise SpecgymError(f"{ctrl.name}: grows its tree from the trace's per-position signals, so it runs in replay "
                           "only; live tree controllers: tree-static, tree-sequoia, tree-eagle, tree-chain:SPEC, "
                           "tree-ppo")
    if isinstance(ctrl, ChainAsTree) and ctrl.inner.token_level:
        raise SpecgymError(f"{ctrl.name}: a token-level chain controller stops drafting token by token; run it live "
                           f"as {ctrl.inner.name} (the chain engine)")


def run_live_tree(engine: LiveEngine, prompt_ids: Sequence[int], ctrl: TreeController, max_new_tokens: int,
                  request_id: str = "live", category: str = "live", stop_at_eos: bool = False) -> LiveTreeResult:
    """Decode one request live (greedy) with a tree controller (:mod:`specgym.envs.engines.live_tree`).

    Static trees play their tree every round; ``tree-chain:SPEC`` plays the inner controller's K as the width-1 tree
    and lets it observe the round as a chain :class:`RoundOutcome` (token-level inner controllers are refused: their
    stops need the chain engine's per-token signals). ``tree-eagle`` builds each round's tree from the draft's real
    frontier probabilities (:meth:`LiveTreeRequest.play_eagle`: exact live, unlike its approximate replay). A
    controller with ``observe_round`` (``tree-ppo``) proposes a shape and observes the round as the chain round along
    the draft's rank-0 spine (what a live chain round reports: the draft's own top-1 tokens, their confidence and
    entropy). Controllers that grow their tree from the trace's per-position signals (``tree-predicted``) are
    replay-only (one-line error).
    """
    check_live_tree(ctrl)
    req = LiveTreeRequest(engine, prompt_ids, max_new_tokens, stop_at_eos, request_id, category)
    ctrl.reset(req.context)
    while not req.done:
        if isinstance(ctrl, ChainAsTree):
            cap = min(ctrl.inner.propose(), req.context.k_max, req.length - req.position - 1)
            o = req.play_tree(ctrl._chain(max(cap, 0)), stats=True)
            ctrl.inner.observe(RoundOutcome(o.position, max(cap, 0), o.depth, o.accepted, o.produced, o.time_ms,
                                            req.spine_conf, req.spine_entropy, done=o.done))
        elif isinstance(ctrl, EagleTree):
            o = req.play_eagle(ctrl.depth, ctrl.beam, ctrl.budget)
        elif hasattr(ctrl, "observe_round"):
            o = req.play_tree(ctrl.propose_tree(), stats=True)
            ctrl.observe_round(RoundOutcome(o.position, o.depth, o.depth, o.accepted, o.produced, o.time_ms,
                                            req.spine_conf, req.spine_entropy, done=o.done))
        else:
            o = req.play_tree(ctrl.propose_tree())
        ctrl.observe(o)
    return req.tree_result
