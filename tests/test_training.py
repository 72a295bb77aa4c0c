"""PPO training runs (``specgym train``): files, tensorboard scalars, resume, Ctrl-C checkpoint, no overwrite.

Budgets are tiny (a few thousand steps): these tests check the machinery, not the learning (the slow test in
``test_export.py`` checks that a policy actually learns).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("tensorboard")

from specgym.cli import main  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.config import parse_overrides, resolve_config  # noqa: E402
from specgym.training.ppo import TrainRequest, train  # noqa: E402
from specgym.training.rewards import TokenValueReward  # noqa: E402

TINY = {"n_envs": 2, "n_steps": 256, "batch_size": 128, "n_epochs": 2, "eval_freq": 1024, "eval_max_requests": 10}


def _tiny(tmp_path: Path, name: str = "run", mode: str = "k", steps: int = 2048, **kw) -> TrainRequest:
    return TrainRequest(workload="assc-regimes", mode=mode, out=tmp_path / name, timesteps=steps, seed=0,
                        overrides=dict(TINY), quiet=True, **kw)


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tb,) = list((run / "tb").iterdir())
    ea = EventAccumulator(str(tb))
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


@pytest.mark.parametrize("mode", ["k", "token"])
def test_short_run_writes_everything(tmp_path, mode):
    summary = train(_tiny(tmp_path, mode=mode))
    run = tmp_path / "run"
    for name in ("config.yaml", "model.zip", "vecnormalize.pkl", "best_model.zip", "best_vecnormalize.pkl",
                 "state.json", "summary.json", "summary.md"):
        assert (run / name).is_file(), name
    assert list((run / "tb").glob("*/events.out.tfevents.*"))
    scalars = _scalars(run)
    for tag in ("specdec/speedup_vs_ar", "specdec/mean_k", "specdec/accept_len", "specdec/draft_waste",
                "eval/speedup_vs_best_fixed", "eval/oracle_ratio", "eval/throughput_tok_s", "train/value_loss"):
        assert tag in scalars, tag
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["mode"] == mode and cfg["n_envs"] == 2 and cfg["timesteps"] == 2048
    assert cfg["workload_name"] == "assc-regimes" and len(cfg["workload_sha256"]) == 64
    assert 0 < cfg["token_value_resolved"] < 1
    assert cfg["learning_rate"] == resolve_config(mode, "assc-regimes").learning_rate
    with open(run / "vecnormalize.pkl", "rb") as f:
        vec = pickle.load(f)
    assert vec.obs_rms.count > 2048
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and state["timesteps_done"] >= 2048
    # an honest verdict is always present, whichever way it goes
    assert summary["verdict"] and ("BELOW" in summary["verdict"][0]) == summary["below_best_fixed"]
    assert "best fixed K" in (run / "summary.md").read_text()


def test_resume_continues_steps_and_statistics(tmp_path):
    train(_tiny(tmp_path, steps=1024))
    run = tmp_path / "run"
    with open(run / "vecnormalize.pkl", "rb") as f:
        count_before = pickle.load(f).obs_rms.count
    train(TrainRequest(workload="ignored", mode="k", out=run, timesteps=3072, resume=True, quiet=True))
    state = json.loads((run / "state.json").read_text())
    assert state["timesteps_done"] >= 3072
    with open(run / "vecnormalize.pkl", "rb") as f:
        count_after = pickle.load(f).obs_rms.count
    assert count_after >= count_before + 2048  # statistics continued, not restarted
    steps = [s for s, _ in _scalars(run)["specdec/mean_k"]]
    rollout = TINY["n_envs"] * TINY["n_steps"]  # the unfinished last rollout is not trained on, so not logged
    assert steps == sorted(steps) and max(steps) >= 3072 - rollout and min(steps) <= 1024  # one continuous log


def test_ctrl_c_saves_checkpoint_then_resume(tmp_path, monkeypatch):
    calls = {"n": 0}
    original = TokenValueReward.step

    def interrupting(self, action):
        calls["n"] += 1
        if calls["n"] == 1500:
            raise KeyboardInterrupt
        return original(self, action)

    monkeypatch.setattr(TokenValueReward, "step", interrupting)
    with pytest.raises(KeyboardInterrupt):
        train(_tiny(tmp_path, steps=4096))
    run = tmp_path / "run"
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "interrupted" and (run / "model.zip").is_file() and (run / "vecnormalize.pkl").is_file()
    done = state["timesteps_done"]
    assert 0 < done < 4096
    monkeypatch.setattr(TokenValueReward, "step", original)
    train(TrainRequest(workload="ignored", mode="k", out=run, resume=True, quiet=True))
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and state["timesteps_done"] >= 4096


def _interrupt_at(monkeypatch, call: int, exc: type[BaseException] = KeyboardInterrupt) -> None:
    """Make the ``call``-th env step raise ``exc`` (KeyboardInterrupt = Ctrl-C; anything else = a kill)."""
    calls = {"n": 0}
    original = TokenValueReward.step

    def interrupting(self, action):
        calls["n"] += 1
        if calls["n"] == call:
            raise exc
        return original(self, action)

    monkeypatch.setattr(TokenValueReward, "step", interrupting)


@pytest.mark.slow  # two short training runs per mode (~70 s for token mode on a 2-vCPU VM)
@pytest.mark.parametrize("mode", ["k", "token"])
def test_resume_equals_the_uninterrupted_run(tmp_path, monkeypatch, mode):
    """Interrupted mid-rollout and resumed, a run ends with the same weights, normalisation statistics, validation
    history and summary as the same run uninterrupted (snapshot at every rollout: learning-rate progress and
    num_timesteps, VecNormalize with its running returns, the envs' requests and RNGs, the global RNGs)."""
    import numpy as np
    from stable_baselines3 import PPO

    def tiny(name: str, **kw) -> TrainRequest:
        return _tiny(tmp_path, name, mode=mode, steps=2560, checkpoint_every_s=0.0, **kw)

    whole = train(tiny("whole"))
    _interrupt_at(monkeypatch, 1300)  # in the third rollout (512 steps each), after the validation at 1024
    with pytest.raises(KeyboardInterrupt):
        train(tiny("cut"))
    state = json.loads((tmp_path / "cut" / "state.json").read_text())
    assert state["status"] == "interrupted" and state["checkpoint_timesteps"] == 1024
    monkeypatch.undo()
    cut = train(TrainRequest(workload="ignored", mode=mode, out=tmp_path / "cut", resume=True, quiet=True,
                             checkpoint_every_s=0.0))
    a = PPO.load(tmp_path / "whole" / "model.zip").policy.state_dict()
    b = PPO.load(tmp_path / "cut" / "model.zip").policy.state_dict()
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    with open(tmp_path / "whole" / "vecnormalize.pkl", "rb") as f, open(tmp_path / "cut" / "vecnormalize.pkl",
                                                                         "rb") as g:
        va, vb = pickle.load(f), pickle.load(g)
    assert np.array_equal(va.obs_rms.mean, vb.obs_rms.mean) and np.array_equal(va.ret_rms.var, vb.ret_rms.var)
    assert cut["val"] == whole["val"] and cut["val_history"] == whole["val_history"]
    assert cut["model"] == whole["model"]
    md = (tmp_path / "cut" / "summary.md").read_text()
    assert "2,560 timesteps" in md and ("saved at" in md or "(at 2,560 timesteps)" in md)


def test_a_killed_run_can_be_exported_and_resumed(tmp_path, monkeypatch):
    """SIGKILL leaves no chance to save: state.json, model.zip and the resume snapshot are kept current on a
    cadence, so export (best and final) and --resume work from whatever was left."""
    class Killed(BaseException):
        pass

    _interrupt_at(monkeypatch, 1800, Killed)
    with pytest.raises(Killed):
        train(_tiny(tmp_path, steps=4096, checkpoint_every_s=0.0))
    run = tmp_path / "run"
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "running" and state["timesteps_done"] == state["checkpoint_timesteps"] == 1536
    assert state["best"]["timesteps"] == 1024 and (run / "best_model.zip").is_file()
    # --force: a tiny run exports whatever its verdict (an unfinished run's best model carries its state's figures)
    assert main(["export", str(run), "--which", "best", "--out", str(tmp_path / "best"), "--force"]) == 0
    assert main(["export", str(run), "--which", "final", "--out", str(tmp_path / "final"), "--force"]) == 0
    (run / "model.zip").unlink()  # killed before the first checkpoint finished: the best model still exports
    assert main(["export", str(run), "--which", "best", "--out", str(tmp_path / "best2"), "--force"]) == 0
    monkeypatch.undo()
    train(TrainRequest(workload="ignored", mode="k", out=run, resume=True, quiet=True))
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and state["timesteps_done"] == 4096


def test_existing_run_folder_is_never_overwritten(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "precious.txt").write_text("keep me")
    with pytest.raises(SpecgymError, match="already exists"):
        train(_tiny(tmp_path))
    assert main(["train", "--workload", "assc-regimes", "--timesteps", "512", "--out", str(run)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (run / "precious.txt").read_text() == "keep me"
    with pytest.raises(SpecgymError, match="nothing to resume"):
        train(_tiny(tmp_path, resume=True))


def test_config_resolution_and_overrides(tmp_path):
    base = resolve_config("token", "speclane-mix")
    assert base.gamma > 0.99
    over = resolve_config("k", "assc-regimes", overrides=parse_overrides(["learning_rate=1e-4", "net_arch=[32]",
                                                                           "normalize={norm_reward: false}"]))
    assert over.learning_rate == 1e-4 and over.net_arch == [32]
    assert over.normalize.norm_reward is False and over.normalize.norm_obs is True
    cfg_file = tmp_path / "hp.yaml"
    cfg_file.write_text("default:\n  n_envs: 3\nassc-regimes:\n  n_envs: 5\n")
    with pytest.raises(SpecgymError, match="missing"):
        resolve_config("k", "assc-regimes", cfg_file)
    full = Path(__file__).resolve().parent.parent / "training" / "configs" / "k.yaml"
    cfg_file.write_text(full.read_text() + "\nassc-regimes:\n  n_envs: 5\n")
    assert resolve_config("k", "assc-regimes", cfg_file).n_envs == 5
    assert resolve_config("k", "speclane-mix", cfg_file).n_envs == 16
    with pytest.raises(SpecgymError, match="unknown hyperparameter"):
        resolve_config("k", "assc-regimes", overrides={"learnin_rate": 1.0})
    with pytest.raises(SpecgymError, match="KEY=VALUE"):
        parse_overrides(["learning_rate"])
    with pytest.raises(SpecgymError, match="wrong type"):
        resolve_config("k", "assc-regimes", overrides={"n_envs": "many"})


def test_token_value_reward_keeps_the_objective():
    """Return = token_value * N - T/t_AR: same ordering of policies as the env's N - T/t_AR for a fixed request."""
    import gymnasium as gym

    import specgym  # noqa: F401

    for k in (1, 4):
        totals = []
        for tv in (1.0, 0.5):
            env = TokenValueReward(gym.make("specgym/SpecDecode-v1", workload="assc-regimes"), tv)
            env.reset(options={"request": 3})
            ret, done, info = 0.0, False, {}
            while not done:
                _, r, done, _, info = env.step(k)
                ret += r
            totals.append((ret, info["length"], info["episode_time_ms"]))
        (r1, n, t), (r05, _, _) = totals
        assert r1 - r05 == pytest.approx(0.5 * n, rel=1e-9)


def test_token_shaping_preserves_the_return():
    """draft_cost + conf_potential shaping (gamma = 1) changes per-step rewards, never an episode's return."""
    import numpy as np

    from specgym.envs.gym.spec_env import SpecDecodeTokenEnv
    from specgym.training.rewards import TokenShaping

    rng = np.random.default_rng(0)
    for shaping in (["draft_cost"], ["conf_potential"], ["draft_cost", "conf_potential"]):
        plain = TokenValueReward(SpecDecodeTokenEnv({"workload": "assc-regimes"}), 0.6)
        shaped = TokenShaping(TokenValueReward(SpecDecodeTokenEnv({"workload": "assc-regimes"}), 0.6), shaping, 1.0)
        for req in (0, 5):
            plain.reset(options={"request": req})
            shaped.reset(options={"request": req})
            r_plain, r_shaped, differs, done = 0.0, 0.0, False, False
            while not done:
                a = int(rng.random() < 0.7)
                _, r1, done, _, _ = plain.step(a)
                _, r2, done2, _, _ = shaped.step(a)
                assert done == done2
                r_plain += r1
                r_shaped += r2
                differs |= abs(r1 - r2) > 1e-9
            assert differs and r_shaped == pytest.approx(r_plain, abs=1e-9)


@pytest.mark.slow  # two demo runs (~60 s on a 2-vCPU VM)
def test_demo_refuses_an_existing_folder_and_force_leaves_nothing_stale(tmp_path, capsys):
    """A second demo never overwrites the first silently; --force replaces the whole demo folder."""
    root = tmp_path / "demo"
    args = ["demo", "--workload", "assc-regimes", "--out", str(root), "--k-steps", "1024", "--token-steps", "1024"]
    assert main(args) == 0
    first = sorted(p.name for p in root.iterdir())
    assert first == [".specgym", "k", "report", "token"]
    marker = root / "k" / "mine.txt"
    marker.write_text("keep")
    assert main(args) == 2  # refused: nothing touched
    assert "already exists" in capsys.readouterr().err and marker.read_text() == "keep"
    assert main([*args, "--force"]) == 2  # --force replaces only what specgym wrote: the user's file is not
    assert "mine.txt is not" in capsys.readouterr().err and marker.read_text() == "keep"
    marker.unlink()
    assert main([*args, "--no-token", "--force"]) == 0  # replaced whole: no stale token run
    assert sorted(p.name for p in root.iterdir()) == [".specgym", "k", "report"]


def test_bc_init_clones_the_baseline_rule(tmp_path):
    """bc_init: demonstrations match the rule at every decision, the clone reproduces it, the clone is validated."""
    import numpy as np

    import specgym.catalogue as catalogue
    from specgym.envs.core.features import feature_names
    from specgym.envs.workloads.trace_format import cached_workload
    from specgym.training.bc_init import demonstrations

    wl = cached_workload(catalogue.resolve("workload", "assc-regimes"))
    obs, lab = demonstrations("confidence:0.4", wl, "token", 0, 8, passes=1)
    names = feature_names("token")
    has = obs[:, names.index("tok_has_token")] > 0
    assert lab[~has].all()  # confidence:0.4 always drafts the first token
    assert ((obs[has, names.index("tok_conf")] >= 0.4) == lab[has].astype(bool)).all()
    with pytest.raises(SpecgymError, match="token-level"):
        demonstrations("fixed:3", wl, "token", 0, 8, passes=1)
    with pytest.raises(SpecgymError, match="bc_init|unknown controller"):
        resolve_config("token", "assc-regimes", overrides={"bc_init": "nonsense:1"})
    summary = train(TrainRequest(workload="assc-regimes", mode="token", out=tmp_path / "bc", timesteps=1024, seed=0,
                                 quiet=True, overrides={**TINY, "bc_init": "confidence:0.4", "bc_passes": 1,
                                                        "bc_epochs": 3, "bc_warmup": 512}))
    state = json.loads((tmp_path / "bc" / "state.json").read_text())
    assert state["bc_init"]["accuracy"] > 0.97
    assert state["val_history"][0]["timesteps"] == 0  # the clone itself was validated
    assert summary["val"]["speedup_vs_confidence"] > 0.97
    assert np.isfinite(summary["val"]["throughput_tok_s"])


def test_run_stops_exactly_at_the_target_and_the_learning_rate_never_goes_negative(tmp_path, capsys):
    """SB3 collects whole rollouts: the run stops at exactly --timesteps, the linear schedule is clamped at 0, and
    the final validation is printed once."""
    run = tmp_path / "exact"
    assert main(["train", "--workload", "assc-regimes", "--timesteps", "3000", "--out", str(run), "--hyperparams",
                 "n_envs=2", "n_steps=256", "batch_size=128", "eval_freq=1000", "eval_max_requests=5"]) == 0
    state = json.loads((run / "state.json").read_text())
    assert state["timesteps_done"] == 3000
    lrs = [v for _, v in _scalars(run)["train/learning_rate"]]
    assert lrs and min(lrs) >= 0.0
    steps = [h["timesteps"] for h in state["val_history"]]
    assert len(steps) == len(set(steps)) and max(steps) == 3000
    assert capsys.readouterr().err.count("[    3,000 steps] val") == 1


def test_every_validation_reaches_tensorboard_and_verdicts_name_their_subject(tmp_path):
    """A validation inside the last (stopped) rollout used to be printed but never logged (6 printed, 5 logged)."""
    summary = train(_tiny(tmp_path, steps=3072))
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    logged = [s for s, _ in _scalars(tmp_path / "run")["eval/speedup_vs_best_fixed"]]
    assert logged == [h["timesteps"] for h in state["val_history"]] == [1024, 2048, 3072]
    assert all(v.startswith(("the policy ", "WARNING: the policy ", "oracle ratio")) for v in summary["verdict"])
