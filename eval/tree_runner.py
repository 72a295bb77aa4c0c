"""Run a tree controller (or the clairvoyant tree oracle) over requests of a tree replay engine.

Results are :class:`~specgym.eval.runner.RunResult` records, so tree rows sit in the same table as the chains:
``drafted`` counts verified draft *nodes* (so ``mean K`` is nodes per round and ``waste`` the share of nodes not
accepted), ``accepted`` the accepted tokens. Static trees replay all requests at once
(:meth:`TreeEngine.run_static`); dynamic ones (EAGLE-2) round by round.
"""

from __future__ import annotations

import numpy as np

from specgym.baselines.tree_chain import ChainAsTree
from specgym.baselines.tree_eagle import EagleTree
from specgym.baselines.tree_oracle import tree_oracle_request
from specgym.baselines.tree_static import StaticTree
from specgym.envs.core.signals import TOPK
from specgym.envs.core.tree import TreeController
from specgym.envs.engines.tree_engine import TreeEngine
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
