"""The strongest simple baselines of a drafter-choice table: the fitted two-line lookup switch and a chain rule's
adaptive K on any one drafter (``marginal@head``), replayed exactly and run live."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specgym.agents.specs import build, expand, row_of
from specgym.agents.traits import Traits
from specgym.baselines.drafter_chain import ChainOnDrafter
from specgym.baselines.lookup_switch import LookupSwitch, fit_switch
from specgym.cli import main
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate


@pytest.fixture(scope="module")
def smollm2():
    return cached_workload("smollm2-greedy"), load_profile("cpu-smollm2")


def _times(specs: str, split: str = "val") -> dict[str, float]:
    rep = evaluate(EvalConfig("smollm2-greedy", specs, split=split, profile="cpu-smollm2", bootstrap=0))
    return {r["spec"]: r["total_time_ms"] for r in rep["rows"]}


def test_the_switch_fit_is_the_replayed_argmin(smollm2):
    """The vectorised fit replays every combination with the trace engine's semantics: the switch it picks takes the
    time it says when the harness replays it, and no other combination replayed by the harness is faster."""
    wl, prof = smollm2
    fit = fit_switch(wl, prof, 8)
    assert fit.candidates == 4 * 8 * 8 * 2 and fit.lookup == "ngram" and fit.model in ("draft", "head")
    chosen = f"lookup-switch:{fit.m}:{fit.k_lookup}:{fit.k_model}@{fit.model}"
    others = ["lookup-switch:1:8:3@head", "lookup-switch:4:5:3@head", "lookup-switch:2:5:2@head",
              "lookup-switch:2:5:3@draft", "lookup-switch:3:6:4@head"]
    times = _times(",".join([chosen, *others]))
    assert times[chosen] == pytest.approx(fit.time_ms, rel=1e-9)
    assert all(times[chosen] <= times[o] for o in others if o != chosen), times


def test_the_fitted_switch_prepares_on_the_fit_split_and_names_itself(smollm2):
    wl, prof = smollm2
    rule = build("lookup-switch").controller
    assert isinstance(rule, LookupSwitch) and rule.name == "lookup-switch"
    (note,) = rule.prepare(wl, prof)
    assert "fitted on smollm2-greedy's val split" in note and rule.fitted is not None
    assert (rule.n, rule.k_lookup, rule.k_model, rule.model) == (rule.fitted.m, rule.fitted.k_lookup,
                                                                 rule.fitted.k_model, rule.fitted.model)
    given = build("lookup-switch:2:5:3@head").controller
    assert given.name == "lookup-switch:2:5:3@head" and given.prepare(wl, prof) == [] and given.fitted is None


@pytest.mark.parametrize("spec, fragment", [
    ("lookup-switch:0:5:3", "M in 1..4"),
    ("lookup-switch:2:99:3", "KN, KH in 1..8"),
    ("lookup-switch:2:5", "M:KN:KH[@MODEL]"),
    ("lookup-switch:a:b:c", "M:KN:KH[@MODEL]"),
])
def test_a_bad_switch_is_one_line(spec, fragment):
    with pytest.raises(SpecgymError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        build(spec)


def test_a_workload_without_a_lookup_drafter_cannot_fit_a_switch():
    with pytest.raises(SpecgymError, match="needs a lookup drafter.*lookup-switch:M:KN:KH@MODEL"):
        build("lookup-switch").controller.prepare(cached_workload("midpair-greedy"), load_profile("cpu-midpair"))


def test_a_chain_rule_decides_one_drafters_k(smollm2):
    """``marginal@head`` is a drafter-choice row: the marginal rule, priced by the head's round costs, decides the
    head's K every round; a rule that reads the head's entropy (not recorded) is refused."""
    wl, prof = smollm2
    row = build("marginal@head")
    assert row.kind == "drafter" and isinstance(row.controller, ChainOnDrafter)
    assert row.controller.name == "marginal@head" and row_of("assc@ngram").kind == "drafter"
    with pytest.raises(SpecgymError, match="entropy@head: entropy reads draft_entropy"):
        build("entropy@head")  # the head's confidence is recorded (confidence@head runs), its entropy is not
    with pytest.raises(SpecgymError, match="'@DRAFTER' picks a drafter"):
        build("marginal@head", kinds=("chain",))
    specs, _ = expand("all", traits=Traits.of(wl))
    assert {"marginal@ngram", "marginal@head", "lookup-switch"} <= set(specs)
    times = _times("marginal@head,fixed:1@head,fixed:3@head,fixed:8@head", split="test")
    # adaptive on the head's own outcomes: near its best fixed K, far from drafting one token or eight
    assert times["marginal@head"] < 0.95 * min(times["fixed:1@head"], times["fixed:8@head"]), times
    assert times["marginal@head"] < 1.02 * times["fixed:3@head"], times


def test_a_profile_led_by_another_drafter_prices_its_rounds_as_that_drafter():
    prof = load_profile("cpu-smollm2")
    led = prof.led_by("head", "model")
    assert led.drafter_names[0] == "head" and set(led.drafter_names) == set(prof.drafter_names)
    assert np.allclose(led.round_times(8), prof.round_times(8, drafter="head"))
    assert prof.led_by(prof.drafter_names[0], "model") is prof


def test_drafter_rows_are_compared_with_the_fitted_switch_first():
    rep = evaluate(EvalConfig("smollm2-greedy", "lookup-rule:3,lookup-switch,drafter-marginal", split="test",
                              profile="cpu-smollm2", bootstrap=0))
    rows = {r["spec"]: r for r in rep["rows"]}
    assert rep["lookup_rule"] == "lookup-switch"
    assert rows["lookup-switch"]["speedup_vs_lookup_rule"] == pytest.approx(1.0)
    assert rows["lookup-rule:3"]["speedup_vs_lookup_rule"] < 1.0  # the fixed rule falls back to the draft model


def test_a_chain_rule_on_prompt_lookup_runs_live_and_exactly(capsys):
    pytest.importorskip("torch")
    assert main(["generate", "--pair", "midpair", "--controller", "marginal@ngram", "--prompt", "def add(a, b):",
                 "--max-new-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["greedy_identical"] is True and out["kind"] == "drafter"
    assert all(r == "plain" or r.startswith("ngram:") for r in out["rounds"]), out
