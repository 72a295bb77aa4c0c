"""The learned allocator (mode ``alloc``): its env, its teacher, training, the numpy-only export and its spec row."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import specgym  # noqa: F401  (registers the envs)
from specgym.agents.alloc_policy import ALLOC_FEATURE_NAMES, ALLOC_GAMMAS, TEACHER_ACTION, AllocPolicyController
from specgym.agents.artifact import load_policy
from specgym.agents.modes import get_mode
from specgym.agents.policy_controller import PolicyNetwork
from specgym.agents.specs import lookup, make
from specgym.baselines.budget_allocator import BudgetAllocator
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError

PROFILE = "batch-a100-7b-roofline"


def _env(workload, **kw):
    return gym.make("specgym/SpecDecodeAlloc-v0", workload=workload, batch_profile=PROFILE, k_max=8,
                    **kw).unwrapped


def test_env_is_registered_and_check_env_clean(mix_workload):
    env = gym.make("specgym/SpecDecodeAlloc-v0", workload=mix_workload, batch_profile=PROFILE, k_max=8)
    check_env(env.unwrapped, skip_render_check=True)
    assert env.unwrapped.action_space.n == len(ALLOC_GAMMAS)
    assert env.unwrapped.observation_space.shape == (len(ALLOC_FEATURE_NAMES),)


def test_env_samples_the_concurrency_per_episode(mix_workload):
    env = _env(mix_workload, max_batch=64)
    seen = {env.reset(seed=s)[1]["concurrency"] for s in range(40)}
    assert seen <= {1, 2, 4, 8, 16, 32, 64} and len(seen) >= 5
    with pytest.raises(SpecgymError, match="concurrency"):
        _env(mix_workload, concurrency="mixed")


def test_teacher_action_is_the_budget_rule_exactly(mix_workload):
    """gamma = 1 every step plays budget:logistic step for step (same time, same tokens); another gamma differs."""
    profile = load_batch_profile(PROFILE)
    for c in (1, 8):
        env = _env(mix_workload, concurrency=c, outcome_seed=3)
        env.reset(seed=1)
        done = False
        while not done:
            *_, done, _, info = env.step(TEACHER_ACTION)
        assert env.replay is not None
        sim = BatchReplay(mix_workload, profile, c, requests=env.replay.requests, k_max=8, seed=3)
        sim.run(BudgetAllocator())
        assert (sim.tokens, sim.steps) == (env.replay.tokens, env.replay.steps)
        assert sim.now_ms == pytest.approx(env.replay.now_ms, rel=1e-12)
        assert info["throughput_tok_s"] == pytest.approx(sim.throughput(), rel=1e-12)
    env = _env(mix_workload, concurrency=8, outcome_seed=3)
    env.reset(seed=1)
    verified = {a: env.core.decide(a).verify.sum() for a in (0, TEACHER_ACTION, len(ALLOC_GAMMAS) - 1)}
    assert verified[0] >= verified[TEACHER_ACTION] >= verified[len(ALLOC_GAMMAS) - 1]  # gamma > 1: smaller budget


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ``specgym train --mode alloc`` run (BC from the budget rule, then PPO) and its exported final model."""
    from specgym.cli import main

    root = tmp_path_factory.mktemp("alloc")
    run = root / "run"
    assert main(["train", "--mode", "alloc", "--workload", "speclane-mix", "--timesteps", "1024", "--out", str(run),
                 "--hyperparams", "n_envs=2", "n_steps=256", "batch_size=128", "eval_freq=1024", "max_batch=16",
                 f"batch_profile={PROFILE}", "bc_passes=2", "bc_warmup=512", "eval_max_requests=16"]) == 0
    assert main(["export", str(run), "--which", "final", "--out", str(root / "pol"), "--force"]) == 0  # tiny run
    return run, root / "pol"


@pytest.mark.slow
def test_tiny_training_run_writes_an_alloc_policy(trained):
    run, pol = trained
    state = json.loads((run / "state.json").read_text())
    assert state["timesteps_done"] == 1024 and state["bc_init"]["spec"] == "budget:logistic"
    assert state["bc_init"]["accuracy"] > 0.95  # the teacher's label is gamma = 1 throughout
    assert "speedup_vs_budget" in state["val_history"][0]
    meta = json.loads((pol / "policy.json").read_text())
    assert meta["mode"] == "alloc" and meta["features"] == list(ALLOC_FEATURE_NAMES)
    assert meta["action_mapping"] == {"type": "budget_gamma", "values": list(ALLOC_GAMMAS)}


@pytest.mark.slow
def test_export_round_trip_matches_the_torch_policy(trained, mix_workload):
    """The numpy network picks model.predict(deterministic=True)'s action on env observations."""
    import pickle

    from stable_baselines3 import PPO

    run, pol = trained
    model = PPO.load(run / "model.zip", device="cpu")
    with open(run / "vecnormalize.pkl", "rb") as f:
        vec = pickle.load(f)
    art = load_policy(pol)  # written to disk and read back (numpy arrays only)
    assert art.mode == "alloc"
    net = PolicyNetwork(art)
    env = _env(mix_workload, max_batch=16)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    recorded, sb3 = [], []
    for _ in range(1500):
        a, _ = model.predict(vec.normalize_obs(obs[None]), deterministic=True)
        recorded.append(obs)
        sb3.append(int(a[0]))
        obs, _, done, _, _ = env.step(int(a[0]) if rng.random() < 0.7 else int(rng.integers(len(ALLOC_GAMMAS))))
        if done:
            obs, _ = env.reset()
    logits = net.logits(np.array(recorded))
    top2 = np.sort(logits, axis=1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > 1e-5
    assert decisive.mean() > 0.99
    assert (logits.argmax(1)[decisive] == np.array(sb3)[decisive]).all()


@pytest.mark.slow
def test_exported_policy_runs_numpy_only(trained, mix_workload):
    """Serving with the exported allocator loads no torch."""
    _, pol = trained
    code = ("import sys, numpy as np; from specgym.agents.specs import make; "
            "from specgym.envs.profiles import load_batch_profile; "
            "from specgym.envs.engines.replay.batch_engine import BatchReplay; "
            "from specgym.envs.workloads.synthetic import generate_workload; "
            f"c = make('alloc-ppo:{pol}', 8, ('batch',)); "
            "wl = generate_workload('speclane-mix', 60, seed=1); "
            f"s = BatchReplay(wl, load_batch_profile('{PROFILE}'), 8, requests=np.arange(30), seed=0); s.run(c); "
            "assert s.done and s.throughput() > 0; assert 'torch' not in sys.modules, 'torch loaded'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.slow
def test_spec_row_resolves_and_runs_in_the_sweep(trained, tmp_path):
    from specgym.cli import main

    _, pol = trained
    ctrl = make(f"alloc-ppo:{pol}", 8, ("batch",))
    assert isinstance(ctrl, AllocPolicyController) and ctrl.name == f"alloc-ppo:{pol}"
    assert lookup(str(pol), ("batch",))[0] == f"alloc-ppo:{pol}"  # a bare folder: its mode's prefix
    with pytest.raises(SpecgymError, match="alloc-ppo"):
        make(f"ppo:{pol}", 8, ("batch",))
    assert get_mode("alloc").spec_prefix == "alloc-ppo"
    out = tmp_path / "sweep.json"
    assert main(["tune", "sweep", "--workload", "speclane-mix", "--profile", PROFILE, "--concurrency", "1,8",
                 "--controllers", f"budget:logistic,alloc-ppo:{pol}", "--replications", "2", "--k-max", "8",
                 "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["controller"] == f"alloc-ppo:{pol}"]
    assert [r["concurrency"] for r in rows] == [1, 8] and all(r["tok_s"] > 0 for r in rows)


def test_predictor_fed_allocator_teacher_is_budget_predictor_exactly():
    """With an acceptance predictor the survivals are budget:predictor:NAME's (the engine's draft view): gamma = 1
    plays that rule step for step, and a policy embedding the predictor validates and serves with its signal."""
    import dataclasses

    from specgym.agents.artifact import random_artifact
    from specgym.baselines.acceptance_estimators import make_estimator
    from specgym.catalogue import resolve
    from specgym.envs.core.acceptance_predictor import load_predictor, workload_predictions
    from specgym.envs.workloads.trace_format import cached_workload

    wl = cached_workload("midpair-greedy")
    profile = load_batch_profile("batch-cpu-midpair")
    env = gym.make("specgym/SpecDecodeAlloc-v0", workload=wl, batch_profile=profile, k_max=8, concurrency=4,
                   outcome_seed=2, requests=12, predictor="midpair").unwrapped
    env.reset(seed=0)
    done = False
    while not done:
        *_, done, _, info = env.step(TEACHER_ACTION)
    signal = workload_predictions(load_predictor(resolve("predictor", "midpair")), wl)
    sim = BatchReplay(wl, profile, 4, requests=env.replay.requests, k_max=8, seed=2, draft_signal=signal)
    sim.run(BudgetAllocator(make_estimator("predictor:midpair")))
    assert sim.now_ms == pytest.approx(env.replay.now_ms, rel=1e-12) and sim.tokens == env.replay.tokens
    art = dataclasses.replace(random_artifact("alloc", k_max=8), predictor=env.predictor.to_dict())
    art.validate()  # an alloc policy may embed its predictor; a batch-mode one may not
    ctrl = AllocPolicyController(art)
    served = BatchReplay(wl, profile, 4, requests=env.replay.requests, k_max=8, seed=2,
                         draft_signal=ctrl.estimator.workload_signal(wl))  # type: ignore[attr-defined]
    served.run(ctrl)
    assert served.done and served.throughput() > 0
    from specgym.eval.batch_eval import compare  # tune compare gives the engine the estimators' draft signals

    res = compare(wl, profile, [ctrl.teacher(), ctrl], replications=1, requests=12, max_batch=4, split="test",
                  k_max=8)
    assert [r["controller"] for r in res["rows"]] == ["budget:predictor:policy", ctrl.name]
    with pytest.raises(SpecgymError, match="predictor"):
        dataclasses.replace(random_artifact("batch", k_max=8), predictor=env.predictor.to_dict()).validate()


def test_bc_teacher_must_be_the_rule_the_run_calibrates(mix_workload):
    from specgym.training.bc_init import alloc_demonstrations

    obs, labels = alloc_demonstrations("budget:logistic", lambda: _env(mix_workload, max_batch=8), 2)
    assert obs.shape[1] == len(ALLOC_FEATURE_NAMES) and (labels == TEACHER_ACTION).all()
    with pytest.raises(SpecgymError, match="teacher"):
        alloc_demonstrations("goodput", lambda: _env(mix_workload, max_batch=8), 1)


def test_batch_replay_on_a_linear_profile_pickles(mix_workload):
    """A training snapshot pickles its envs: a replay priced by a linear profile (its step pricer is a closure)
    round-trips and continues identically."""
    import pickle

    sim = BatchReplay(mix_workload, load_batch_profile("h100-llama31-8b"), 8, requests=np.arange(40), k_max=8,
                      seed=1)
    for _ in range(5):
        sim.step(3)
    copy = pickle.loads(pickle.dumps(sim))
    sim.run_fixed(3)
    copy.run_fixed(3)
    assert (copy.tokens, copy.now_ms) == (sim.tokens, sim.now_ms)


def test_controller_is_told_the_switch_costs_like_the_rule(mix_workload):
    """The sweep tells a budget rule the engine's switch costs; the learned allocator's rule is told them too and
    keeps them across runs."""
    from specgym.agents.artifact import random_artifact
    from specgym.envs.core.switching import SwitchCosts

    profile = load_batch_profile("h100-llama31-8b")
    ctrl = AllocPolicyController(random_artifact("alloc", k_max=8))
    sw = SwitchCosts(0.5, 2)
    ctrl.switch_costs = sw
    sim = BatchReplay(mix_workload, profile, 8, requests=np.arange(40), k_max=8, seed=1, switch_costs=sw)
    sim.run(ctrl)
    assert ctrl.core.rule.switch_costs is sw and sim.done
