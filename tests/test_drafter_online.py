"""Drafter choice that adapts to the request: counterfactual runs (replay and live), the per-request calibration,
the floor at plain, and what it recovers when its fit is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.baselines.drafter_marginal import DrafterMarginal, fit_on_fit_split
from specgym.baselines.drafter_online import DrafterOnline
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


def test_where_no_drafter_pays_it_drafts_less_than_its_fit(smollm2):
    """On a workload where every drafter's proposals are always rejected, the fit (made where they pay) drafts every
    round; the online rule sees the rejections and drafts less. It does not reach plain decoding's speed (0.82x on
    this workload at the shipped prior weight: the floor at plain is not yet met, docs/kinds/drafter.md)."""
    wl, prof = smollm2
    fit = fit_on_fit_split(wl, prof)
    cols = wl.flat_columns()
    cols.update({k: np.zeros_like(v) for k, v in cols.items() if k.startswith("runs_") or k == "p_accept"})
    hopeless = wl.with_columns(cols)
    rows = [("marginal", DrafterMarginal(fit)), ("online", DrafterOnline(fit))]
    rep = evaluate(EvalConfig(hopeless, rows, split="test", profile=prof, bootstrap=0))
    rows = {r["spec"]: r for r in rep["rows"]}
    vs_plain = {k: r["speedup_vs_ar"] for k, r in rows.items()}
    assert vs_plain["marginal"] < vs_plain["online"] - 0.02, vs_plain
    assert rows["online"]["mean_k"] < rows["marginal"]["mean_k"] - 0.5, rows
