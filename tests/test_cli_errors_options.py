"""CLI errors of bad flags and values: each is one line naming the flag or the bad part (never a traceback, never
advice that leads back to the same error), checked before any work, and nothing is written. The same checks hold
through the Python API (env configs, controller specs and proposals).

The other CLI-error tests, by concern: ``test_cli_errors_inputs.py`` (bad files, fields and workloads),
``test_cli_outputs.py`` (outputs), ``test_cli_fuzz.py`` (every command with a table of bad values).
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import specgym
from specgym import Controller, SpecgymError, drive, make_controller
from specgym.baselines.batch_rules import BatchSizeTable
from specgym.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
TUNE = ["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
        "--requests", "4"]


def _one_line_error(capsys, *fragments: str) -> str:
    """The captured stderr is one line holding every fragment, with no traceback and no blank line before it (a
    progress bar that showed nothing prints nothing); returns it."""
    err = capsys.readouterr().err
    assert err.strip() and "\n" not in err.strip() and "Traceback" not in err, err
    assert not err.startswith("\n"), err
    for f in fragments:
        assert f in err, err
    return err.strip()


# ------------------------------------------------------------------------------------ numbers and sizes
@pytest.mark.parametrize("argv,fragment", [
    (["eval", "--max-requests", "0"], "--max-requests: must be >= 1, got 0"),
    (["eval", "--max-requests", "-1"], "--max-requests: must be >= 1, got -1"),
    (["eval", "--k-max", "17"], "--k-max: must be in [1, 16], got 17"),
    (["eval", "--seed", "-3"], "--seed: must be >= 0"),
    (["train", "--timesteps", "0"], "--timesteps: must be >= 1, got 0"),
    (["train", "--timesteps", "-5"], "--timesteps: must be >= 1, got -5"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "--temperature: must be >= 0"),
    (["generate", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens: must be >= 1"),
    (["workloads", "make", "--preset", "geometric", "--requests", "0", "--out", "x.parquet"], "--requests"),
    (["bench", "eval", "--requests", "0"], "--requests: must be >= 1"),
    (["demo", "--k-steps", "0"], "--k-steps: must be >= 1"),
    (["train", "--workload", "assc-regimes", "--timesteps", "0", "--out", "r"], "--timesteps: must be >= 1, got 0"),
    # sizes that would run out of memory are bounded
    (["eval", "--bootstrap", "10000000000"], "--bootstrap"),
    (["eval", "--bootstrap", "1"], "may exclude its estimate"),
    (["workloads", "make", "--preset", "speclane-mix", "--requests", "100000000000", "--out", "x.parquet"],
     "--requests"),
])
def test_numeric_options_are_checked(argv, fragment, capsys, tmp_path, monkeypatch):
    """Out-of-range numbers (and sizes that would exhaust memory) are refused before any work: nothing written."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    _one_line_error(capsys, fragment)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("spec,fragment", [
    ("confidence:2", "confidence TAU must be in [0, 1]"),
    ("cumulative:-1", "cumulative H must be in [0, 1]"),
    ("entropy:1.5", "entropy LAM must be in [0, 1]"),
    ("fixed:9", "fixed needs an integer K in 0..8"),
])
def test_spec_parameters_are_checked(spec, fragment, capsys, tmp_path):
    assert main(["eval", "--workload", "assc-regimes", "--controllers", spec, "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, fragment)  # and no blank line before it (the progress bar never started)
    assert not (tmp_path / "o").exists()


def test_record_checks_arguments_before_loading_models(tmp_path, capsys, monkeypatch):
    import specgym.envs.engines.live.model_loading as le

    def boom(*a, **k):  # pragma: no cover - reached only if validation came too late
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(le, "load_model", boom)
    prompts = ROOT / "data" / "workloads" / "tinypair-prompts.jsonl"
    for extra, fragment in ((["--max-new-tokens", "10-5"], "need 1 <= LO <= HI"),
                            (["--splits", "0.5,0.5,0.5"], "summing to 1"),
                            (["--gen-k", "9"], "above --k-max"),
                            (["--dtype", "float8"], "choose one of")):
        assert main(["record", "--prompts", str(prompts), "--out", str(tmp_path / "w.parquet"), *extra]) == 2
        _one_line_error(capsys, fragment)


# ---------------------------------------------------------------- flags of the sub-commands
@pytest.mark.parametrize("argv, pointer", [
    (["--sections", "load,vector"], "specgym bench load"),
    (["--vllm-concurrency", "1,4"], "specgym bench vllm --concurrency"),
    (["vllm", "--vllm-eager"], "specgym bench vllm --eager"),
    (["--live-prompts", "3"], "specgym bench live --prompts"),
    (["--scale-dir", "x"], "specgym bench scale --dir"),
    (["--eval-requests", "5"], "specgym bench eval --requests"),
])
def test_bench_old_spellings_point_to_the_sub_command(argv, pointer, capsys):
    """The one-command ``bench`` flags (``--sections``, ``--vllm-*``, ``--live-*`` ...) are refused in one line
    that names the sub-command replacing them; nothing runs."""
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert pointer in err and len(err.splitlines()) == 1 and "is gone" in err


def test_bench_sections_have_their_own_flags(capsys):
    """Each section's flags belong to its sub-command: ``bench vllm --concurrency``, not ``bench --concurrency``."""
    args = build_parser().parse_args(["bench", "vllm", "--concurrency", "1,2", "--eager", "--json", "v.json"])
    assert (args.section, args.vllm_concurrency, args.vllm_eager, str(args.json)) == ("vllm", "1,2", True, "v.json")
    args = build_parser().parse_args(["bench", "--workload", "assc-regimes", "live", "--prompts", "2"])
    assert (args.section, args.live_prompts, args.workload) == ("live", 2, "assc-regimes")
    assert build_parser().parse_args(["bench"]).section is None  # the default sections in turn
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "load", "--concurrency", "2"])


def test_bench_and_tune_errors_name_the_sub_command(capsys):
    """The report: some errors printed as ``specgym bench:``, others as ``specgym bench live:``."""
    assert main(["bench", "live", "--device", "tpu"]) == 2
    assert capsys.readouterr().err.startswith("specgym bench live: error: --device 'tpu'")
    assert main(["tune", "sweep", "--workload", "assc-regimes", "--profile", "batch-cpu-midpair", "--k-max", "12"]) == 2
    assert capsys.readouterr().err.startswith("specgym tune sweep: error: --k-max 12: batch profile "
                                              "'batch-cpu-midpair' prices K up to 8")


# ------------------------------------------------------------ messages that name the real problem
@pytest.mark.parametrize("argv, says, never", [
    (["eval", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--no-plots"],
     "'batch-a100-7b-roofline' is a batched serving profile", "__editable__"),
    (["train", "--mode", "drafter", "--workload", "midpair-greedy", "--timesteps", "64"],
     "holds one drafter", "verify_ms"),
    (["eval", "--workload", "assc-regimes", "--controllers", "fixed:17@ngram", "--no-plots"],
     "K in 0..8 (e.g. 4@ngram)", "10@ngram"),
    ([*TUNE, "--controllers", "per-seq:fixed:4@ngram"], "'@DRAFTER' picks a drafter", "integer K"),
    (["generate", "--prompt", "hi", "--controller", "drafter-marginal", "--temperature", "0.5"],
     "fits itself on a recording of the pair at temperature 0.5", "integer K"),
    (["tune", "sweep", "--workload", "assc-regimes", "--profile", "h100-llama31-8b", "--capture-sizes", "0,-1"],
     "capture sizes must be 1..4096", "concurrencies"),
    ([*TUNE, "--controllers", "bogus"], "'specgym tune compare --help' lists the valid forms", "goodput"),
    # found inside the work, after the progress bar opened: still one line, no blank line above it
    (["eval", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--no-plots"],
     "is a batched serving profile", "Traceback"),
])
def test_messages_name_the_real_problem(tmp_path, capsys, monkeypatch, argv, says, never):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = _one_line_error(capsys, says)
    assert never not in err, err
    assert len(err) < 300, err
    assert list(tmp_path.iterdir()) == []


def test_batch_size_tables_are_checked():
    for table, words in (([[1, 64, 3], [60, 128, 1]], "overlap"), ([[1, 64, 3], [70, 128, 1]], "gap"),
                         ([[2, 64, 3]], "starts at batch 2"), ([[1, 64, 99]], "K 99 is above 16")):
        with pytest.raises(SpecgymError, match=words):
            BatchSizeTable(table)
    ok = BatchSizeTable([[65, 128, 1], [1, 64, 3]])  # rows in any order
    assert ok.max_batch == 128
    with pytest.raises(SpecgymError, match="above k_max 2"):
        ok.check_k_max(2)
    with pytest.raises(SpecgymError, match="no such file"):
        BatchSizeTable.parse("missing.json")


# --------------------------------------------------- the same checks through the Python API
@pytest.mark.parametrize("env_id,kwargs,fragment", [
    ("specgym/SpecDecode-v1", {"workload": None}, "workload"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "profile": 42}, "profile"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "outcome_seed": "x"}, "outcome_seed"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "k_min": 2.7}, "k_min"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "split": "training"}, "split"),
    ("specgym/SpecDecode-v1", {"domains": 3}, "domains"),
    ("specgym/SpecDecodeToken-v1", {"workload": 1.5}, "workload"),
    ("specgym/SpecDecodeBatch-v0", {"workload": "assc-regimes", "requests": -5}, "requests"),
    ("specgym/SpecDecodeBatch-v0", {"workload": "assc-regimes", "concurrency": "bogus"}, "concurrency"),
])
def test_wrong_env_config_types_are_one_line_errors(env_id, kwargs, fragment):
    with pytest.raises(SpecgymError, match=fragment) as info:
        gym.make(env_id, **kwargs).reset(seed=0)
    assert "\n" not in str(info.value)


def test_domains_may_name_the_shipped_distribution():
    env = gym.make("specgym/SpecDecode-v1", domains="generalist")
    env.reset(seed=0)
    assert env.unwrapped.domains is not None


def test_unknown_reset_options_are_refused():
    env = gym.make("specgym/SpecDecode-v1", workload="assc-regimes")
    with pytest.raises(SpecgymError, match=r"unknown reset option\(s\) \['bogus'\]"):
        env.reset(seed=0, options={"bogus": 1})
    env.reset(seed=0, options={"request": 0})


def test_make_controller_and_engine_bounds():
    with pytest.raises(SpecgymError, match="expected a string"):
        make_controller(None)  # type: ignore[arg-type]
    with pytest.raises(SpecgymError, match="one spec expected, got a comma-separated list"):
        specgym.make_controller("fixed:4,assc")
    engine = specgym.TraceEngine(specgym.load_workload("assc-regimes"))
    with pytest.raises(SpecgymError, match="out of range"):
        engine.start(99999)
    with pytest.raises(SpecgymError, match="out of range"):
        engine.start(-1)


class _Returns(Controller):
    """A controller proposing a fixed (possibly invalid) value."""

    def __init__(self, value):
        self.value, self.name = value, f"returns-{value!r}"

    def reset(self, ctx):
        pass

    def propose(self):
        return self.value

    def observe(self, outcome):
        pass


@pytest.mark.parametrize("value", [None, float("nan"), 2.5, "3", True])
def test_a_controller_proposing_a_non_integer_is_named(value):
    engine = specgym.TraceEngine(specgym.load_workload("assc-regimes"))
    with pytest.raises(SpecgymError, match="must be a whole number"):
        drive(_Returns(value), engine.start(0))


def test_a_numpy_integer_k_is_fine():
    import numpy as np

    engine = specgym.TraceEngine(specgym.load_workload("assc-regimes"))
    assert drive(_Returns(np.int64(3)), engine.start(0)).tokens > 0
