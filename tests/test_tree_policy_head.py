"""Tree policies on trees drafted by the draft head: the env, the artifact, the deployed controller.

``SpecDecodeTree-v0`` with ``drafter="head"`` replays the shipped real-pair recording's head trees (``ranks_head``),
priced as the head, observed without the spine's per-token features (the recording holds none of the head's); the
exported artifact names its drafter (covered by its checksum), and ``tree-ppo`` replays the very observations the
env produced. The live side is tested with the head trees (tests/test_head_tree.py). The policies here are random
networks (untrained): the tests are about what they see, not how well they decide.
"""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
from tree_policies import tree_artifact

from specgym.agents.artifact import load_policy, write_artifact
from specgym.agents.modes import get_mode
from specgym.agents.specs import make
from specgym.agents.tree_policy import TreePolicyController
from specgym.envs.core.rounds import TOKEN_FEATURES
from specgym.envs.core.tree import TreeShape
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.gym.tree_env import DEFAULT_SHAPES
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError


@pytest.fixture(scope="module")
def wl():
    full = cached_workload("smollm2-greedy")
    return full.subset(full.split_indices("val")[:6])


def test_the_env_replays_head_trees_without_spine_features(wl):
    from gymnasium.utils.env_checker import check_env

    env = gym.make("specgym/SpecDecodeTree-v0", workload=wl, split="val", drafter="head", profile=None).unwrapped
    check_env(env, skip_render_check=True)
    engine = TreeEngine(wl, wl.profile, 8, drafter="head")
    assert TOKEN_FEATURES <= engine.context(0).lacks and engine.context(0).profile.draft_ms == engine.profile.draft_ms
    rng = np.random.default_rng(0)
    for r in range(3):
        obs, _ = env.reset(options={"request": r})
        ref, done = engine.start(r), False
        while not done:
            a = int(rng.integers(len(DEFAULT_SHAPES)))
            obs, _, done, _, info = env.step(a)
            o = ref.play(TreeShape.from_widths(DEFAULT_SHAPES[a]))
            assert (info["accepted"], info["time_ms"]) == (o.accepted, pytest.approx(o.time_ms))
            assert np.isfinite(obs).all()
    names = get_mode("tree").features(get_mode("tree").feature_version)
    conf = [i for i, n in enumerate(names) if "conf" in n or "entropy" in n]
    env.reset(options={"request": 0})
    seen = np.stack([env.step(9)[0] for _ in range(5)])
    assert (seen[:, conf] == seen[0, conf]).all()  # no spine features: they never move


def test_the_artifact_names_its_drafter_and_its_checksum_covers_it(tmp_path):
    path = write_artifact(tree_artifact("head"), tmp_path / "p")
    art = load_policy(path)
    assert art.drafter == "head"
    meta = json.loads((path / "policy.json").read_text())
    assert meta["drafter"] == "head"
    meta["drafter"] = None
    (path / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError, match="function_sha256"):
        load_policy(path)
    assert load_policy(write_artifact(tree_artifact(None), tmp_path / "q")).drafter is None
    for bad in (dataclasses.replace(tree_artifact(None), drafter="ngram"),):
        with pytest.raises(SpecgymError, match="drafter"):
            bad.validate()


def test_the_controller_sees_what_the_env_saw(wl, tmp_path):
    """``tree-ppo`` on a head policy plays the head's trees (no ``@head`` needed) and, request by request, takes the
    decisions the env's observations give; a draft-model policy is refused on the head and the other way round."""
    path = write_artifact(tree_artifact("head", seed=3), tmp_path / "p")
    ctrl = make(f"tree-ppo:{path}", 8, kinds=("tree",))
    assert isinstance(ctrl, TreePolicyController) and ctrl.drafter == "head"
    env = gym.make("specgym/SpecDecodeTree-v0", workload=wl, split="val", drafter="head", profile=None).unwrapped
    engine = TreeEngine(wl, wl.profile, 8, drafter="head")
    actions = set()
    for r in range(wl.n_requests):
        obs, _ = env.reset(options={"request": r})
        req = engine.start(r)
        ctrl.reset(req.context)
        done = False
        while not done:
            np.testing.assert_allclose(ctrl.tracker.observation(), obs, rtol=1e-6)
            a = ctrl.action()
            actions.add(a)
            ctrl.play(req)
            obs, _, done, _, _ = env.step(a)
            assert req.done == done
    assert len(actions) > 1
    assert make(f"tree-ppo:{path}@head", 8, kinds=("tree",)).drafter == "head"
    other = write_artifact(tree_artifact(None), tmp_path / "q")
    with pytest.raises(SpecgymError, match="trained on trees drafted by the draft model"):
        make(f"tree-ppo:{other}@head", 8, kinds=("tree",))


def test_only_a_tree_run_names_a_drafter(wl, tmp_path):
    from specgym.envs.workloads.trace_format import save_workload
    from specgym.training.ppo import TrainRequest, train

    path = save_workload(wl, tmp_path / "w.parquet")
    with pytest.raises(SpecgymError, match="only --mode tree"):
        train(TrainRequest(workload=str(path), mode="k", out=tmp_path / "run", timesteps=64, seed=0,
                           overrides={"drafter": "head"}, quiet=True))
    with pytest.raises(SpecgymError, match="drafter"):
        train(TrainRequest(workload=str(path), mode="tree", out=tmp_path / "run", timesteps=64, seed=0,
                           overrides={"drafter": "ngram"}, quiet=True))
    assert not (tmp_path / "run").exists()
