"""Exports carry the guard (new-user run 6): a policy its validation found below the best fixed K or its teacher is
not exported without ``--force`` (and then with the warning in the export), the SGLang module hands a step outside
the policy's training range to its teacher (the goodput rule) as specgym does, and the module's sizes are bounded
before anything is built."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")

from specgym.agents.artifact import load_policy, random_artifact  # noqa: E402
from specgym.agents.batch_policy import BatchPolicyController  # noqa: E402
from specgym.agents.sglang_export import SGLANG_MAX_BATCH, module_source  # noqa: E402
from specgym.agents.sglang_policy import SpecgymSGLangPolicy  # noqa: E402
from specgym.cli import main  # noqa: E402
from specgym.envs.profiles import load_batch_profile  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402

PROFILE = "batch-cpu-midpair"
#: What the report's run printed: "WARNING: the policy is BELOW the best static K ... 0.818x", "BELOW goodput: 0.793x"
BELOW = {"speedup_vs_best_fixed": 0.818, "speedup_vs_goodput": 0.793}


def _set_figures(run: Path, figures: dict[str, float]) -> None:
    """Give the run's summary these validation figures (for both of its models)."""
    summary = json.loads((run / "summary.json").read_text())
    for which in summary["val_all"]:
        summary["val_all"][which].update(figures)
    summary["val"].update(figures)
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory) -> Path:
    """A 1,024-step batch-mode run (the report's 4,096-step one, smaller), its summary saying BELOW."""
    run = tmp_path_factory.mktemp("guard") / "b1"
    assert main(["train", "--mode", "batch", "--workload", "speclane-mix", "--timesteps", "1024", "--out", str(run),
                 "--hyperparams", "n_envs=2", "n_steps=256", "batch_size=128", "eval_freq=1024",
                 "max_batch=32"]) == 0
    _set_figures(run, BELOW)
    return run


def test_a_policy_below_its_reference_is_exported_only_with_force(batch_run, tmp_path, capsys):
    capsys.readouterr()
    for argv in (["--out", str(tmp_path / "pol")],
                 ["--to", "sglang", "--profile", PROFILE, "--out", str(tmp_path / "pol.py")]):
        assert main(["export", str(batch_run), *argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        assert "BELOW the best static K (0.818x) and its teacher goodput (0.793x)" in err and "--force" in err
    assert not list(tmp_path.iterdir())  # nothing written

    assert main(["export", str(batch_run), "--out", str(tmp_path / "pol"), "--force"]) == 0
    assert "warning:" in capsys.readouterr().err
    meta = json.loads((tmp_path / "pol" / "policy.json").read_text())
    assert "do not deploy" in meta["warning"] and meta["metrics"]["speedup_vs_best_fixed"] == 0.818
    assert meta["guard"]["teacher"] == "goodput"  # a batch policy now carries its training range and teacher

    # the exported folder keeps its verdict: exporting it on to SGLang is refused as well, then forced
    mod = tmp_path / "pol_sglang.py"
    assert main(["export", str(tmp_path / "pol"), "--to", "sglang", "--profile", PROFILE, "--out", str(mod)]) == 2
    assert "BELOW" in capsys.readouterr().err and not mod.exists()
    assert main(["export", str(tmp_path / "pol"), "--to", "sglang", "--profile", PROFILE, "--out", str(mod),
                 "--force"]) == 0
    assert "warning:" in capsys.readouterr().err
    assert "WARNING:" in mod.read_text().split('"""')[1]  # in the module's docstring


def test_a_policy_at_or_above_its_reference_exports_without_a_word(batch_run, tmp_path, capsys):
    run = tmp_path / "good"
    subprocess.run(["cp", "-r", str(batch_run), str(run)], check=True)
    _set_figures(run, {"speedup_vs_best_fixed": 1.05, "speedup_vs_goodput": 1.0})
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "pol")]) == 0
    assert main(["export", str(run), "--to", "sglang", "--profile", PROFILE, "--out", str(tmp_path / "p.py")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert "warning" not in json.loads((tmp_path / "pol" / "policy.json").read_text())


_DRIVER = """
import json, sys, importlib.util
sys.modules["specgym"] = None  # the module must not need specgym
spec = importlib.util.spec_from_file_location("exported", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["exported"] = mod
spec.loader.exec_module(mod)
out = {}
for name, share in (("collapse", 0.0), ("all", 1.0)):
    policy = mod.make_policy(initial_steps=3)
    steps = []
    for _ in range(40):
        k = policy.get_steps_for_batch(8)
        steps.append(k)
        policy.on_verify_complete([int(share * k)] * 8, 8)
    out[name] = {"steps": steps, "handed": policy.controller.guard.stats()["handed"]}
print(json.dumps(out))
"""


def _drive_in_specgym(ctrl, share: float) -> list[int]:
    policy = SpecgymSGLangPolicy(ctrl, k_max=8, profile=PROFILE)
    steps = []
    for _ in range(40):
        k = policy.get_steps_for_batch(8)
        steps.append(k)
        policy.on_verify_complete([int(share * k)] * 8, 8)
    return steps


def test_the_sglang_module_hands_steps_outside_its_range_to_its_teacher(batch_run, tmp_path):
    """The report: driven through SGLang's Protocol, the policy drafted 7 steps when acceptance collapsed to 0. Now
    such steps leave its training range, and the goodput rule (its teacher) decides, in specgym and in the module
    alike."""
    pol, mod = tmp_path / "pol", tmp_path / "guarded.py"
    assert main(["export", str(batch_run), "--out", str(pol), "--force"]) == 0
    assert main(["export", str(pol), "--to", "sglang", "--profile", PROFILE, "--out", str(mod), "--force"]) == 0
    run = subprocess.run([sys.executable, "-c", _DRIVER, str(mod)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert "outside its training range" in run.stderr and "goodput" in run.stderr
    art = load_policy(pol)
    for name, share in (("collapse", 0.0), ("all", 1.0)):
        assert got[name]["steps"] == _drive_in_specgym(BatchPolicyController(art), share)  # identical to specgym
        assert got[name]["handed"] > 0
        assert got[name]["steps"][-10:] == _drive_in_specgym("goodput", share)[-10:]  # the teacher's decisions
    assert got["collapse"]["steps"][-1] == 0 and got["all"]["steps"][-1] == 8  # no drafts when nothing is accepted


def test_max_batch_is_bounded_before_anything_is_built(batch_run, tmp_path, capsys):
    """The report: ``--max-batch 100000000`` ran 600 s and reached 9.6 GB. Now one line, at once."""
    t0 = time.perf_counter()
    assert main(["export", str(batch_run), "--to", "sglang", "--profile", PROFILE, "--max-batch", "100000000",
                 "--out", str(tmp_path / "s16.py"), "--force"]) == 2
    err = capsys.readouterr().err
    assert "--max-batch" in err and str(SGLANG_MAX_BATCH) in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SpecgymError, match=f"--max-batch must be in 1..{SGLANG_MAX_BATCH}"):
        module_source(random_artifact("batch", k_max=8), load_batch_profile(PROFILE), "p", max_batch=100_000_000)
    assert time.perf_counter() - t0 < 5 and not list(tmp_path.iterdir())


def test_candidate_steps_that_allow_only_no_speculation_are_refused(batch_run, tmp_path, capsys):
    assert main(["export", str(batch_run), "--to", "sglang", "--profile", PROFILE, "--candidate-steps", "0,0",
                 "--out", str(tmp_path / "p.py"), "--force"]) == 2
    assert "--candidate-steps 0,0" in capsys.readouterr().err
    with pytest.raises(SpecgymError, match="at least one step"):
        module_source(random_artifact("batch", k_max=8), load_batch_profile(PROFILE), "p", candidate_steps=[0])
    assert not list(tmp_path.iterdir())


def test_a_shipped_policy_named_for_export_is_named_as_such(tmp_path, capsys, monkeypatch):
    """The report: ``export midpair-token --to sglang`` said "not a training run"."""
    monkeypatch.chdir(tmp_path)
    assert main(["export", "midpair-token", "--to", "sglang", "--profile", PROFILE]) == 2
    err = capsys.readouterr().err
    assert "midpair-token: a shipped policy of mode token: SGLang chooses one step count per batch" in err
    assert "export a batch-mode policy (a run of `specgym train --mode batch`" in err
    assert main(["export", "midpair-token"]) == 2
    err = capsys.readouterr().err
    assert "a shipped policy of mode token" in err and "ppo:midpair-token" in err
    assert not list(tmp_path.iterdir())
