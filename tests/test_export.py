"""Exported policies: SB3 parity, numpy-only loading, refusal of bad artifacts, eval integration."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from specgym.agents.artifact import load_policy, random_artifact, write_artifact
from specgym.agents.policy_controller import PolicyController
from specgym.cli import main  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.export import export_run  # noqa: E402
from specgym.training.ppo import TrainRequest, train  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = {"n_envs": 2, "n_steps": 256, "batch_size": 128, "n_epochs": 2, "eval_freq": 0}


@pytest.fixture(scope="module", params=["k", "token"])
def exported(request, tmp_path_factory):
    """A tiny trained run of each mode and its exported artifact."""
    tmp = tmp_path_factory.mktemp(f"run-{request.param}")
    train(TrainRequest(workload="assc-regimes", mode=request.param, out=tmp / "run", timesteps=3072,
                       overrides=dict(TINY), quiet=True))
    return tmp / "run", export_run(tmp / "run", tmp / "policy", force=True)  # a tiny run: maybe below


def _model_and_vec(run: Path):
    from stable_baselines3 import PPO

    with open(run / "vecnormalize.pkl", "rb") as f:
        vec = pickle.load(f)
    return PPO.load(run / "model.zip", device="cpu"), vec


def test_artifact_is_pickle_free_and_self_describing(exported):
    _, art_dir = exported
    assert sorted(p.name for p in art_dir.iterdir()) == [".specgym", "policy.json", "policy.npz"]  # + the marker
    with np.load(art_dir / "policy.npz", allow_pickle=False) as z:
        assert "layer0_weight" in z.files and "obs_mean" in z.files
    meta = json.loads((art_dir / "policy.json").read_text())
    for key in ("mode", "feature_version", "features", "k_min", "k_max", "action_mapping", "obs_normalization",
                "training", "weights_sha256", "function_sha256"):
        assert key in meta, key
    assert meta["training"]["workload"] == "assc-regimes"


def test_parity_with_sb3_predict_on_recorded_observations(exported):
    """The numpy controller picks model.predict(deterministic=True)'s action on thousands of env observations."""
    import gymnasium as gym

    import specgym  # noqa: F401

    run, art_dir = exported
    model, vec = _model_and_vec(run)
    art = load_policy(art_dir)
    ctrl = PolicyController(art)
    env_id = "specgym/SpecDecode-v1" if art.mode == "k" else "specgym/SpecDecodeToken-v1"
    env = gym.make(env_id, workload="assc-regimes", split="val")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    recorded, sb3 = [], []
    for _ in range(4000):
        a, _ = model.predict(vec.normalize_obs(obs[None]), deterministic=True)
        recorded.append(obs)
        sb3.append(int(a[0]))
        # act with the policy most of the time, randomly sometimes (more diverse observations)
        act = int(a[0]) if rng.random() < 0.8 else int(rng.integers(art.n_actions))
        obs, _, done, _, _ = env.step(act + (art.k_min if art.mode == "k" else 0))
        if done:
            obs, _ = env.reset()
    recorded = np.array(recorded)
    logits = ctrl.logits(recorded)
    mine = logits.argmax(axis=1)
    single = np.array([ctrl.act(o) for o in recorded[:500]])
    assert (single == mine[:500]).all()
    top2 = np.sort(logits, axis=1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > 1e-5  # float32 near-ties may round either way
    assert decisive.mean() > 0.99
    assert (mine[decisive] == np.array(sb3)[decisive]).all()
    assert (mine == np.array(sb3)).mean() > 0.999


def test_controller_replays_exactly_like_the_env(exported):
    """End to end: serving requests with the Controller plays the same rounds as stepping the env with SB3.

    K mode: identical request times. Token mode: identical rounds except in the last k_max tokens of a request,
    where the env records a stop at j = 0 with the engine's clipped cap (information a deployed controller does
    not have; see ``PolicyController.observe``), so decisions there may differ.
    """
    import gymnasium as gym

    import specgym  # noqa: F401
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.workloads.trace_format import cached_workload
    from specgym.eval.runner import run_controller

    run, art_dir = exported
    model, vec = _model_and_vec(run)
    art = load_policy(art_dir)
    # export recorded the range the run trained on and a teacher; the network itself is compared here, so the guard
    # (which hands val requests outside a short run's range to the teacher: tests/test_policy_guard.py) is lifted
    assert art.teacher == "marginal" and art.obs_low is not None and (art.obs_low <= art.obs_high).all()
    ctrl = PolicyController(dataclasses.replace(art, obs_low=None, obs_high=None, teacher=None))
    wl = cached_workload("assc-regimes")
    reqs = wl.split_indices("val")[:40]
    res = run_controller(TraceEngine(wl, k_max=8, seed=0), reqs, ctrl, trace=reqs)
    env_id = "specgym/SpecDecode-v1" if ctrl.mode == "k" else "specgym/SpecDecodeToken-v1"
    env = gym.make(env_id, workload="assc-regimes", split="val", outcome_seed=0)
    for r, t_ctrl in zip(reqs.tolist(), res.time_ms):
        obs, _ = env.reset(options={"request": r})
        done, info, rounds = False, {}, []
        while not done:
            a, _ = model.predict(vec.normalize_obs(obs[None]), deterministic=True)
            pos = env.unwrapped.req.position
            obs, _, done, _, info = env.step(int(a[0]) + (ctrl.k_min if ctrl.mode == "k" else 0))
            if "drafted" in info:
                rounds.append((pos, info["drafted"], info["accepted"]))
        if ctrl.mode == "k":
            assert info["episode_time_ms"] == pytest.approx(t_ctrl, rel=1e-9)
        tail = info["length"] - ctrl.k_max - 1
        mine = [(p, d, a) for p, _, d, a in res.traces[r] if p < tail]
        assert mine == [x for x in rounds if x[0] < tail]


def test_loads_and_runs_without_torch_or_sb3(exported):
    _, art_dir = exported
    code = f"""
import sys
for name in ("torch", "stable_baselines3", "tensorboard"):
    sys.modules[name] = None  # any import of these now fails
import specgym.agents
from specgym import make_controller
from specgym.eval.harness import EvalConfig, evaluate
ctrl = make_controller("ppo:{art_dir}", 8)
rep = evaluate(EvalConfig(workload="assc-regimes", controllers="fixed:4,ppo:{art_dir}", max_requests=3))
assert any(r["spec"].startswith("ppo:") for r in rep["rows"])
assert not any(m in sys.modules and sys.modules[m] is not None for m in ("torch", "stable_baselines3"))
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_tampered_or_mismatched_artifacts_are_refused(exported, tmp_path):
    _, art_dir = exported
    art = load_policy(art_dir)
    # tampered weights
    bad = _copy(art_dir, tmp_path / "tampered")
    data = bytearray((bad / "policy.npz").read_bytes())
    data[-100] ^= 0xFF
    (bad / "policy.npz").write_bytes(bytes(data))
    with pytest.raises(SpecgymError, match="checksum"):
        load_policy(bad)
    # feature version from another specgym
    bad = _copy(art_dir, tmp_path / "version")
    meta = json.loads((bad / "policy.json").read_text())
    meta["feature_version"] += 1
    (bad / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError, match="feature version"):
        load_policy(bad)
    # a different feature list
    bad = _copy(art_dir, tmp_path / "features")
    meta = json.loads((bad / "policy.json").read_text())
    meta["features"] = meta["features"][::-1]
    (bad / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError, match="feature list"):
        load_policy(bad)
    # the other mode
    other = "token" if art.mode == "k" else "k"
    with pytest.raises(SpecgymError, match="mode"):
        load_policy(art_dir, expect_mode=other)
    bad = _copy(art_dir, tmp_path / "mode")
    meta = json.loads((bad / "policy.json").read_text())
    meta["mode"] = other
    (bad / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError):
        load_policy(bad)
    # not an artifact at all / wrong k_max for the evaluation
    with pytest.raises(SpecgymError, match="not an exported policy"):
        load_policy(tmp_path)
    from specgym import make_controller

    with pytest.raises(SpecgymError, match="k_max"):  # one rule: an engine cap below the policy's own
        make_controller(f"ppo:{art_dir}", 4)
    assert make_controller(f"ppo:{art_dir}", 12).name == f"ppo:{art_dir}"  # a larger cap is fine


@pytest.mark.parametrize("edit", [
    lambda m: m["network"].update(activation="relu" if m["network"]["activation"] == "tanh" else "tanh"),
    lambda m: m["obs_normalization"].update(clip_obs=m["obs_normalization"]["clip_obs"] / 2),
    lambda m: m["obs_normalization"].update(enabled=False),
    lambda m: m["action_mapping"].update(note="edited"),
    lambda m: m.pop("function_sha256"),
])
def test_the_checksum_covers_every_field_of_the_function(exported, tmp_path, edit):
    """Editing policy.json (activation tanh -> relu, the normalisation, the action mapping...) is refused like a
    modified weights file; the informational fields (training record, metrics) are not part of the function."""
    _, art_dir = exported
    bad = _copy(art_dir, tmp_path / "edited")
    meta = json.loads((bad / "policy.json").read_text())
    edit(meta)
    (bad / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError, match="function_sha256"):
        load_policy(bad)
    ok = _copy(art_dir, tmp_path / "notes")
    meta = json.loads((ok / "policy.json").read_text())
    meta["metrics"] = {"note": "annotated by hand"}
    (ok / "policy.json").write_text(json.dumps(meta))
    load_policy(ok)


def test_shipped_policies_carry_the_function_checksum():
    import specgym.catalogue as catalogue
    from specgym.agents.artifact import list_policies

    for name in list_policies():
        load_policy(catalogue.resolve("policy", name))


def test_eval_cli_puts_the_policy_in_the_table(exported, tmp_path, capsys):
    _, art_dir = exported
    out = tmp_path / "ev"
    rc = main(["eval", "--workload", "assc-regimes", "--controllers", f"fixed:4,speclane,ppo:{art_dir}",
               "--max-requests", "5", "--out", str(out), "--no-plots"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert any(r["spec"] == f"ppo:{art_dir}" for r in report["rows"])
    assert f"ppo:{art_dir}" in capsys.readouterr().out  # the table names the policy as the user typed it


def test_export_refuses_overwrite_and_non_runs(exported, tmp_path):
    run, art_dir = exported
    with pytest.raises(SpecgymError, match="already exists"):
        export_run(run, art_dir)
    with pytest.raises(SpecgymError, match="not a training run"):
        export_run(tmp_path, tmp_path / "p")


def test_random_artifact_roundtrip_and_bench(tmp_path):
    from types import SimpleNamespace

    from rich.console import Console

    from specgym.eval.bench.policy import policy_section

    art = random_artifact("token")
    write_artifact(art, tmp_path / "p")
    back = load_policy(tmp_path / "p")
    obs = np.random.default_rng(0).random((50, len(art.features)))
    assert np.array_equal(PolicyController(art).logits(obs), PolicyController(back).logits(obs))
    figures = policy_section(SimpleNamespace(policy=None), "assc-regimes", Console(quiet=True))
    assert figures["policy_us/k"] > 0 and figures["policy_us/token_token_check"] > 0


@pytest.mark.slow
def test_modest_budget_beats_fixed_k4_on_assc_regimes_test_split(tmp_path):
    """A K-mode policy trained briefly on assc-regimes beats fixed K=4 on the (unseen) test split."""
    from specgym.eval.harness import EvalConfig, evaluate

    train(TrainRequest(workload="assc-regimes", mode="k", out=tmp_path / "run", timesteps=120_000,
                       overrides={"eval_freq": 20_000}, quiet=True))
    art_dir = export_run(tmp_path / "run", tmp_path / "policy", force=True)  # vs fixed:4, whatever the verdict
    rep = evaluate(EvalConfig(workload="assc-regimes", controllers=f"fixed:4,ppo:{art_dir}", split="test"))
    rows = {r["spec"]: r for r in rep["rows"]}
    assert rows[f"ppo:{art_dir}"]["throughput_tok_s"] > rows["fixed:4"]["throughput_tok_s"] * 1.02
