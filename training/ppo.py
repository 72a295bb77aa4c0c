"""PPO training of speculation-length policies (``specgym train``), with stable-baselines3.

One run = one folder ``runs/NAME``::

    config.yaml            resolved hyperparameters + workload identity (what reproduces the run)
    model.zip              latest model (end of training, or the checkpoint written on Ctrl-C)
    vecnormalize.pkl       its VecNormalize statistics (observation and reward normalisation)
    best_model.zip         best model by validation speedup vs the best fixed K (+ best_vecnormalize.pkl)
    state.json             status (running / interrupted / complete), timesteps done and target
    summary.json/.md       final validation figures and an honest verdict against the best fixed K
    tb/PPO_1/              tensorboard: SB3's scalars, specdec/* (training rollouts) and eval/* (validation)

Choices (documented here because they shape results):

* **Reward (``token_value``).** The env's reward is ``produced - time/t_AR`` (a token is worth one AR step).
  The training wrapper :class:`TokenValueReward` uses ``token_value * produced - time/t_AR`` instead. For a
  request of N tokens the return is ``token_value * N - T/t_AR``: N is fixed by the request, so the optimal
  policy is unchanged (minimise T). But PPO's value function cannot see how many tokens remain (the features
  exclude the completion length on purpose), so credit is assigned almost myopically; with ``token_value = 1``
  the myopic optimum overvalues tokens (a token really saves ``T/N`` time, not ``t_AR``) and drafts too long.
  ``auto`` sets ``token_value = 1 / speedup of the best fixed K`` on the training split (the time a token costs
  at a good rate), the Dinkelbach-style fix for a ratio objective. ``1.0`` reproduces the env's reward.
* Observations and rewards are normalised by ``VecNormalize`` (gamma-discounted return scaling); the
  statistics are saved with every model and exported.
* **Behaviour-cloning initialisation (``bc_init``, ``specgym train --init-from SPEC``).** Token mode by default:
  the actor is first cloned from a baseline's decisions on the train split (``confidence:TAU`` with TAU tuned on
  the train split), the critic is warmed up with the actor frozen (``bc_warmup`` steps), then PPO fine-tunes at a
  low learning rate; the clone is validated before PPO starts. PPO from scratch stayed 1-2 % below the
  confidence-stop rules (work_tmp/ppo_results.md). See :mod:`specgym.training.bc_init`.
* Training draws requests from the ``train`` split; validation uses ``val``; reports use ``test``.
* ``torch.set_num_threads(1)``: the networks are tiny and the machine is shared.
"""

from __future__ import annotations

import copy
import io
import json
import math
import shutil
import time
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml

from specgym.errors import SpecgymError
from specgym.io import atomic_path, atomic_write_text

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
MODES = ("k", "token")
HP_KEYS = {
    "n_envs": int, "n_steps": int, "batch_size": int, "n_epochs": int, "learning_rate": float,
    "lr_schedule": str, "gamma": float, "gae_lambda": float, "clip_range": float, "ent_coef": float,
    "vf_coef": float, "max_grad_norm": float, "net_arch": list, "activation": str, "normalize": dict,
    "token_value": (str, float), "k_min": int, "k_max": int, "outcome_seed": (int, type(None)),
    "eval_freq": int, "eval_max_requests": (int, type(None)), "timesteps": int, "shaping": list,
    "bc_init": (str, type(None)), "bc_warmup": int, "bc_epochs": int, "bc_passes": int,
}
# Optional keys (older config files may lack them): behaviour-cloning initialisation, see training/bc_init.py.
HP_DEFAULTS = {"bc_init": None, "bc_warmup": 0, "bc_epochs": 10, "bc_passes": 2}
SHAPINGS = ("draft_cost", "conf_potential")
NORMALIZE_KEYS = {"norm_obs": bool, "norm_reward": bool, "clip_obs": float, "clip_reward": float}


# ---------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------
def read_yaml(path: Path) -> dict[str, Any]:
    """Load a YAML mapping; :class:`SpecgymError` on a bad file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecgymError(f"{path}: cannot read YAML ({exc})") from None
    if not isinstance(data, dict):
        raise SpecgymError(f"{path}: expected a mapping at the top level")
    return data


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["learning_rate=1e-4", "net_arch=[128,128]"]`` -> dict (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecgymError(f"hyperparameter override must be KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise SpecgymError(f"cannot parse the value of {item!r}") from None
    return out


def _check_hp(cfg: dict[str, Any], where: str) -> None:
    unknown = sorted(set(cfg) - set(HP_KEYS))
    if unknown:
        raise SpecgymError(f"{where}: unknown hyperparameter(s) {unknown}; valid: {sorted(HP_KEYS)}")
    for key, value in list(cfg.items()):
        typ = HP_KEYS[key]
        if isinstance(value, str) and typ in (float, (str, float)) and value != "auto":
            try:  # YAML 1.1 reads 1e-4 (no dot) as a string
                value = cfg[key] = float(value)
            except ValueError:
                pass
        ok = isinstance(value, typ) or (typ is float and isinstance(value, int) and not isinstance(value, bool))
        if key == "token_value" and isinstance(value, (int, float)) and not isinstance(value, bool):
            ok = True
        if not ok or (isinstance(value, bool) and typ in (int, float)):
            raise SpecgymError(f"{where}: hyperparameter {key} has the wrong type ({value!r})")


def resolve_config(mode: str, workload_name: str, config_file: str | Path | None = None,
                   overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The hyperparameters of a run: ``default`` <- workload entry of the mode's YAML <- overrides.

    Args:
        mode: ``k`` or ``token``.
        workload_name: Selects the YAML entry (RL-Zoo style); ``default`` applies to every workload.
        config_file: YAML to use instead of the shipped ``training/configs/MODE.yaml``.
        overrides: Command-line ``KEY=VALUE`` pairs (highest priority).
    """
    if mode not in MODES:
        raise SpecgymError(f"--mode must be one of {MODES}, got {mode!r}")
    path = Path(config_file) if config_file else CONFIG_DIR / f"{mode}.yaml"
    data = read_yaml(path)
    if "default" not in data and workload_name not in data:
        raise SpecgymError(f"{path}: needs a 'default' entry or one named {workload_name!r}")
    cfg: dict[str, Any] = {}
    for entry in ("default", workload_name):
        part = data.get(entry) or {}
        if not isinstance(part, dict):
            raise SpecgymError(f"{path}: entry {entry!r} must be a mapping")
        _check_hp(part, f"{path} [{entry}]")
        for key, value in part.items():
            if key == "normalize" and isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = copy.deepcopy(value)
    over = dict(overrides or {})
    _check_hp(over, "--hyperparams")
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if key == "normalize" else value
    for key, value in HP_DEFAULTS.items():
        cfg.setdefault(key, value)
    missing = sorted(set(HP_KEYS) - set(cfg))
    if missing:
        raise SpecgymError(f"{path}: hyperparameter(s) {missing} missing (no default)")
    norm = cfg["normalize"]
    bad = sorted(set(norm) - set(NORMALIZE_KEYS))
    if bad:
        raise SpecgymError(f"normalize: unknown key(s) {bad}; valid: {sorted(NORMALIZE_KEYS)}")
    if cfg["lr_schedule"] not in ("constant", "linear"):
        raise SpecgymError(f"lr_schedule must be 'constant' or 'linear', got {cfg['lr_schedule']!r}")
    if cfg["activation"] not in ("tanh", "relu"):
        raise SpecgymError(f"activation must be 'tanh' or 'relu', got {cfg['activation']!r}")
    bad_shaping = sorted(set(cfg["shaping"]) - set(SHAPINGS))
    if bad_shaping:
        raise SpecgymError(f"shaping: unknown term(s) {bad_shaping}; valid: {list(SHAPINGS)}")
    if isinstance(cfg["token_value"], str) and cfg["token_value"] != "auto":
        raise SpecgymError(f"token_value must be 'auto' or a number, got {cfg['token_value']!r}")
    if cfg["bc_init"] is not None:
        from specgym.baselines.registry import make_controller

        make_controller(cfg["bc_init"], cfg["k_max"])  # a bad spec fails here, before any work
    for key in ("n_envs", "n_steps", "batch_size", "n_epochs", "k_max", "bc_epochs", "bc_passes"):
        if cfg[key] < 1:
            raise SpecgymError(f"{key} must be >= 1, got {cfg[key]}")
    if not all(isinstance(h, int) and h > 0 for h in cfg["net_arch"]) or not cfg["net_arch"]:
        raise SpecgymError(f"net_arch must be a non-empty list of positive layer widths, got {cfg['net_arch']!r}")
    cfg["mode"] = mode
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# run folder
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunFiles:
    """Paths inside a run folder."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def model(self) -> Path:
        return self.root / "model.zip"

    @property
    def vecnorm(self) -> Path:
        return self.root / "vecnormalize.pkl"

    @property
    def best_model(self) -> Path:
        return self.root / "best_model.zip"

    @property
    def best_vecnorm(self) -> Path:
        return self.root / "best_vecnormalize.pkl"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def summary_md(self) -> Path:
        return self.root / "summary.md"

    @property
    def tb(self) -> Path:
        return self.root / "tb"


def read_summary(run: RunFiles) -> dict[str, Any] | None:
    """The run's ``summary.json`` (None before the run finished)."""
    if not run.summary.is_file():
        return None
    return json.loads(run.summary.read_text())


def _read_state(run: RunFiles) -> dict[str, Any]:
    return json.loads(run.state.read_text()) if run.state.is_file() else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, default=float) + "\n", overwrite=True)


def save_checkpoint(model: Any, vecnorm: Any, model_path: Path, stats_path: Path) -> None:
    """Save a model and its VecNormalize statistics, each file atomically."""
    buf = io.BytesIO()
    model.save(buf)
    with atomic_path(model_path, overwrite=True) as tmp:
        tmp.write_bytes(buf.getvalue())
    with atomic_path(stats_path, overwrite=True) as tmp:
        vecnorm.save(str(tmp))


# ---------------------------------------------------------------------------------------------------------------
# environments
# ---------------------------------------------------------------------------------------------------------------
class TokenValueReward(gym.Wrapper):
    """Reward ``token_value * produced - time/t_AR`` instead of the env's ``produced - time/t_AR``.

    Tokens produced in a step are read from ``info["position"]`` (the request position after the step), so
    rounds the token env plays automatically are counted too. ``token_value = 1`` is the identity.
    """

    def __init__(self, env: gym.Env, token_value: float):
        super().__init__(env)
        self.token_value = float(token_value)
        self._pos = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._pos = int(info.get("position", 0))
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        pos = int(info["position"])
        reward = float(reward) - (1.0 - self.token_value) * (pos - self._pos)
        self._pos = pos
        return obs, reward, terminated, truncated, info


class TokenShaping(gym.Wrapper):
    """Token mode only: reward shaping that leaves every episode's return (and so the optimal policy) unchanged.

    * ``draft_cost``: charge ``draft_ms / t_AR`` on the step that drafts a token instead of at verification
      (the verification step gets the charged amount back), so the cost of continuing is immediate.
    * ``conf_potential``: potential-based shaping (Ng, Harada & Russell 1999) with
      ``Phi = token_value * sum over this round's drafted tokens of the running product of draft confidences``
      (the expected accepted prefix if confidences were calibrated); ``Phi = 0`` at every round start, so the
      shaped return differs from the original by ``-Phi(s_0) = 0`` (exactly for gamma = 1, up to gamma^steps
      factors otherwise). It gives immediate, confidence-aware credit to each continue decision.

    Needs the env's ``info["verified"]`` and the ``tok_conf_prod`` observation entry.
    """

    def __init__(self, env: gym.Env, terms: list[str], token_value: float, gamma: float):
        from specgym.envs.features import feature_names

        super().__init__(env)
        base = env.unwrapped
        self.cost = base.engine.profile.draft_ms / base.t_ar if "draft_cost" in terms else 0.0
        self.potential = "conf_potential" in terms
        self.token_value, self.gamma = float(token_value), float(gamma)
        self._i_prod = feature_names("token").index("tok_conf_prod")
        self._charged = self._phi = 0.0

    def reset(self, **kwargs):
        self._charged = self._phi = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward)
        if info.get("verified", True):
            reward += self._charged
            self._charged = 0.0
            phi = 0.0
        else:
            reward -= self.cost
            self._charged += self.cost
            phi = self._phi + self.token_value * float(obs[self._i_prod]) if self.potential else 0.0
        reward += (0.0 if terminated else self.gamma * phi) - self._phi
        self._phi = phi
        return obs, reward, terminated, truncated, info


def auto_token_value(workload: Any, k_max: int, split: str = "train") -> tuple[float, int]:
    """``1 / speedup`` of the best fixed K on ``split`` (and that K): the time a token costs at a good rate."""
    from specgym.envs.trace_engine import TraceEngine, VectorReplay

    engine = TraceEngine(workload, k_max=k_max, seed=0)
    req = workload.split_indices(split)
    best_k, best_t = 1, math.inf
    for k in range(1, k_max + 1):
        v = VectorReplay(engine, req)
        v.run_fixed(k)
        if v.time_ms.sum() < best_t:
            best_k, best_t = k, float(v.time_ms.sum())
    tokens = float(workload.lengths[req].sum())
    return best_t / (tokens * engine.t_ar), best_k


def env_config(cfg: dict[str, Any], workload: Any, split: str) -> dict[str, Any]:
    """The env configuration of a run (HighwayEnv-style keys of :mod:`specgym.envs.spec_env`)."""
    return {"workload": workload, "split": split, "k_max": cfg["k_max"], "k_min": cfg["k_min"],
            "outcome_seed": cfg["outcome_seed"]}


def make_env_fn(cfg: dict[str, Any], workload: Any, split: str = "train"):
    """A zero-argument env factory: the mode's env + :class:`SB3ActionWrapper` + :class:`TokenValueReward`."""
    from specgym.envs.spec_env import SpecDecodeEnv, SpecDecodeTokenEnv
    from specgym.envs.wrappers import SB3ActionWrapper

    cls = SpecDecodeEnv if cfg["mode"] == "k" else SpecDecodeTokenEnv
    env_cfg = env_config(cfg, workload, split)
    token_value = float(cfg["token_value_resolved"])

    shaping = list(cfg.get("shaping") or [])

    def make() -> gym.Env:
        env = cls(env_cfg)
        if cfg["mode"] == "k":
            env = SB3ActionWrapper(env)
        env = TokenValueReward(env, token_value)
        if shaping and cfg["mode"] == "token":
            env = TokenShaping(env, shaping, token_value, cfg["gamma"])
        return env

    return make


def make_training_env(cfg: dict[str, Any], workload: Any, seed: int, stats: Path | None = None):
    """``make_vec_env`` (DummyVecEnv, Monitor) wrapped in ``VecNormalize`` (loaded from ``stats`` on resume)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    venv = make_vec_env(make_env_fn(cfg, workload), n_envs=cfg["n_envs"], seed=seed)
    if stats is not None:
        vec = VecNormalize.load(str(stats), venv)
        vec.training = True
        return vec
    norm = cfg["normalize"]
    return VecNormalize(venv, norm_obs=norm.get("norm_obs", True), norm_reward=norm.get("norm_reward", True),
                        clip_obs=float(norm.get("clip_obs", 10.0)), clip_reward=float(norm.get("clip_reward", 10.0)),
                        gamma=cfg["gamma"])


def build_model(cfg: dict[str, Any], venv: Any, seed: int, tb_dir: Path):
    """A fresh SB3 PPO model with the run's hyperparameters."""
    import torch.nn as nn
    from stable_baselines3 import PPO

    lr = cfg["learning_rate"]
    schedule = (lambda progress: lr * progress) if cfg["lr_schedule"] == "linear" else lr
    arch = list(cfg["net_arch"])
    return PPO(
        "MlpPolicy", venv, learning_rate=schedule, n_steps=cfg["n_steps"], batch_size=cfg["batch_size"],
        n_epochs=cfg["n_epochs"], gamma=cfg["gamma"], gae_lambda=cfg["gae_lambda"], clip_range=cfg["clip_range"],
        ent_coef=cfg["ent_coef"], vf_coef=cfg["vf_coef"], max_grad_norm=cfg["max_grad_norm"],
        policy_kwargs={"net_arch": {"pi": arch, "vf": arch},
                       "activation_fn": nn.Tanh if cfg["activation"] == "tanh" else nn.ReLU},
        tensorboard_log=str(tb_dir), seed=seed, device="cpu", verbose=0,
    )


# ---------------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------------
_LIVE: dict[str, Any] = {}
_LIVE_IDS = count()


def _live_factory(arg: str | None, k_max: int):
    from specgym.agents.policy_controller import PolicyController

    if arg not in _LIVE:
        raise SpecgymError(f"no in-memory policy {arg!r}")
    return PolicyController(_LIVE[arg], name="ppo (training)")


def validate_policy(artifact: Any, workload: Any, split: str = "val", max_requests: int | None = None,
                    seed: int = 0) -> dict[str, Any]:
    """Evaluate an in-memory policy with :func:`specgym.eval.harness.evaluate` against the references.

    References: ``fixed:1..k_max`` (hence the best fixed K), ``speclane``, and in token mode ``confidence:0.4``
    (the strongest token-level baseline on the shipped workloads). Returns the policy's row figures plus
    ``speedup_vs_speclane`` / ``speedup_vs_confidence`` and the best fixed K.
    """
    from specgym.baselines.registry import register_prefix
    from specgym.eval.harness import EvalConfig, evaluate

    register_prefix("ppo-live", _live_factory, "ppo-live:ID (in-memory, training only)", replace=True)
    key = str(next(_LIVE_IDS))
    _LIVE[key] = artifact
    k_max = artifact.k_max
    refs = [f"fixed:{k}" for k in range(1, k_max + 1)] + ["speclane"]
    if artifact.mode == "token":
        refs.append("confidence:0.4")
    spec = f"ppo-live:{key}"
    try:
        report = evaluate(EvalConfig(workload=workload, controllers=",".join([*refs, spec]), split=split, seed=seed,
                                     k_max=k_max, max_requests=max_requests))
    finally:
        _LIVE.pop(key, None)
    rows = {r["spec"]: r for r in report["rows"]}
    row = rows[spec]
    out = {k: row[k] for k in ("throughput_tok_s", "speedup_vs_ar", "speedup_vs_best_fixed", "oracle_ratio",
                               "mean_k", "mean_accept_len", "draft_waste") if k in row}
    out["best_fixed_k"] = report["reference"]["best_fixed_k"]
    out["best_fixed_tok_s"] = rows[f"fixed:{out['best_fixed_k']}"]["throughput_tok_s"]
    out["speclane_tok_s"] = rows["speclane"]["throughput_tok_s"]
    out["speedup_vs_speclane"] = row["throughput_tok_s"] / out["speclane_tok_s"]
    if "confidence:0.4" in rows:
        out["confidence_tok_s"] = rows["confidence:0.4"]["throughput_tok_s"]
        out["speedup_vs_confidence"] = row["throughput_tok_s"] / out["confidence_tok_s"]
    out["oracle_tok_s"] = report["oracle"]["throughput_tok_s"]
    out["split"], out["requests"] = split, report["workload"]["requests"]
    return out


# ---------------------------------------------------------------------------------------------------------------
# callbacks
# ---------------------------------------------------------------------------------------------------------------
def _callbacks():
    """The callback classes (defined lazily: stable-baselines3 is an optional dependency)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class SpecDecMetricsCallback(BaseCallback):
        """Logs ``specdec/*`` from the env's ``info`` of training rollouts (at each rollout end).

        ``speedup_vs_ar`` = sum(N * t_AR) / sum(episode time) over episodes finished in the rollout;
        ``mean_k`` = mean drafted tokens per round (REFERENCES section 6), ``mean_planned_k`` = mean cap,
        ``accept_len`` = produced / rounds, ``draft_waste`` = (drafted - accepted) / drafted.
        """

        def __init__(self, t_ar: float):
            super().__init__()
            self.t_ar = t_ar
            self._reset_sums()

        def _reset_sums(self) -> None:
            self.rounds = self.planned = self.drafted = self.accepted = self.produced = 0
            self.ep_tokens = 0
            self.ep_time = 0.0
            self.episodes = 0

        def _on_step(self) -> bool:
            for info, done in zip(self.locals["infos"], self.locals["dones"]):
                if "drafted" in info:
                    self.rounds += 1
                    self.planned += info["planned_k"]
                    self.drafted += info["drafted"]
                    self.accepted += info["accepted"]
                    self.produced += info["produced"]
                if done:
                    self.episodes += 1
                    self.ep_tokens += info["length"]
                    self.ep_time += info["episode_time_ms"]
            return True

        def _on_rollout_end(self) -> None:
            rec = self.logger.record
            if self.rounds:
                rec("specdec/mean_k", self.drafted / self.rounds)
                rec("specdec/mean_planned_k", self.planned / self.rounds)
                rec("specdec/accept_len", self.produced / self.rounds)
                rec("specdec/draft_waste", (self.drafted - self.accepted) / max(self.drafted, 1))
            if self.episodes:
                rec("specdec/speedup_vs_ar", self.ep_tokens * self.t_ar / self.ep_time)
                rec("specdec/throughput_tok_s", self.ep_tokens / self.ep_time * 1000.0)
                rec("specdec/episodes", self.episodes)
            self._reset_sums()

    class ValidationCallback(BaseCallback):
        """Every ``eval_freq`` timesteps: evaluate the current policy on the val split, log ``eval/*``, keep the best.

        The policy is exported in memory (the same :class:`PolicyController` that ships) and run by
        :func:`specgym.eval.harness.evaluate` with the best fixed K and SpecLane as references. The best model
        by ``speedup_vs_best_fixed`` is saved to ``best_model.zip`` + ``best_vecnormalize.pkl``.
        """

        def __init__(self, run: RunFiles, cfg: dict[str, Any], workload: Any, state: dict[str, Any], console: Any):
            super().__init__()
            self.run, self.cfg, self.workload, self.state, self.console = run, cfg, workload, state, console
            self.freq = int(cfg["eval_freq"])
            self.last = int(state.get("last_eval_step", 0))
            self.history: list[dict[str, Any]] = state.setdefault("val_history", [])

        eval_at_start = False

        def _on_training_start(self) -> None:
            if self.eval_at_start:
                self.evaluate_now()

        def _on_step(self) -> bool:
            if self.freq > 0 and self.num_timesteps - self.last >= self.freq:
                self.evaluate_now()
            return True

        def evaluate_now(self) -> dict[str, Any]:
            from specgym.training.export import artifact_from_model

            self.last = self.num_timesteps
            vec = self.model.get_vec_normalize_env()
            art = artifact_from_model(self.model, vec, self.cfg["mode"], self.cfg["k_min"], self.cfg["k_max"])
            t0 = time.perf_counter()
            res = validate_policy(art, self.workload, "val", self.cfg["eval_max_requests"])
            for key in ("speedup_vs_best_fixed", "oracle_ratio", "throughput_tok_s", "speedup_vs_speclane",
                        "speedup_vs_confidence", "mean_k"):
                if key in res:
                    self.logger.record(f"eval/{key}", res[key])
            res["timesteps"] = self.num_timesteps
            self.history.append({k: res[k] for k in ("timesteps", "speedup_vs_best_fixed", "throughput_tok_s")})
            best = self.state.get("best")
            if best is None or res["speedup_vs_best_fixed"] > best["speedup_vs_best_fixed"]:
                save_checkpoint(self.model, vec, self.run.best_model, self.run.best_vecnorm)
                self.state["best"] = {k: res[k] for k in ("timesteps", "speedup_vs_best_fixed", "throughput_tok_s")}
            self.state["last_eval_step"] = self.last
            self.console.print(
                f"  [{self.num_timesteps:>9,} steps] val: {res['throughput_tok_s']:.2f} tok/s, "
                f"vs best fixed K={res['best_fixed_k']} {res['speedup_vs_best_fixed']:.3f}x, "
                f"vs speclane {res['speedup_vs_speclane']:.3f}x"
                + (f", vs confidence:0.4 {res['speedup_vs_confidence']:.3f}x" if "speedup_vs_confidence" in res
                   else "")
                + f", oracle ratio {res['oracle_ratio']:.3f} ({time.perf_counter() - t0:.1f} s)",
                highlight=False)
            return res

    class ProgressCallback(BaseCallback):
        """A rich progress bar over the target timesteps (steps/s shown)."""

        def __init__(self, total: int, start: int, console: Any):
            super().__init__()
            self.total, self.start, self.console = total, start, console
            self.bar = self.task = None

        def _on_training_start(self) -> None:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("train", total=self.total, completed=self.start, rate="")
            self.t0, self.n0 = time.perf_counter(), self.start

        def _on_step(self) -> bool:
            if self.n_calls % 64 == 0:
                rate = (self.num_timesteps - self.n0) / max(time.perf_counter() - self.t0, 1e-9)
                self.bar.update(self.task, completed=self.num_timesteps, rate=f"{rate:,.0f} steps/s")
            return True

        def _on_training_end(self) -> None:
            if self.bar is not None:
                self.bar.stop()

    return SpecDecMetricsCallback, ValidationCallback, ProgressCallback


# ---------------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class TrainRequest:
    """What ``specgym train`` was asked to do."""

    workload: str
    mode: str
    out: Path
    timesteps: int | None = None
    seed: int = 0
    config_file: str | None = None
    overrides: dict[str, Any] | None = None
    resume: bool = False
    force: bool = False
    quiet: bool = False


def _workload_identity(name_or_path: str) -> tuple[Any, dict[str, Any]]:
    import hashlib

    from specgym.envs.spec_env import cached_workload
    from specgym.envs.trace_format import resolve_workload_path

    path = resolve_workload_path(name_or_path)
    wl = cached_workload(path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return wl, {"workload_name": wl.name, "workload_path": str(path.resolve()), "workload_sha256": sha,
                "workload_synthetic": bool(wl.is_synthetic)}


def train(req: TrainRequest, console: Any = None) -> dict[str, Any]:
    """Train (or resume) a PPO run; returns the summary dict (also written to ``summary.json``/``summary.md``).

    Raises:
        SpecgymError: Existing run folder without ``--force``/``--resume``, nothing to resume, bad config.
    """
    import torch
    from rich.console import Console

    console = console or Console(stderr=True, quiet=req.quiet)
    torch.set_num_threads(1)
    run = RunFiles(Path(req.out))
    if req.resume and req.force:
        raise SpecgymError("--resume and --force exclude each other")
    if req.resume:
        if not run.config.is_file() or not run.model.is_file():
            raise SpecgymError(f"{run.root}: nothing to resume (needs config.yaml and model.zip)")
        cfg = read_yaml(run.config)
        wl, ident = _workload_identity(cfg["workload_path"])
        if ident["workload_sha256"] != cfg["workload_sha256"]:
            raise SpecgymError(f"{cfg['workload_path']}: workload changed since the run started (sha256 differs)")
        if req.timesteps is not None:
            cfg["timesteps"] = int(req.timesteps)
        state = _read_state(run)
    else:
        if run.root.exists() and not req.force:
            raise SpecgymError(f"{run.root}: already exists (pass --force to replace it, --resume to continue)")
        wl, ident = _workload_identity(req.workload)
        cfg = resolve_config(req.mode, wl.name, req.config_file, req.overrides)  # bad input fails before rmtree
        if req.timesteps is not None:
            cfg["timesteps"] = int(req.timesteps)
        if cfg["token_value"] == "auto":
            tv, bk = auto_token_value(wl, cfg["k_max"])
            cfg["token_value_resolved"] = round(tv, 6)
            cfg["token_value_note"] = f"auto: 1/speedup of best fixed K={bk} on the train split"
        else:
            cfg["token_value_resolved"] = float(cfg["token_value"])
        cfg.update(ident, seed=int(req.seed))
        if run.root.exists():
            shutil.rmtree(run.root)
        run.root.mkdir(parents=True)
        atomic_write_text(run.config, yaml.safe_dump(cfg, sort_keys=False))
        state = {"status": "running", "timesteps_done": 0}
    target = int(cfg["timesteps"])
    state.update(status="running", timesteps_target=target)
    _write_json(run.state, state)

    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import CallbackList

    seed = int(cfg["seed"])
    if req.resume:
        venv = make_training_env(cfg, wl, seed + int(state.get("timesteps_done", 0)), run.vecnorm)
        model = PPO.load(run.model, env=venv, device="cpu", tensorboard_log=str(run.tb))
    else:
        venv = make_training_env(cfg, wl, seed)
        model = build_model(cfg, venv, seed, run.tb)
        if cfg.get("bc_init"):
            from specgym.training.bc_init import clone_into, demonstrations

            t_bc = time.perf_counter()
            obs, labels = demonstrations(cfg["bc_init"], wl, cfg["mode"], cfg["k_min"], cfg["k_max"],
                                         passes=int(cfg["bc_passes"]), seed=seed)
            bc = clone_into(model, venv, obs, labels, epochs=int(cfg["bc_epochs"]), seed=seed)
            bc["seconds"] = round(time.perf_counter() - t_bc, 1)
            state["bc_init"] = {"spec": cfg["bc_init"], **bc}
            console.print(f"behaviour cloning from {cfg['bc_init']}: {bc['samples']:,} decisions, train accuracy "
                          f"{bc['accuracy']:.4f} ({bc['seconds']:.1f} s)", highlight=False)
    start = int(model.num_timesteps)
    metrics_cb, val_cb, progress_cb = _callbacks()
    t_ar = make_env_fn(cfg, wl)().unwrapped.t_ar
    val = val_cb(run, cfg, wl, state, console)
    progress = progress_cb(target, start, console)
    cbs = [metrics_cb(t_ar), val, progress]
    if int(cfg.get("bc_warmup") or 0) > start and cfg.get("bc_init"):
        from specgym.training.bc_init import critic_warmup_callback

        cbs.append(critic_warmup_callback(int(cfg["bc_warmup"])))
    # validate the cloned policy before PPO starts: the kept best model is never worse (on val) than the clone
    val.eval_at_start = bool(cfg.get("bc_init")) and start == 0 and val.freq > 0
    callbacks = CallbackList(cbs)
    console.print(f"[bold]specgym train[/bold] {cfg['mode']} mode on {wl.label} (train split): "
                  f"{start:,} -> {target:,} timesteps, n_envs {cfg['n_envs']}, token_value "
                  f"{cfg['token_value_resolved']:.3f}; run folder {run.root}", highlight=False)
    t0 = time.perf_counter()
    interrupted = False
    try:
        if target > start:
            model.learn(total_timesteps=target - start, callback=callbacks, reset_num_timesteps=not req.resume,
                        tb_log_name="PPO", progress_bar=False)
    except KeyboardInterrupt:
        interrupted = True
        if progress.bar is not None:
            progress.bar.stop()
    wall = time.perf_counter() - t0
    save_checkpoint(model, venv, run.model, run.vecnorm)
    done = int(model.num_timesteps)
    steps_per_s = (done - start) / wall if wall > 0 else 0.0
    state.update(timesteps_done=done, steps_per_s=steps_per_s,
                 wall_s=state.get("wall_s", 0.0) + wall)
    if interrupted:
        state["status"] = "interrupted"
        _write_json(run.state, state)
        console.print(f"interrupted at {done:,} timesteps: checkpoint saved to {run.model}; continue with "
                      f"'specgym train --out {run.root} --resume'", highlight=False)
        raise KeyboardInterrupt
    if val.freq > 0 and done - val.last > 0 and (done - start) > 0:
        val.num_timesteps = done
        val.evaluate_now()
        model.logger.dump(done)
    state["status"] = "complete"
    _write_json(run.state, state)
    summary = _summarize(run, cfg, wl, state, console)
    return summary


def _summarize(run: RunFiles, cfg: dict[str, Any], wl: Any, state: dict[str, Any], console: Any) -> dict[str, Any]:
    """Full-val-split figures of the final and best models; an honest verdict; summary.json + summary.md."""
    from stable_baselines3 import PPO

    from specgym.training.export import artifact_from_model

    results = {}
    for which, mpath, spath in (("final", run.model, run.vecnorm), ("best", run.best_model, run.best_vecnorm)):
        if not mpath.is_file():
            continue
        import pickle

        model = PPO.load(mpath, device="cpu")
        with open(spath, "rb") as f:
            vec = pickle.load(f)
        art = artifact_from_model(model, vec, cfg["mode"], cfg["k_min"], cfg["k_max"])
        results[which] = validate_policy(art, wl, "val", None)
    pick = "best" if "best" in results and (results["best"]["speedup_vs_best_fixed"]
                                            >= results["final"]["speedup_vs_best_fixed"]) else "final"
    val = results[pick]
    lines = [f"# PPO run {run.root.name}", "",
             f"- mode {cfg['mode']}, workload `{cfg['workload_name']}`"
             + (" (synthetic)" if cfg.get("workload_synthetic") else "")
             + f", {state['timesteps_done']:,} timesteps, seed {cfg['seed']}, "
               f"{state.get('steps_per_s', 0):,.0f} steps/s in the last session",
             f"- validation split ({val['requests']} requests), model `{pick}` "
             f"(the one `specgym export` takes by default):", ""]
    verdict = []
    sp = val["speedup_vs_best_fixed"]
    if sp >= 1.0:
        verdict.append(f"beats the best fixed K (K={val['best_fixed_k']}, {val['best_fixed_tok_s']:.2f} tok/s) "
                       f"on val: {val['throughput_tok_s']:.2f} tok/s ({sp:.3f}x)")
    else:
        verdict.append(f"WARNING: the policy is BELOW the best fixed K (K={val['best_fixed_k']}, "
                       f"{val['best_fixed_tok_s']:.2f} tok/s) on val: {val['throughput_tok_s']:.2f} tok/s "
                       f"({sp:.3f}x). Do not deploy it; train longer or tune (see training/ppo.py).")
    verdict.append(f"{'beats' if val['speedup_vs_speclane'] >= 1 else 'is BELOW'} speclane "
                   f"({val['speclane_tok_s']:.2f} tok/s): {val['speedup_vs_speclane']:.3f}x")
    if "speedup_vs_confidence" in val:
        verdict.append(f"{'beats' if val['speedup_vs_confidence'] >= 1 else 'is BELOW'} confidence:0.4 "
                       f"({val['confidence_tok_s']:.2f} tok/s): {val['speedup_vs_confidence']:.3f}x")
    verdict.append(f"oracle ratio {val['oracle_ratio']:.3f} (oracle {val['oracle_tok_s']:.2f} tok/s)")
    lines += [f"- {v}" for v in verdict] + [""]
    summary = {"run": run.root.name, "mode": cfg["mode"], "workload": cfg["workload_name"],
               "timesteps": state["timesteps_done"], "steps_per_s": state.get("steps_per_s"), "model": pick,
               "val": val, "val_all": results, "below_best_fixed": sp < 1.0, "verdict": verdict,
               "val_history": state.get("val_history", [])}
    _write_json(run.summary, summary)
    atomic_write_text(run.summary_md, "\n".join(lines), overwrite=True)
    console.print(verdict[0], style="bold red" if sp < 1.0 else "bold green", highlight=False)
    for v in verdict[1:]:
        console.print(v, highlight=False)
    return summary
