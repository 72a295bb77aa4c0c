"""``specgym workloads import vllm-metrics``: vLLM responses with ``metrics.speculative_decoding`` (detailed) as a
censored per-start workload; what replays from it; the censored-data oracle bound; one-line errors.

The files are written here in the documented shape (vllm-project/vllm docs/features/speculative_decoding/
acceptance_metrics.md): test data, not a recording."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specgym.baselines.oracle import oracle_times
from specgym.envs.workloads.trace_format import load_workload
from specgym.envs.workloads.vllm_metrics import import_metrics, known_runs, match_flags, optimistic_runs

K = 3


def response(rid: str, accepted: list[int], drafted: list[int] | None = None, prompt: int = 40,
             **override) -> dict:
    """One non-streaming completions response as vLLM returns it with --per-request-spec-decode-metrics detailed."""
    drafted = [K] * len(accepted) if drafted is None else drafted
    n_acc, n_dft = sum(accepted), sum(drafted)
    sd = {"mean_acceptance_length": 1 + n_acc / max(len(accepted), 1),
          "draft_acceptance_rate": n_acc / n_dft if n_dft else 0.0,
          "acceptance_histogram": [accepted.count(j) for j in range(K + 1)], "num_spec_steps": len(accepted),
          "num_accepted_draft_tokens": n_acc, "num_draft_tokens": n_dft, "num_spec_tokens": K,
          "per_step_accepted": accepted, "per_step_drafted": drafted}
    sd.update(override)
    return {"id": rid, "object": "text_completion", "model": "m", "choices": [{"index": 0, "text": "..."}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 1 + sum(a + 1 for a in accepted),
                      "total_tokens": 0}, "metrics": {"speculative_decoding": sd}}


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def random_rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n):
        acc = [int(min(rng.geometric(0.3) - 1, K)) for _ in range(int(rng.integers(20, 60)))]
        rows.append(response(f"cmpl-{r}", acc, prompt=30 + r))
    return rows


def specgym(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specgym", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_run_semantics_of_the_steps():
    # steps: accepted 2 of 3 (reject), all 3 of 3 (censored bonus), 0 of 3 (reject), 1 of 1 (censored)
    flags = match_flags([2, 3, 0, 1], [3, 3, 3, 1])
    assert flags.tolist() == [1, 1, 0, 1, 1, 1, -1, 0, 1, -1]
    assert known_runs(flags).tolist() == [2, 1, 0, 3, 2, 1, 0, 0, 1, 0]
    assert optimistic_runs(flags).tolist() == [2, 1, 0, 4, 3, 2, 1, 0, 2, 1]
    assert match_flags([0], [0]).tolist() == [-1]  # a step that drafted nothing: its one position is censored


def test_import_replays_the_recorded_schedule_exactly(tmp_path):
    rows = [response("a", [2, 3, 0, 1], [3, 3, 3, 1]), response("b", [], []), response("c", [3, 3, 1])]
    imp = import_metrics(write(tmp_path / "chat.jsonl", rows))
    wl = imp.workload
    assert wl.source["kind"] == "imported" and "imported engine metrics" in wl.label
    assert wl.n_requests == 2 and imp.skipped == 1  # "b" had no verification step
    assert wl.p_accept is None and wl.draft_conf is None  # absent, never zeros
    assert wl.prompt_len.tolist() == [41, 41] and wl.lengths.tolist() == [10, 10]
    runs = wl.runs["vllm"][wl.span(0)]
    for g, a, d in ((0, 2, 3), (3, 3, 3), (7, 0, 3), (8, 1, 1)):  # the recorded cap at each start gives its a
        assert min(int(runs[g]), d) == a
    assert "2 requests" in imp.summary() and "censored" in imp.summary()


def test_folder_is_one_workload_with_file_categories(tmp_path):
    write(tmp_path / "code.jsonl", random_rows(3, 1))
    write(tmp_path / "chat.jsonl", [response(f"x{r}", [1, 2, 3]) for r in range(2)])
    wl = import_metrics(tmp_path, name="mine").workload
    assert wl.name == "mine" and sorted(wl.categories()) == ["chat", "code"] and wl.n_requests == 5


def test_import_and_eval_end_to_end_via_the_cli(tmp_path):
    src = write(tmp_path / "chat.jsonl", random_rows(40))
    out = tmp_path / "mine.parquet"
    imp = specgym("workloads", "import", "vllm-metrics", str(src), "--out", str(out), "--method", "eagle3",
                  cwd=tmp_path)
    assert imp.returncode == 0, imp.stderr
    assert "wrote" in imp.stdout and out.is_file()
    ev = specgym("eval", "--workload", str(out), "--out", str(tmp_path / "ev"), "--no-plots", "--bootstrap", "0",
                 cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    assert "imported engine metrics, replayed" in ev.stdout
    assert "left out of all: confidence, cumulative, entropy: the trace carries no draft confidence" in ev.stdout
    assert "censored-data oracle bound" in ev.stderr
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    specs = [row["spec"] for row in report["rows"]]
    assert "fixed:3" in specs and not any(s.startswith(("confidence", "entropy", "cumulative")) for s in specs)
    bound = report["censored_oracle"]
    # the bound is above the known-runs oracle and every controller's throughput
    assert bound["throughput_tok_s"] > bound["known_oracle_tok_s"] >= max(r["throughput_tok_s"]
                                                                           for r in report["rows"]) - 1e-6
    # and it is the clairvoyant DP on the optimistic runs of the test requests, recomputed here
    wl = load_workload(out)
    steps = wl.extra["vllm_metrics"]["steps"]
    test = wl.split_indices("test")
    runs = np.concatenate([optimistic_runs(match_flags(*steps[r])) for r in test])
    assert bound["positions"] == int(wl.lengths[test].sum()) == len(runs)


def test_bound_dp_is_the_oracle_on_optimistic_runs():
    flags = match_flags([3, 3, 3, 0], [3, 3, 3, 3])
    rt = np.array([10.0, 11, 12, 13, 14, 15, 16, 17, 18])
    offsets = np.array([0, len(flags)])
    lo = oracle_times(known_runs(flags), offsets, rt, 8)[0]
    hi = oracle_times(optimistic_runs(flags), offsets, rt, 8)[0]
    assert hi < lo  # more known acceptance, less time: the optimistic DP bounds the true one from below


def test_output_equal_to_input_is_refused(tmp_path):
    src = write(tmp_path / "chat.jsonl", random_rows(2))
    before = src.read_bytes()
    res = specgym("workloads", "import", "vllm-metrics", str(src), "--out", str(src), "--force", cwd=tmp_path)
    assert res.returncode == 2 and "is an input" in res.stderr and src.read_bytes() == before


@pytest.mark.parametrize("rows, expect", [
    (["{not json"], "line 1: not valid JSON"),
    ([{"id": "a", "usage": {"prompt_tokens": 3}}], "line 1: field 'metrics.speculative_decoding' is missing"),
    ([{"id": "a", "usage": {"prompt_tokens": 3}, "metrics": {"speculative_decoding": None}}],
     "line 1: field 'metrics.speculative_decoding' is null"),
    ([response("a", [1]), response("b", [1, 2], per_step_accepted=None)],
     "line 2: field 'metrics.speculative_decoding.per_step_accepted' is missing: record with "
     "--per-request-spec-decode-metrics detailed"),
    ([response("a", [1, 4])], "line 1: field metrics.speculative_decoding.per_step_accepted[1] = 4"),
    ([response("a", [2, 1], [1, 3])], "line 1: field metrics.speculative_decoding.per_step_accepted[0] = 2 exceeds"),
    ([response("a", [1, 1], num_accepted_draft_tokens=5)],
     "line 1: field metrics.speculative_decoding.num_accepted_draft_tokens = 5 disagrees"),
    ([response("a", [1, 1], acceptance_histogram=[0, 1, 1, 0])],
     "line 1: field metrics.speculative_decoding.acceptance_histogram"),
    ([response("a", [1], per_step_drafted=[3, 3])], "line 1: fields metrics.speculative_decoding.per_step_accepted "
                                                    "and per_step_drafted differ in length"),
    ([response("a", [1]), "", response("a", [2])], "line 3: field 'id' 'a' repeats the request of"),
    ([{**response("a", [1]), "usage": {"completion_tokens": 3}}], "line 1: field 'usage.prompt_tokens' = None"),
    ([response("a", [1], num_spec_tokens=0)], "line 1: field 'metrics.speculative_decoding.num_spec_tokens' = 0"),
    ([], "no responses (an empty file)"),
])
def test_bad_files_one_line_naming_file_line_field(tmp_path, rows, expect):
    src = write(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "w.parquet"
    res = specgym("workloads", "import", "vllm-metrics", str(src), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and str(src) in err and expect in err, err
    assert not out.exists() and not list(tmp_path.glob("*.parquet*"))  # no partial output


@pytest.mark.parametrize("opts, expect", [
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--drafters", "a b"], "--drafters 'a b'"),
    (["--profile", "nope"], "nope"),
])
def test_bad_options_one_line(tmp_path, opts, expect):
    src = write(tmp_path / "chat.jsonl", random_rows(2))
    res = specgym("workloads", "import", "vllm-metrics", str(src), "--out", str(tmp_path / "w.parquet"), *opts,
                  cwd=tmp_path)
    assert res.returncode == 2 and expect in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "w.parquet").exists()


def _import(tmp_path: Path, rows: list, *opts: str, name: str = "bad.jsonl") -> subprocess.CompletedProcess:
    src = write(tmp_path / name, rows)
    return specgym("workloads", "import", "vllm-metrics", str(src), "--out", str(tmp_path / "w.parquet"), *opts,
                   cwd=tmp_path)


def _one_line(res: subprocess.CompletedProcess, *expect: str) -> str:
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for e in expect:
        assert e in err, err
    return err


def test_huge_num_spec_tokens_with_a_histogram_is_refused_at_once(tmp_path):
    # the report's F4 line: num_spec_tokens 10^9 sized a histogram check of k * n (5 GB, a hang)
    row = response("a", [1, 2, 0], num_spec_tokens=10**9, acceptance_histogram=[1, 1, 1])
    res = _import(tmp_path, [row])
    _one_line(res, "bad.jsonl, line 1", "'metrics.speculative_decoding.num_spec_tokens' = 1000000000",
              "[1, 128]")
    assert not (tmp_path / "w.parquet").exists()


def test_huge_num_spec_tokens_without_a_histogram_is_refused(tmp_path):
    row = response("a", [1, 2, 0], num_spec_tokens=10**9)
    del row["metrics"]["speculative_decoding"]["acceptance_histogram"]
    _one_line(_import(tmp_path, [row]), "line 1", "num_spec_tokens' = 1000000000")


def test_a_suffix_decoding_k_of_32_imports(tmp_path):
    # vLLM's suffix decoding runs at num_speculative_tokens 32: within the bound
    acc = [32, 5, 0, 31]
    row = response("a", acc, [32] * 4, num_spec_tokens=32, acceptance_histogram=[acc.count(j) for j in range(33)])
    imp = import_metrics(write(tmp_path / "s.jsonl", [row]), method="suffix")
    assert imp.workload.n_positions == sum(a + 1 for a in acc)


@pytest.mark.parametrize("prompt", [2**40, 10**30, 2**31 - 1])
def test_prompt_tokens_beyond_int32_is_one_line(tmp_path, prompt):
    res = _import(tmp_path, [response("a", [1, 2], prompt=prompt)])
    _one_line(res, "bad.jsonl, line 1", f"field 'usage.prompt_tokens' = {prompt}", "int32")


def test_prompt_len_outside_int32_is_refused_by_the_builder():
    from specgym.envs.profiles import load_profile
    from specgym.envs.workloads.build import workload_from_requests
    from specgym.errors import SpecgymError

    req = {"request_id": "a", "category": "c", "temperature": 0.0, "prompt_len": 2**40,
           "runs": {"d": np.zeros(3, np.int16)}}
    with pytest.raises(SpecgymError, match=r"field 'prompt_len' = 1099511627776 of request 'a'"):
        workload_from_requests("x", {"kind": "imported"}, load_profile("h100-llama31-8b"), [req])


@pytest.mark.parametrize("override, expect", [
    # F8: the summary floats, checked the way vLLM's own test does
    ({"num_spec_tokens": 5, "acceptance_histogram": None, "mean_acceptance_length": 9.9},
     "mean_acceptance_length = 9.9: expected a number in [0, 6] (1 + num_accepted_draft_tokens / num_spec_steps; "
     "the per-step arrays give 3)"),
    ({"mean_acceptance_length": 2.9}, "mean_acceptance_length = 2.9 disagrees with the per-step arrays (1 + "
                                      "num_accepted_draft_tokens / num_spec_steps = 3)"),
    ({"draft_acceptance_rate": 1.7}, "draft_acceptance_rate = 1.7: expected a number in [0, 1]"),
    ({"draft_acceptance_rate": 0.9}, "draft_acceptance_rate = 0.9 disagrees with the per-step arrays"),
    ({"draft_acceptance_rate": "0.5"}, "draft_acceptance_rate = '0.5': expected a number"),
    # booleans are not integers
    ({"num_spec_steps": True}, "field 'metrics.speculative_decoding.num_spec_steps' = True: expected an integer in "
                               "[0, 2,147,483,647] (true and false are not counts)"),
    ({"acceptance_histogram": [0, True, 0, 1]}, "acceptance_histogram = [0, True, 0, 1] disagrees"),
])
def test_summary_fields_inconsistent_with_the_steps_are_refused(tmp_path, override, expect):
    _one_line(_import(tmp_path, [response("a", [1, 3], **override)]), "bad.jsonl, line 1", expect)


def test_summary_floats_of_a_request_with_no_step_are_taken(tmp_path):
    rows = [response("a", [1, 3]), response("b", [], [], mean_acceptance_length=0.0, draft_acceptance_rate=0.0),
            response("c", [], [], mean_acceptance_length=None, draft_acceptance_rate=None)]
    assert import_metrics(write(tmp_path / "ok.jsonl", rows)).skipped == 2


def test_id_with_a_newline_is_refused_as_specdecode_bench_does(tmp_path):
    _one_line(_import(tmp_path, [response("a\nb", [1])]), "line 1", "field 'id' 'a\\nb' holds a control character")


def test_two_choices_with_metrics_are_refused(tmp_path):
    row = response("a", [1, 2])
    row["choices"] = [{"index": 0, "text": "x"}, {"index": 1, "text": "y"}]
    _one_line(_import(tmp_path, [row]), "line 1", "field 'choices' has 2 entries", "n == 1")


def test_completion_tokens_far_below_the_steps_is_refused(tmp_path):
    row = response("a", [5, 5, 3, 5, 0] * 8, num_spec_tokens=5, acceptance_histogram=None)
    row["metrics"]["speculative_decoding"]["per_step_drafted"] = [5] * 40
    row["metrics"]["speculative_decoding"]["num_draft_tokens"] = 200
    row["metrics"]["speculative_decoding"]["draft_acceptance_rate"] = 144 / 200
    row["usage"]["completion_tokens"] = 1  # the report's line: 1 against steps that make 184 tokens
    _one_line(_import(tmp_path, [row]), "line 1", "field 'usage.completion_tokens' = 1 is below",
              "at most the last step's tokens, 1 here")


def test_summary_never_prints_a_negative_token_count(tmp_path):
    cut = response("a", [1, 3])  # 1 + 6 tokens; a stop string cut 2 of the last step's 4
    cut["usage"]["completion_tokens"] -= 2
    plain = response("b", [2, 0])  # 4 plain decode tokens besides the steps
    plain["usage"]["completion_tokens"] += 4
    imp = import_metrics(write(tmp_path / "chat.jsonl", [cut, plain]))
    line = imp.summary()
    assert "4 completion tokens outside the recorded steps (plain decode steps" in line
    assert "2 tokens of last steps cut from the completion by a stop string" in line
    assert not re.search(r"-\d", line.split(": ", 1)[1])
    assert imp.workload.extra["vllm_metrics"]["cut_tokens"] == 2


def test_folder_summary_names_the_entries_not_imported(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write(src / "a.jsonl", [response("x", [1, 2])])
    write(src / "b.json", [response("y", [1, 2])])
    write(src / "A.JSONL", [response("z", [1, 2])])
    out = tmp_path / "w.parquet"
    res = specgym("workloads", "import", "vllm-metrics", str(src), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "2 folder entries not imported (only *.jsonl files are read): A.JSONL, b.json" in res.stdout


@pytest.mark.parametrize("opts, expect", [
    (["--method", "nonsense method"], "--method 'nonsense method': expected vLLM's speculative_config method"),
    (["--temperature", "inf"], "--temperature must be >= 0 and finite"),
    (["--temperature", "nan"], "--temperature must be >= 0 and finite"),
    (["--drafters", "eagle,ngram"], "--drafters 'eagle,ngram': expected one drafter name for vllm-metrics"),
])
def test_bad_options_name_the_flag_and_the_value(tmp_path, opts, expect):
    res = _import(tmp_path, random_rows(2), *opts, name="chat.jsonl")
    err = _one_line(res, expect)
    assert "workload 'vllm" not in err and "kind in" not in err


def test_truncated_line_message_says_at_once(tmp_path):
    err = _one_line(_import(tmp_path, ['{"id": "cmpl-1', ""]),
                    "line 1: not valid JSON (Unterminated string starting at column 8)")
    assert "at at" not in err
