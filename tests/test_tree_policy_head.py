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


def _decides_as_the_env(ctrl, env, engine, wl) -> set[int]:
    """Every request replayed by ``ctrl`` and stepped in ``env`` with its actions: the same observations before every
    round and the same outcomes; returns the actions taken."""
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
            o = ctrl.play(req)
            obs, _, done, _, info = env.step(a)
            assert (req.done, info["accepted"]) == (done, o.accepted)
    return actions


def test_the_controller_sees_what_the_env_saw(wl, tmp_path):
    """``tree-ppo`` on a head policy plays the head's trees (no ``@head`` needed) and, request by request, takes the
    decisions the env's observations give; a draft-model policy is refused on the head and the other way round."""
    path = write_artifact(tree_artifact("head", seed=3), tmp_path / "p")
    ctrl = make(f"tree-ppo:{path}", 8, kinds=("tree",))
    assert isinstance(ctrl, TreePolicyController) and ctrl.drafter == "head"
    env = gym.make("specgym/SpecDecodeTree-v0", workload=wl, split="val", drafter="head", profile=None).unwrapped
    engine = TreeEngine(wl, wl.profile, 8, drafter="head")
    assert len(_decides_as_the_env(ctrl, env, engine, wl)) > 1
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


EAGLE = ("eagle:3:2:4", "eagle:4:4:5")


def test_a_menu_holds_eagle_rounds_on_the_head(wl, tmp_path):
    """EAGLE-2 entries (``eagle:D:B:M``) play the rule's round in the env and in the controller (replayed
    approximately, as the rule is), the artifact keeps them under its checksum, and they are refused where the
    policy observes spine features (trees of the draft model) or the entry is malformed."""
    from specgym.baselines.tree_eagle import EagleTree
    from specgym.baselines.tree_menu import menu, menu_entry

    shapes = [*(list(s) for s in DEFAULT_SHAPES), *EAGLE]
    env = gym.make("specgym/SpecDecodeTree-v0", workload=wl, split="val", drafter="head", profile=None,
                   shapes=shapes).unwrapped
    engine = TreeEngine(wl, wl.profile, 8, drafter="head")
    for a in (len(DEFAULT_SHAPES), len(DEFAULT_SHAPES) + 1):
        env.reset(options={"request": 1})
        req, done = engine.start(1), False
        while not done:
            _, _, done, _, info = env.step(a)
            o = EagleTree(*(int(x) for x in EAGLE[a - len(DEFAULT_SHAPES)].split(":")[1:])).play(req)
            assert (info["shape"], info["accepted"], info["nodes"]) == (EAGLE[a - len(DEFAULT_SHAPES)], o.accepted,
                                                                        o.nodes)
    path = write_artifact(tree_artifact("head", seed=1, extra=EAGLE), tmp_path / "p")
    art = load_policy(path)
    assert art.shapes[-2:] == list(EAGLE) and json.loads((path / "policy.json").read_text())[
        "action_mapping"]["values"][-1] == "eagle:4:4:5"
    ctrl = make(f"tree-ppo:{path}", 8, kinds=("tree",))
    assert ctrl.approximate and [e.label for e in ctrl.menu[-2:]] == list(EAGLE)
    obs_env = gym.make("specgym/SpecDecodeTree-v0", workload=wl, split="val", drafter="head", profile=None,
                       shapes=shapes).unwrapped
    _decides_as_the_env(ctrl, obs_env, engine, wl)
    with pytest.raises(SpecgymError, match="EAGLE-2 entries need a policy on the head"):
        tree_artifact(None, extra=EAGLE).validate()
    with pytest.raises(SpecgymError, match="needs drafter 'head'"):
        gym.make("specgym/SpecDecodeTree-v0", workload=wl, split="val", shapes=shapes)
    for bad in ("eagle:4:4", "eagle:9:4:5", "beagle:1:1:1", [0, 1], [1] * 9, 3):
        with pytest.raises(SpecgymError) as exc:
            menu_entry(bad, 8)
        assert "\n" not in str(exc.value) and "entry" in str(exc.value)
    assert [e.label for e in menu([[], [2, 1], "eagle:2:2:3"], 8)] == ["plain", "2-1", "eagle:2:2:3"]
    assert [e.as_json() for e in menu([[], [2, 1], "eagle:2:2:3"], 8)] == [[], [2, 1], "eagle:2:2:3"]


def test_a_run_menu_reaches_the_exported_policy(wl, tmp_path):
    """``shapes`` in a tree run's config is its env's menu and its artifact's (a bad entry refused in one line)."""
    from specgym.envs.workloads.trace_format import save_workload
    from specgym.training.export import export_run
    from specgym.training.ppo import TrainRequest, train

    path = save_workload(wl, tmp_path / "w.parquet")
    shapes = [[], [1, 1], [2, 1], *EAGLE]
    tiny = {"n_envs": 2, "n_steps": 32, "batch_size": 64, "n_epochs": 1, "eval_freq": 10_000, "drafter": "head",
            "profile": None, "shapes": shapes}
    with pytest.raises(SpecgymError, match="shapes: entry 'eagle:1' is neither"):
        train(TrainRequest(workload=str(path), mode="tree", out=tmp_path / "bad", timesteps=64, seed=0,
                           overrides={**tiny, "shapes": [[1], "eagle:1"]}, quiet=True))
    train(TrainRequest(workload=str(path), mode="tree", out=tmp_path / "run", timesteps=64, seed=0, overrides=tiny,
                       quiet=True))
    art = load_policy(export_run(tmp_path / "run", tmp_path / "policy", force=True))
    assert art.shapes == shapes and art.drafter == "head"
