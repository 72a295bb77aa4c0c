"""Run a tree controller (or the clairvoyant tree oracle) over requests of a tree replay engine.

Results are :class:`~specgym.eval.runner.RunResult` records, so tree rows sit in the same table as the chains:
``drafted`` counts verified draft *nodes* (so ``mean K`` is nodes per round and ``waste`` the share of nodes not
accepted), ``accepted`` the accepted tokens. Static trees replay all requests at once
(:meth:`TreeEngine.run_static`); dynamic ones (EAGLE-2) round by round. :func:`run_live_tree` drives a tree
controller over the live engine (:mod:`specgym.envs.engines.live.tree`).
"""

from __future__ import annotations

import numpy as np

from specgym.baselines.tree_oracle import tree_oracle_request
from specgym.envs.core.tree import TreeController
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.eval.runner import RunResult

APPROXIMATE = " (approximate)"


def run_tree_controller(engine: TreeEngine, requests: np.ndarray, ctrl: TreeController) -> RunResult:
    """Serve ``requests`` with ``ctrl`` (a static tree: all at once; else round by round, as the controller says it
    plays); an approximate controller's row name says so."""
    requests = np.asarray(requests, dtype=np.int64)
    name = ctrl.name + (APPROXIMATE if ctrl.approximate else "")
    shape = ctrl.static_shape()
    if shape is not None:
        out = engine.run_static(requests, shape)
        return RunResult(name, requests, out["tokens"], out["time_ms"], out["rounds"], out["nodes"],
                         out["accepted"])
    n = len(requests)
    cols = {k: np.zeros(n, np.int64) for k in ("tokens", "rounds", "nodes", "accepted")}
    time_ms = np.zeros(n)
    for idx, r in enumerate(requests.tolist()):
        req = engine.start(r)
        ctrl.reset(req.context)
        while not req.done:
            o = ctrl.play(req)
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
