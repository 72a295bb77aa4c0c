"""The one table of controller specs (specgym.agents.specs): parsing, `all`, building once, errors, extension."""

from __future__ import annotations

import ast
import collections
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_v2 import v2_workload

import specgym.agents.specs as specs
import specgym.envs.core.acceptance_predictor as acceptance_predictor
from specgym import make_controller
from specgym.agents.specs import Traits, all_specs, build, expand, resolve, usage_line
from specgym.agents.traits import signal_groups
from specgym.baselines.fixed import FixedK
from specgym.baselines.marginal import MarginalStop
from specgym.baselines.tree_static import StaticTree
from specgym.envs.core.controller import Controller
from specgym.envs.core.tree import TreeShape
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ["marginal", "assc", "speclane", "hf-heuristic", "confidence:0.4", "confidence:adaptive",
             "cumulative:0.3", "entropy", "ucb"]


def test_all_without_a_workload_is_every_baseline_then_fixed_k():
    chain, notes = all_specs(Traits.anything(), 8, ("chain",))
    assert chain == [*BASELINES, *(f"fixed:{k}" for k in range(1, 9))] and notes == []
    assert all_specs(Traits.anything(), 4, ("chain",))[0][-1] == "fixed:4"
    names, _ = expand("fixed:4, assc,fixed:4,ucb")
    assert names == ["fixed:4", "assc", "ucb"]
    assert expand("assc,all")[0][0] == "assc" and len(expand("assc,all")[0]) == len(BASELINES) + 8


@pytest.mark.parametrize("bad", ["fixed:x", "nope", "fixed:99", "assc,,nope", "", "assc:3", "confidence:abc"])
def test_a_bad_spec_is_one_short_line_pointing_to_the_valid_forms(bad):
    with pytest.raises(SpecgymError) as exc:
        resolve(bad, 8)
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 200, msg  # it was 1,153 characters, every form listed
    assert "'specgym eval --help' lists the valid forms" in msg
    assert (bad.split(",")[-1] or "no controller spec") in msg  # the bad part is named
    for form in ("fixed:K", "assc", "speclane", "confidence", "tree-static:W1-W2-..", "tree-oracle"):
        assert form in usage_line()  # where the help lists them


def test_kinds_keep_their_own_specs():
    with pytest.raises(SpecgymError, match="a batch controller, not chain or tree"):
        resolve("goodput", 8)
    with pytest.raises(SpecgymError, match="a chain controller, not batch"):
        resolve("assc", 8, kinds=("batch",))
    assert isinstance(build("static:3", kinds=("batch",)).controller.k, int)
    assert "tree-oracle" not in usage_line(live=True) and "tree-predicted" not in usage_line(live=True)
    assert "tree-eagle" in usage_line(live=True) and "goodput" in usage_line(("batch",))


def test_rows_carry_kind_family_and_level():
    rows = {r.spec: r for r in resolve("fixed:2,marginal,assc,tree-static:2-1,tree-oracle,ppo:midpair-token,"
                                       "predicted:midpair", 8)}
    assert (rows["fixed:2"].family, rows["fixed:2"].kind, rows["fixed:2"].entry.level) == ("fixed", "chain", "k")
    assert (rows["marginal"].family, rows["marginal"].entry.level) == ("rule", "token")
    assert rows["tree-static:2-1"].kind == "tree" and rows["tree-oracle"].controller is None
    assert rows["tree-oracle"].family == "oracle" and not rows["tree-oracle"].entry.live
    assert rows["ppo:midpair-token"].family == "learned" and rows["ppo:midpair-token"].entry.level == "token"
    assert rows["predicted:midpair"].family == "predictor"


def test_policies_are_named_by_their_mode(tmp_path):
    with pytest.raises(SpecgymError, match="tree-ppo:midpair-tree"):
        resolve("ppo:midpair-tree", 8)
    assert resolve("tree-ppo:midpair-tree", 8).rows[0].kind == "tree"
    # a bare policy folder is its mode's spec
    folder = ROOT / "data" / "policies" / "midpair-tree"
    assert resolve(str(folder), 8).rows[0].spec.startswith("tree-ppo:")


def test_all_for_a_workload_without_draft_confidence_leaves_the_stops_out_with_a_note():
    traits = dataclasses.replace(Traits.anything(), name="x", conf=False, known=True)
    chain, notes = all_specs(traits, 8, ("chain",))
    assert not {"confidence:0.4", "confidence:adaptive", "cumulative:0.3", "entropy"} & set(chain)
    assert "marginal" in chain and "fixed:8" in chain
    assert notes == ["confidence, cumulative, entropy: the trace carries no draft confidence or entropy"]


def test_all_for_a_recorded_workload_brings_its_pairs_predictors_and_trees():
    from specgym.envs.workloads.trace_format import cached_workload

    wl = cached_workload("midpair-greedy")
    traits = Traits.of(wl)
    assert traits.predictors == ("midpair",) and traits.tree and "lookup" in signal_groups(wl)
    names, notes = expand("all", 8, traits)
    assert {"predicted:midpair", "planned:midpair", "tree-sequoia", "tree-oracle", "tree-predicted:midpair"} \
        <= set(names) and notes == []
    t08 = Traits.of(cached_workload("midpair-t08"))
    assert not t08.tree and not any(s.startswith("tree") for s in expand("all", 8, t08)[0])


class Doubler(Controller):
    """A toy rule for the extension test: K = 2 x the last accepted count (at least 1)."""

    name = "toy-doubler"

    def reset(self, ctx):
        super().reset(ctx)
        self.k = 1

    def propose(self):
        return min(self.k, self.ctx.k_max)

    def observe(self, outcome):
        self.k = max(1, 2 * outcome.accepted)


def test_a_new_rule_is_one_file_plus_one_table_row():
    """Registered through the public table alone, a toy chain rule and a toy tree rule join `all`, run in the
    harness, get their family in the report and show in the usage line."""
    specs.register("toy-doubler", lambda arg, k_max: Doubler(), "toy-doubler", in_all=lambda t, k: ["toy-doubler"])
    specs.register("toy-tree", lambda arg, k_max: StaticTree(TreeShape.from_widths((2, 1)), "toy-tree"),
                   "toy-tree", kind="tree", family="fixed", in_all=lambda t, k: ["toy-tree"], needs=("tree",),
                   level="tree")
    try:
        assert "toy-doubler" in usage_line() and "toy-tree" in usage_line()
        wl = v2_workload(n_req=12, seed=3)
        rep = evaluate(EvalConfig(wl, "all", split="all", bootstrap=0))
        rows = {r["spec"]: r for r in rep["rows"]}
        assert rows["toy-doubler"]["family"] == "rule" and rows["toy-doubler"]["kind"] == "chain"
        assert rows["toy-tree"]["family"] == "fixed" and rows["toy-tree"]["tree"]
        with pytest.raises(SpecgymError, match="already registered"):
            specs.register("toy-doubler", lambda arg, k_max: Doubler())
        with pytest.raises(SpecgymError, match="invalid controller prefix"):
            specs.register("bad:name", lambda arg, k_max: Doubler())
    finally:
        specs.TABLE.pop(("chain", "toy-doubler"), None)
        specs.TABLE.pop(("tree", "toy-tree"), None)


def test_objects_resolve_by_their_type():
    mine = MarginalStop(0.9)
    rows = resolve(["fixed:1", mine, ("plain", FixedK(0))], 8).rows
    assert [r.spec for r in rows] == ["fixed:1", "marginal:0.9", "plain"]
    assert rows[1].controller is mine and rows[1].family == "rule" and rows[2].family == "fixed"
    with pytest.raises(SpecgymError, match="not a controller"):
        resolve([object()], 8)


def test_eval_builds_each_spec_once_and_reads_each_predictor_file_once(tmp_path, monkeypatch):
    """`specgym eval --controllers all` on a recorded workload: every row's factory runs once, the shipped
    predictor file is read once (its loads are counted by patching file reads)."""
    from specgym.cli import main

    built: collections.Counter[str] = collections.Counter()
    for key, entry in list(specs.TABLE.items()):
        if entry.factory is not None:
            def counting(arg, k_max, _entry=entry):
                built[f"{_entry.prefix}:{arg}" if arg is not None else _entry.prefix] += 1
                return _entry.factory(arg, k_max)

            monkeypatch.setitem(specs.TABLE, key, dataclasses.replace(entry, factory=counting))
    reads: collections.Counter[str] = collections.Counter()
    real_read_text = Path.read_text

    def read_text(self, *a, **k):
        if self.suffix == ".json" and "predictors" in self.parts:
            reads[self.name] += 1
        return real_read_text(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(acceptance_predictor, "_LOADED", {})
    out = tmp_path / "rep"
    assert main(["eval", "--workload", "midpair-greedy", "--controllers", "all", "--max-requests", "5",
                 "--bootstrap", "0", "--no-plots", "--out", str(out)]) == 0
    assert built and max(built.values()) == 1, built
    assert reads["midpair.json"] == 1 and set(reads.values()) == {1}, reads  # every shipped predictor: once
    rep = json.loads((out / "report.json").read_text())
    assert {r["spec"] for r in rep["rows"]} >= {"predicted:midpair", "tree-predicted:midpair", "fixed:8"}


MODE_NAMES = ("k", "token", "tree", "batch")


def _mode_branches(path: Path) -> int:
    """``mode == 'k'``-style comparisons (a name or attribute called ``mode`` against a mode name)."""
    n = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            names = [node.left, *node.comparators]
            has_mode = any(isinstance(x, ast.Name) and x.id == "mode" or isinstance(x, ast.Attribute)
                           and x.attr == "mode" for x in names)
            has_name = any(isinstance(x, ast.Constant) and x.value in MODE_NAMES for x in names)
            n += has_mode and has_name
    return n


def test_mode_questions_are_table_lookups():
    """The `mode ==` branches outside the mode table are at most 5 (issue 27: 35 before)."""
    files = [p for d in ("agents", "baselines", "envs", "eval", "training", "specgym") for p in (ROOT / d).rglob("*.py")
             if p.name != "modes.py"]
    counts = {str(p.relative_to(ROOT)): c for p in files if (c := _mode_branches(p))}
    assert sum(counts.values()) <= 5, counts


def test_the_mode_count_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(mode, cfg):\n    if mode == 'k':\n        return 1\n    return cfg.mode != 'token'\n")
    assert _mode_branches(probe) == 2


def test_front_door_make_controller_is_the_table():
    assert isinstance(make_controller("fixed:3"), FixedK)
    assert np.isclose(make_controller("marginal:0.5").threshold, 0.5)
