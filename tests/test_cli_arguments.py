"""CLI arguments: numeric options and spec parameters checked before any work, one-line errors, readable output
when piped, help for every spec and option, eval labels as typed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specgym.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def _one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and not err.startswith("\n"), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


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
])
def test_numeric_options_are_checked(argv, fragment, capsys, tmp_path, monkeypatch):
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


def test_train_refuses_zero_timesteps_without_writing_a_run(tmp_path, capsys):
    assert main(["train", "--workload", "assc-regimes", "--timesteps", "0", "--out", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()


def test_record_checks_arguments_before_loading_models(tmp_path, capsys, monkeypatch):
    import specgym.envs.engines.model_loading as le

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


def test_workloads_list_labels_synthetic_and_keeps_descriptions(capsys):
    import specgym.catalogue as catalogue
    from specgym.envs.profiles import load_profile

    assert main(["workloads", "list"]) == 0
    out = capsys.readouterr().out
    assert "assc-regimes" in out and "SYNTHETIC" in out.split("assc-regimes", 1)[1].splitlines()[0]
    for name in catalogue.names("profile"):
        desc = load_profile(name).description
        assert desc in out  # whole, never cut mid-word


def test_tables_stay_on_one_line_when_piped():
    r = subprocess.run([sys.executable, "-m", "specgym", "bench", "vector", "--workload",
                        "assc-regimes"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    row = [ln for ln in r.stdout.splitlines() if "rounds/s" in ln]
    assert row and "MISSED" in row[0] or "met" in row[0]  # figure, measured and target on the same line


def test_help_lists_every_spec_and_every_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    eval_help = sub.choices["eval"].format_help()
    assert "speclane[:ratio]" in eval_help and "ppo:NAME|DIR" in eval_help
    missing = []
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help" and not action.help:
                missing.append(f"{name} {action.option_strings[0]}")
    assert not missing, missing
    assert "--k-max" in sub.choices["train"].format_help()


def test_gitignore_covers_the_tour_outputs():
    ignored = (ROOT / ".gitignore").read_text().split()
    for path in ("/runs/", "/out/", "/policies/", "/my.parquet", "/my-profile.json"):
        assert path in ignored or path.strip("/") + "/" in ignored or path.lstrip("/") in ignored, path


def test_eval_label_is_the_spec_the_user_typed(tmp_path, capsys):
    from specgym.agents.artifact import random_artifact, write_artifact

    write_artifact(random_artifact("k"), tmp_path / "pol")
    out = tmp_path / "ev"
    assert main(["eval", "--workload", "assc-regimes", "--controllers", f"fixed:2,ppo:{tmp_path / 'pol'}",
                 "--max-requests", "5", "--no-plots", "--out", str(out)]) == 0
    rows = json.loads((out / "report.json").read_text())["rows"]
    assert {r["controller"] for r in rows} == {"fixed:2", f"ppo:{tmp_path / 'pol'}"}
