"""Drafter choice that adapts to the request: counterfactual runs (replay and live), the per-request calibration,
the floor at plain (it stops drafting where drafting loses, probes rarely, drafts again when evidence turns), and what
it recovers when its fit is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.baselines.drafter_marginal import DrafterMarginal, fit_on_fit_split
from specgym.baselines.drafter_online import DrafterOnline, PlainFloor
from specgym.envs.core.drafter_choice import drive_drafters
from specgym.envs.core.ngram_proposer import ngram_runs
from specgym.envs.core.rounds import RoundOutcome
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.eval.harness import EvalConfig, evaluate


@pytest.fixture(scope="module")
def smollm2():
    return cached_workload("smollm2-greedy"), load_profile("cpu-smollm2")


def test_replay_reports_prompt_lookups_run_where_it_did_not_play(smollm2):
    """A round drafted by the head carries the n-gram drafter's recorded run at its start, censored at what the round
    verified; where prompt lookup had nothing to propose, and on a sampled request, nothing."""
    wl, prof = smollm2
    eng = TraceEngine(wl, prof, 8)
    r = int(wl.split_indices("test")[0])
    req, runs, found = eng.start(r), eng.request_runs(r, "ngram"), wl.lookup_len[wl.span(r)]
    seen = 0
    while not req.done:
        i = req.position
        o = req.play(3, None, drafter="head")
        expect = () if found[i] == 0 else (("ngram", min(int(runs[i]), o.produced)),)
        assert o.counterfactual == expect, (i, o)
        seen += bool(expect)
    assert seen > 0
    assert eng.start(r).play(2, None, drafter="ngram").counterfactual == ()  # prompt lookup played: its own outcome
    sampled = cached_workload("smollm2-t07")
    assert TraceEngine(sampled, prof, 8).start(0).play(2, None, drafter="head").counterfactual == ()


def test_the_live_engine_reads_prompt_lookups_run_off_the_verified_tokens():
    """Live, greedy: each round the draft model played reports prompt lookup's run from its start, equal to the
    recorder's own per-start runs of the finished completion (censored at the round's tokens)."""
    torch = pytest.importorskip("torch")
    from specgym.envs.engines.live.engine import LiveEngine
    from specgym.envs.engines.live.model_loading import load_pair
    from specgym.paths import MODELS_DIR

    torch.set_num_threads(1)
    pair = load_pair(str(MODELS_DIR / "tinypair" / "draft"), str(MODELS_DIR / "tinypair" / "target"),
                     fast_kernels=False)
    eng = LiveEngine.from_pair(pair, k_max=4)
    prompt = pair.tokenizer("the cat sat on the mat. the cat sat on the mat. the cat")["input_ids"]
    req = eng.start(prompt, 24)
    rounds: list[RoundOutcome] = []
    while not req.done:
        rounds.append(req.play(2))
    recorded = ngram_runs(prompt, req.result.tokens, 4)
    judged = [o for o in rounds if o.counterfactual]
    assert judged, "a repetitive prompt gives prompt lookup something to propose"
    for o in judged:
        (name, run), = o.counterfactual
        assert name == "ngram" and run == min(int(recorded[o.position]), o.produced), o
    sampled = eng.start(prompt, 8, temperature=0.8, seed=1)
    assert all(sampled.play(2).counterfactual == () for _ in range(2))


def test_calibration_follows_the_request():
    rule = DrafterOnline(prior_tokens=4.0)
    rule._seen = {"head": [0.0, 0.0]}
    assert rule.calibration("head") == 1.0  # the fit's prediction before any evidence
    rule._predicted = {"head": np.array([1.0, 1.9, 2.7, 3.4, 4.0])}  # E(K): 0.9 + 0.8 + 0.7 + 0.6 accepted at K = 4
    rule._count("head", 0, 4)  # nothing accepted where the fit expected 3 tokens
    assert rule.calibration("head") == pytest.approx(4.0 / 7.0)
    rule._count("head", 4, 4)
    assert rule.calibration("head") == pytest.approx(8.0 / 10.0)


def test_with_its_own_fit_it_ties_the_rule_it_calibrates(smollm2):
    """In distribution the calibration stays near 1: within half a percent of drafter-marginal on the test split."""
    rep = evaluate(EvalConfig("smollm2-greedy", "drafter-online,drafter-marginal", split="test",
                              profile="cpu-smollm2", bootstrap=0))
    t = {r["spec"]: r["total_time_ms"] for r in rep["rows"]}
    assert abs(t["drafter-marginal"] / t["drafter-online"] - 1) < 0.005, t


def test_a_wrong_fit_is_corrected_on_the_request(smollm2):
    """Fitted on the train split (where the head and the draft model learned their prompts: the fit over-trusts
    them, as on prompts nobody here wrote), the online rule recovers part of what the fixed rule loses."""
    wl, prof = smollm2
    wrong = fit_on_fit_split(wl, prof, split="train")
    rep = evaluate(EvalConfig("smollm2-greedy", [("marginal", DrafterMarginal(wrong)),
                                                 ("online", DrafterOnline(wrong))], split="test", profile=prof,
                              bootstrap=0))
    t = {r["spec"]: r["total_time_ms"] for r in rep["rows"]}
    assert t["marginal"] / t["online"] > 1.02, t


def _hopeless(wl, keep=None, turn=0, pays=None):
    """``wl`` with every drafter's proposals rejected (the default drafter's through ``p_accept``, per position); on
    request ``keep`` from position ``turn`` on, drafter ``pays`` has every proposal accepted."""
    cols = wl.flat_columns()
    for key in [k for k in cols if k.startswith("runs_")] + ["p_accept"]:
        col = np.zeros_like(cols[key])
        if keep is not None and key in (f"runs_{pays}", "p_accept" if pays == wl.drafter_names[0] else ""):
            col[wl.offsets[keep] + turn: wl.offsets[keep + 1]] = 1 if key == "p_accept" else 16
        cols[key] = col
    return wl.with_columns(cols)


def test_where_no_drafter_pays_it_decodes_at_plain_speed(smollm2):
    """Every proposal rejected (validation split): the fit, made where drafters pay, drafts every round (0.80x
    plain); the calibration alone falls too slowly (0.82x); the floor stops drafting after a few rounds and probes
    rarely: within 3% of plain decoding (0.972x measured, docs/kinds/drafter.md)."""
    wl, prof = smollm2
    fit = fit_on_fit_split(wl, prof)
    rows = [("marginal", DrafterMarginal(fit)), ("online", DrafterOnline(fit)),
            ("no-floor", DrafterOnline(fit, floor=PlainFloor(stop_loss=float("inf"))))]
    rep = evaluate(EvalConfig(_hopeless(wl), rows, split="val", profile=prof, bootstrap=0))
    vs_plain = {r["spec"]: r["speedup_vs_ar"] for r in rep["rows"]}
    assert vs_plain["online"] >= 0.97, vs_plain
    assert vs_plain["no-floor"] < 0.85 and vs_plain["marginal"] < 0.85, vs_plain


def test_the_floor_stops_probes_rarely_and_drafts_again_when_evidence_turns(smollm2):
    """A request whose proposals are all rejected up to its middle, then all accepted for one drafter: drafting
    stops within the first rounds, probes come at growing gaps, and drafting resumes after the turn, from prompt
    lookup's free counterfactual (``ngram``) or from a probe (``head``, which no counterfactual shows), and pays."""
    wl, prof = smollm2
    fit = fit_on_fit_split(wl, prof)
    val = wl.split_indices("val")
    r = int(val[np.argmax(wl.lengths[val])])
    n = int(wl.lengths[r])
    turn = n // 2
    for pays in ("ngram", "head"):
        w = _hopeless(wl, r, turn, pays)
        rule = DrafterOnline(fit)
        rule.prepare(w, prof)
        log: list[tuple[int, int, bool]] = []
        drive_drafters(rule, TraceEngine(w, prof, 8).start(r), w.drafter_names,
                       on_round=lambda o: log.append((o.position, o.drafted, rule.floor.stopped)))
        before = [x for x in log if x[0] < turn]
        first_stop = next(i for i, x in enumerate(before) if x[2])
        assert first_stop <= 8, (pays, before[:12])
        probes = [p for p, k, _ in before[first_stop + 1:] if k]
        assert all(k == 1 for _, k, _ in before[first_stop + 1:] if k), (pays, before)
        assert 2 <= len(probes) <= 6 and all(b > a for a, b in zip(np.diff(probes), np.diff(probes)[1:])), probes
        after = [x for x in log if x[0] >= turn]
        assert not after[-1][2] and sum(k > 0 for _, k, _ in after) > len(after) / 2, (pays, after)
        assert len(after) < (n - turn) / 2, (pays, len(after))  # drafting again pays: under half a round a token


def test_the_floor_keeps_the_figures_where_the_fit_is_right(smollm2):
    """Its own fit, validation split: the floor never stops drafting (the same total time as the rule without it,
    to 0.1%), and the row keeps its measured speed (1.5945x plain, deterministic replay)."""
    wl, prof = smollm2
    fit = fit_on_fit_split(wl, prof)
    rows = [("online", DrafterOnline(fit)), ("no-floor", DrafterOnline(fit, floor=PlainFloor(stop_loss=float("inf"))))]
    rep = evaluate(EvalConfig(wl, rows, split="val", profile=prof, bootstrap=0))
    rows = {r["spec"]: r for r in rep["rows"]}
    assert rows["online"]["total_time_ms"] == pytest.approx(rows["no-floor"]["total_time_ms"], rel=1e-3), rows
    assert rows["online"]["speedup_vs_ar"] == pytest.approx(1.5945, abs=0.002), rows["online"]["speedup_vs_ar"]


def test_the_floors_ledger_stops_probes_at_growing_gaps_and_resumes():
    """The floor alone: a realised loss is not enough while a shorter cap would have paid; both losses stop it;
    failed probes double the gap; a probe that pays resumes with the ledger at zero."""
    floor = PlainFloor(stop_loss=1.5, hindsight_loss=0.5, first_gap=2, growth=2.0)
    floor.reset()
    floor.drafted(-2.0, 0.5)  # a cap too long: lost, but K = 1 would have paid
    assert not floor.stopped
    floor.drafted(-0.2, -1.2)
    assert floor.stopped and floor.stops == 1 and not floor.probe_due
    floor.waited = 2
    assert floor.probe_due
    floor.probed(False)
    assert floor.gap == 4 and floor.waited == 0 and floor.stopped
    floor.probed(True)
    assert not floor.stopped and floor.loss == 0.0 and floor.hindsight == 0.0 and floor.gap == 4
