"""PPO on the tree env: a tiny training run, the tree-mode export (SB3 parity, checks), tree-ppo in eval."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from specgym.agents.artifact import load_policy
from specgym.agents.policy_controller import PolicyController  # noqa: E402
from specgym.agents.tree_policy import TreePolicyController  # noqa: E402
from specgym.envs.gym.tree_env import DEFAULT_SHAPES  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.export import export_run  # noqa: E402
from specgym.training.ppo import TrainRequest, train  # noqa: E402

TINY = {"n_envs": 2, "n_steps": 256, "batch_size": 128, "n_epochs": 2, "eval_freq": 1024, "eval_max_requests": 8}


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tree-run")
    summary = train(TrainRequest(workload="midpair-greedy", mode="tree", out=tmp / "run", timesteps=2048,
                                 overrides=dict(TINY), quiet=True))
    return tmp / "run", export_run(tmp / "run", tmp / "policy", force=True), summary  # tiny: maybe below


def test_training_smoke_logs_validates_and_checkpoints(tree_run):
    run, _, summary = tree_run
    cfg = (run / "config.yaml").read_text()
    assert "mode: tree" in cfg and "profile: gpu-like-published" in cfg
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and state["timesteps_done"] == 2048
    assert (run / "model.zip").is_file() and (run / "resume.pkl").is_file()
    assert "speedup_vs_sequoia" in json.dumps(summary)
    events = list((run / "tb").rglob("events.out.tfevents.*"))
    assert events, "tensorboard scalars"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for ev in events:
        acc = EventAccumulator(str(ev))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert any(t.startswith("specdec/") for t in tags) and "eval/speedup_vs_best_fixed" in tags


def test_export_matches_sb3_predict(tree_run):
    import gymnasium as gym
    from stable_baselines3 import PPO

    import specgym  # noqa: F401

    run, art_dir, _ = tree_run
    art = load_policy(art_dir, expect_mode="tree")
    assert art.shapes == [list(s) for s in DEFAULT_SHAPES]
    model = PPO.load(run / "model.zip", device="cpu")
    with open(run / "vecnormalize.pkl", "rb") as f:
        vec = pickle.load(f)
    ctrl = TreePolicyController(load_policy(art_dir))
    # the final model is exported with --which final; best may differ: compare against the exported one's source
    final = export_run(run, run / "policy-final", which="final", force=True)
    ctrl = TreePolicyController(load_policy(final))
    env = gym.make("specgym/SpecDecodeTree-v0", workload="midpair-greedy", split="val", profile="gpu-like-published")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    recorded, sb3 = [], []
    for _ in range(1500):
        a, _ = model.predict(vec.normalize_obs(obs[None]), deterministic=True)
        recorded.append(obs)
        sb3.append(int(a[0]))
        act = int(a[0]) if rng.random() < 0.8 else int(rng.integers(len(DEFAULT_SHAPES)))
        obs, _, done, _, _ = env.step(act)
        if done:
            obs, _ = env.reset()
    logits = ctrl.network.logits(np.array(recorded))
    top2 = np.sort(logits, axis=1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > 1e-5
    assert decisive.mean() > 0.99
    assert (logits.argmax(axis=1)[decisive] == np.array(sb3)[decisive]).all()


def test_controller_replays_like_the_env(tree_run):
    """Serving requests through the tree runner plays the env's rounds (same observation code, same trees)."""
    import gymnasium as gym

    import specgym  # noqa: F401
    from specgym.envs.engines.replay.tree_engine import TreeEngine
    from specgym.envs.profiles import load_profile
    from specgym.envs.workloads.trace_format import cached_workload
    from specgym.eval.tree_runner import run_tree_controller

    _, art_dir, _ = tree_run
    ctrl = TreePolicyController(load_policy(art_dir))
    wl = cached_workload("midpair-greedy")
    eng = TreeEngine(wl, load_profile("gpu-like-published"))
    reqs = wl.split_indices("val")[:5]
    res = run_tree_controller(eng, reqs, ctrl)
    env = gym.make("specgym/SpecDecodeTree-v0", workload="midpair-greedy", split="val", profile="gpu-like-published")
    for m, r in enumerate(reqs.tolist()):
        obs, _ = env.reset(options={"request": r})
        total, done = 0.0, False
        while not done:
            obs, _, done, _, info = env.step(ctrl.network.act(obs))
            total += info["time_ms"]
        assert total == pytest.approx(res.time_ms[m])


def test_tree_artifacts_are_checked(tree_run, tmp_path):
    _, art_dir, _ = tree_run
    with pytest.raises(SpecgymError, match="tree-ppo"):
        PolicyController(load_policy(art_dir))
    with pytest.raises(SpecgymError, match="expected 'k'"):
        load_policy(art_dir, expect_mode="k")
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("policy.npz", "policy.json"):
        (bad / f).write_bytes((Path(art_dir) / f).read_bytes())
    meta = json.loads((bad / "policy.json").read_text())
    meta["action_mapping"]["values"][3] = [2, 2]  # a different menu: the function checksum refuses it
    (bad / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError, match="function_sha256"):
        load_policy(bad)


def test_eval_includes_the_tree_ppo_row(tree_run):
    from specgym.eval.harness import EvalConfig, evaluate

    _, art_dir, _ = tree_run
    rep = evaluate(EvalConfig(workload="midpair-greedy", controllers=f"fixed:4,tree-sequoia,tree-ppo:{art_dir}",
                              profile="gpu-like-published", bootstrap=100, max_requests=20))
    rows = {r["spec"]: r for r in rep["rows"]}
    row = rows[f"tree-ppo:{art_dir}"]
    assert row["tree"] and row["controller"].startswith("tree-ppo")
    assert "speedup_vs_best_static_tree" in row["ci95"]
