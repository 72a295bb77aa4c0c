"""``tree-eagle:fit[@head]``: EAGLE-2's (depth, beam, budget) fitted on the workload's fit split by replaying a grid.

The vectorised grid replay (:func:`replay_grid`) equals the scalar replay of every combination round by round
(:func:`run_tree_controller` on :class:`EagleTree`), so the fitted parameters are the grid's best on the fit split;
the fit never reads another split; a bad spelling is refused in one line. The synthetic workloads are random ranks
and top-8 rows (labelled synthetic); the head's case runs on requests of the shipped ``smollm2-greedy`` recording.
"""

from __future__ import annotations

import numpy as np
import pytest

from specgym.agents.specs import make
from specgym.baselines import tree_eagle_fit
from specgym.baselines.tree_eagle import EagleTree
from specgym.baselines.tree_eagle_fit import FittedEagleTree, fit_eagle, replay_grid
from specgym.envs.core.cost import CostProfile
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.workloads.trace_format import workload_from_requests
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.tree_runner import run_tree_controller

PROFILE = CostProfile("steep", 1.0, tuple(10.0 + 0.7 * n for n in range(9)), 0.3, source="synthetic")


def _requests(n_req: int, split: str, easy: bool, seed: int) -> list[dict]:
    """Synthetic requests: random ranks and top-8 rows, or (``easy``) the draft always right and sure of it."""
    rng = np.random.default_rng(seed)
    reqs = []
    for r in range(n_req):
        n = int(rng.integers(8, 50))
        if easy:
            rank = np.zeros(n, np.int32)
            topk = np.tile(np.array([0.99] + [0.01 / 7] * 7, np.float32), (n, 1))
        else:
            rank = np.minimum(rng.geometric(0.45, n) - 1, 20).astype(np.int32)
            topk = np.sort(rng.dirichlet(np.ones(10), n)[:, :8], axis=1)[:, ::-1].astype(np.float32)
        reqs.append({"request_id": f"{split}{r}", "category": "c", "temperature": 0.0, "prompt_len": 4,
                     "p_accept": (rank == 0).astype(np.float32), "draft_conf": topk[:, 0],
                     "draft_entropy": np.ones(n, np.float32), "target_rank": rank, "draft_topk": topk,
                     "split": split})
    return reqs


def _workload(test_easy: bool):
    """Fit split ``train`` (random); ``test``: random too, or all-accepted (where the deepest chain wins)."""
    reqs = _requests(8, "train", False, 0) + _requests(6, "test", test_easy, 1)
    return workload_from_requests("eagle-fit", {"kind": "synthetic", "generator": "tests"}, PROFILE, reqs)


def _scalar(engine: TreeEngine, reqs: np.ndarray, combo: tuple[int, int, int], drafter: str | None) -> float:
    ctrl = EagleTree(*combo)
    ctrl.drafter = drafter
    return float(run_tree_controller(engine, reqs, ctrl).time_ms.sum())


def test_the_vectorised_grid_is_the_scalar_replay_of_every_combination():
    wl = _workload(False)
    grid, per = replay_grid(wl, PROFILE, 8, None, "train")
    assert len(grid) == len(set(grid)) == len(per) > 300
    assert {(5, 4, 16), (3, 3, 3), (1, 1, 1)} <= set(grid)
    engine, reqs = TreeEngine(wl, PROFILE, 8), wl.split_indices("train")
    for combo, t in zip(grid, per):
        assert _scalar(engine, reqs, combo, None) == pytest.approx(t, rel=1e-12)


def test_the_fit_is_the_grids_best_on_the_fit_split_and_never_reads_the_test_split(monkeypatch):
    hard, easy = _workload(False), _workload(True)
    fit = fit_eagle(easy, PROFILE, 8)
    assert fit.split == easy.fit_split == "train"
    grid, per = replay_grid(hard, PROFILE, 8, None, "train")
    assert (fit.depth, fit.beam, fit.budget) == grid[int(np.argmin(per))] and fit.time_ms == pytest.approx(per.min())
    assert fit == fit_eagle(hard, PROFILE, 8)  # the test requests differ, the fit does not
    on_test = fit_eagle(easy, PROFILE, 8, split="test")
    assert (on_test.depth, on_test.beam, on_test.budget) != (fit.depth, fit.beam, fit.budget)  # test would choose
    asked: list[str] = []  # ... and the harness fits on the fit split while it evaluates the test split
    real = tree_eagle_fit.replay_grid
    monkeypatch.setattr(tree_eagle_fit, "replay_grid", lambda *a: asked.append(a[-1]) or real(*a))
    rep = evaluate(EvalConfig(easy, f"tree-eagle:fit,tree-eagle:{fit.depth}:{fit.beam}:{fit.budget}", split="test",
                              bootstrap=0))
    assert asked == ["train"]
    rows = {r["spec"]: r for r in rep["rows"]}
    fitted, given = rows["tree-eagle:fit"], rows[f"tree-eagle:{fit.depth}:{fit.beam}:{fit.budget}"]
    assert fitted["total_time_ms"] == given["total_time_ms"] and fitted["approximate"]
    note = f"fitted on eagle-fit's train split: tree-eagle:{fit.depth}:{fit.beam}:{fit.budget} (depth, beam, budget; "
    assert any(note in n for n in rep["notes"]), rep["notes"]


def test_tree_eagle_fit_spellings():
    ctrl = make("tree-eagle:fit", kinds=("tree",))
    assert isinstance(ctrl, FittedEagleTree) and ctrl.name == "tree-eagle:fit" and ctrl.drafter is None
    head = make("tree-eagle:FIT@head", kinds=("tree",))
    assert isinstance(head, FittedEagleTree) and head.name == "tree-eagle:fit@head" and head.drafter == "head"
    plain = make("tree-eagle", kinds=("tree",))  # the bare spec keeps EAGLE-2's published defaults
    assert type(plain) is EagleTree and (plain.depth, plain.beam, plain.budget) == (5, 4, 16)
    for bad in ("tree-eagle:fitt", "tree-eagle:3:3", "tree-eagle:a:b:c", "tree-eagle:fit@ngram"):
        with pytest.raises(SpecgymError) as exc:
            make(bad, kinds=("tree",))
        assert "\n" not in str(exc.value) and "tree-eagle" in str(exc.value)
    with pytest.raises(SpecgymError, match="call prepare"):
        ctrl.play(None)


def test_the_head_fit_replays_the_heads_own_columns():
    """On requests of the shipped recording (its head's ``ranks_head`` and ``topk_head``): the head's grid is the
    scalar replay of ``EagleTree@head`` (a sample of combinations), and ``tree-eagle:fit@head`` evaluates."""
    from specgym.envs.workloads.trace_format import cached_workload

    full = cached_workload("smollm2-greedy")
    val, test = full.split_indices("val"), full.split_indices("test")
    wl = full.subset(np.concatenate([val[:6], test[:2]]))
    assert wl.fit_split == "val" and wl.ranks_head is not None
    grid, per = replay_grid(wl, wl.profile, 8, "head", "val")
    engine, reqs = TreeEngine(wl, wl.profile, 8, drafter="head"), wl.split_indices("val")
    for j in range(0, len(grid), 11):
        assert _scalar(engine, reqs, grid[j], "head") == pytest.approx(per[j], rel=1e-12)
    fit = fit_eagle(wl, wl.profile, 8, "head")
    assert (fit.depth, fit.beam, fit.budget) == grid[int(np.argmin(per))]
    rep = evaluate(EvalConfig(wl, "tree-eagle:fit@head", split="val", bootstrap=0))
    row = next(r for r in rep["rows"] if r["spec"] == "tree-eagle:fit@head")
    assert row["total_time_ms"] == pytest.approx(fit.time_ms)  # fitted and played on val here
    assert any(f"tree-eagle:{fit.depth}:{fit.beam}:{fit.budget}@head" in n for n in rep["notes"])
