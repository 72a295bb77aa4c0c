"""Optimal stopping on predicted acceptance: the continuation model, the dynamic program against brute force and
simulation, the ``planned:`` controller, and its fall-back to ``marginal``.

Every model and workload here is SYNTHETIC (built in the test), except the last test, which reads the shipped
midpair predictor.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from synthetic_v2 import PROFILE, v2_workload

from specgym import make_controller
from specgym.baselines.marginal import MarginalStop
from specgym.baselines.planned_stop import PlannedStop
from specgym.envs.core.acceptance_predictor import load_predictor, save_predictor
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.economics import RoundCosts
from specgym.envs.core.stopping_plan import ContinuationModel, StoppingPlan, fit_continuation
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.errors import SpecgymError
from specgym.eval.runner import run_controller
from specgym.training.predictor import fit_continuations, select_predictor

COSTS = RoundCosts(CostProfile("steep-test", 0.5, tuple(10.0 + 1.5 * n for n in range(17)), 0.3,
                               source="synthetic"), 4)


def _model(hi: float = 0.97, lo: float = 0.2, stay: float = 0.85) -> ContinuationModel:
    """Two bins, persistent: a good prediction tends to be followed by a good one."""
    t = np.array([[stay, 1 - stay], [1 - stay, stay]])
    return ContinuationModel(np.array([0.5]), np.array([lo, hi]), t, np.array([0.5, 0.5]))


def _brute_gain(model: ContinuationModel, costs: RoundCosts, lam: float, j: int, prefix: float, b: int) -> float:
    """Expected gain of continuing after ``j`` drafts (then stopping optimally), by exhaustive recursion."""
    delta = costs.cost[j + 1] - costs.cost[j]
    total = -lam * delta
    for nb, pr in enumerate(model.transition[b]):
        nxt = prefix * model.centers[nb]
        cont = _brute_gain(model, costs, lam, j + 1, nxt, nb) if j + 1 < costs.k_max else 0.0
        total += pr * (nxt + max(cont, 0.0))
    return total


def test_fit_continuation_weights_by_acceptance_and_never_crosses_requests():
    p = np.array([0.9, 0.9, 0.1, 0.9, 0.1, 0.1])
    acc = np.array([1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    req = np.array([0, 0, 0, 1, 1, 1])
    m = fit_continuation(p, acc, req, bins=2, prior=0.0)
    assert m.centers.tolist() == pytest.approx([0.1, 0.9])
    # transitions weighted by the acceptance of the first token: 0.9->0.9 once, 0.9->0.1 twice, 0.1->0.1 once;
    # the last token of request 0 (0.1, rejected) -> the first of request 1 (0.9) never counts
    assert np.allclose(m.transition, [[1.0, 0.0], [2 / 3, 1 / 3]])
    assert m.initial.sum() == pytest.approx(1.0)
    with pytest.raises(SpecgymError):
        ContinuationModel.from_dict({**m.to_dict(), "transition": [[0.5, 0.2], [0.5, 0.5]]}, "x")


def test_gain_tables_match_brute_force():
    model = _model()
    plan = StoppingPlan(model, COSTS, rate=0.12)
    grid = np.exp(plan._log_grid)
    for j in range(1, COSTS.k_max):
        for i in (len(grid) - 1, len(grid) - 10, len(grid) // 2):
            for b in (0, 1):
                brute = _brute_gain(model, COSTS, 0.12, j, grid[i], b)
                assert plan._gain[j][i][b] == pytest.approx(brute, abs=2e-3), (j, i, b)


def test_decisions_follow_the_predictions_and_the_cap():
    plan = StoppingPlan(_model(), COSTS)
    assert plan.keep_drafting(1, 0.97, 0.97)  # a likely run: go on
    assert not plan.keep_drafting(1, 0.2, 0.2)  # a likely rejection: verify now
    assert not plan.keep_drafting(COSTS.k_max, 0.99, 0.99)  # the cap
    assert not plan.keep_drafting(2, 1e-6, 0.97)  # nothing left to win
    # certain acceptance and free drafting: draft to the cap
    sure = ContinuationModel(np.zeros(0), np.array([1.0]), np.ones((1, 1)), np.ones(1))
    free = RoundCosts(CostProfile("free-test", 0.0, (10.0,) * 17, 0.0, source="synthetic"), 4)
    assert all(StoppingPlan(sure, free).keep_drafting(j, 1.0, 1.0) for j in range(1, 4))


def test_the_rate_is_the_fixed_point_of_its_own_policy_in_simulation():
    model = _model()
    plan = StoppingPlan(model, COSTS)
    rng = np.random.default_rng(0)
    tokens = time = 0.0
    for _ in range(40_000):  # rounds of the model's Markov chain played with the plan's decisions
        b = int(rng.choice(2, p=model.initial))
        p = model.centers[b]
        prefix, j, alive = p, 1, rng.random() < p
        tokens += 1.0 + alive
        while plan.keep_drafting(j, prefix, p):
            b = int(rng.choice(2, p=model.transition[b]))
            p = model.centers[b]
            prefix *= p
            j += 1
            alive = alive and rng.random() < p
            tokens += alive
        time += COSTS.cost[j]
    assert tokens / time == pytest.approx(plan.rate, rel=0.01)


@pytest.fixture(scope="module")
def wl():
    return v2_workload()


@pytest.fixture(scope="module")
def pred(wl):
    return select_predictor(wl, ("conf", "shape", "position", "lookup"), name="synthetic-v2")[0]


def test_planned_controller_beats_marginal_where_signals_speak(wl, pred, tmp_path):
    assert set(pred.continuation) == {"greedy"}
    path = save_predictor(pred, tmp_path / "p.json")
    assert load_predictor(path).continuation["greedy"].to_dict() == pred.continuation["greedy"].to_dict()
    ctrl = make_controller(f"planned:{path}", 8)
    assert isinstance(ctrl, PlannedStop)
    eng = TraceEngine(wl, PROFILE, 8, seed=0)
    test = wl.split_indices("test")
    t_plan = run_controller(eng, test, ctrl).time_ms.sum()
    t_marg = run_controller(eng, test, MarginalStop()).time_ms.sum()
    assert ctrl.predicted > 0 and t_plan < t_marg
    # the continuation model is part of the function: editing it is refused by the checksum
    doc = json.loads(path.read_text())
    doc["continuation"]["greedy"]["initial"] = list(reversed(doc["continuation"]["greedy"]["initial"]))
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecgymError, match="checksum"):
        load_predictor(path)


def test_without_signals_or_continuation(pred, tmp_path):
    v1 = v2_workload(20, signals=False)
    eng = TraceEngine(v1, PROFILE, 8, seed=0)
    reqs = v1.split_indices("all")
    ctrl = PlannedStop(pred)
    a, b = run_controller(eng, reqs, ctrl), run_controller(eng, reqs, MarginalStop())
    assert ctrl.predicted == 0 and np.array_equal(a.drafted, b.drafted) and np.array_equal(a.time_ms, b.time_ms)
    bare = save_predictor(dataclasses.replace(pred, continuation={}), tmp_path / "bare.json")
    with pytest.raises(SpecgymError, match="no continuation model"):
        make_controller(f"planned:{bare}", 8)


def test_shipped_midpair_predictor_plans_both_temperatures():
    import specgym.catalogue as catalogue

    pred = load_predictor(catalogue.resolve("predictor", "midpair"))
    assert set(pred.continuation) == {"greedy", "sampled"}
    for model in pred.continuation.values():
        assert np.all(np.diff(model.centers) > 0) and math.isclose(model.initial.sum(), 1.0)
        # persistence, the premise of planning: a confident prediction is followed by a confident one more often
        # than a doubtful one is
        hi, lo = model.transition[-1], model.transition[0]
        assert hi @ model.centers > lo @ model.centers


def test_fit_continuations_groups_by_temperature(pred):
    wls = [v2_workload(20, seed=1), v2_workload(20, temperature=0.8, seed=2)]
    assert set(fit_continuations(wls, pred)) == {"greedy", "sampled"}
