"""PPO run configuration: RL-Zoo-style YAML files resolved into one typed, validated :class:`PPOConfig`.

Resolution order (later wins): the ``default`` entry of the mode's YAML (``training/configs/{k,token}.yaml``), the
entry named after the workload, then ``--hyperparams KEY=VALUE`` overrides. Every key is checked for type and range
and an error names the file, the entry and the key. The resolved config is written to the run folder
(``config.yaml``) together with the run's identity (:class:`RunConfig`), which is what reproduces the run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import specgym.catalogue as catalogue
from specgym.agents.specs import build as build_spec
from specgym.baselines.tree_menu import menu
from specgym.envs.core.kinds import HEAD_DRAFTER, MODE_NAMES
from specgym.envs.core.rounds import K_MAX_LIMIT
from specgym.envs.profiles import load_profile
from specgym.errors import SpecgymError
from specgym.paths import TRAINING_CONFIGS_DIR

MODES = MODE_NAMES
SHAPINGS = ("draft_cost", "conf_potential")


@dataclass
class Normalize:
    """``VecNormalize`` settings (the statistics are saved with every model and exported)."""

    norm_obs: bool = True
    norm_reward: bool = True
    clip_obs: float = 10.0
    clip_reward: float = 10.0


@dataclass
class PPOConfig:
    """Hyperparameters of one PPO run (every YAML key; see ``training/configs/k.yaml`` for their meaning).

    The shipped YAML files are the one source of the values: every key is required except the ``bc_*`` keys.

    ``token_value`` is ``"auto"`` or a number: the reward is ``token_value * produced - time / t_AR``
    (:mod:`specgym.training.rewards`). ``bc_*`` configure behaviour-cloning initialisation
    (:mod:`specgym.training.bc_init`). ``domains: generalist`` trains on the domain-randomised distribution of
    :func:`specgym.envs.workloads.domains.generalist_domains` instead of one workload.
    """

    n_envs: int
    n_steps: int
    batch_size: int
    n_epochs: int
    learning_rate: float
    lr_schedule: str
    gamma: float
    gae_lambda: float
    clip_range: float
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    net_arch: list[int]
    activation: str
    normalize: Normalize
    token_value: float | str
    shaping: list[str]
    k_min: int
    k_max: int
    outcome_seed: int | None
    eval_freq: int
    eval_max_requests: int | None
    timesteps: int
    bc_init: str | None = None
    predictor: str | None = None
    bc_warmup: int = 0
    bc_epochs: int = 10
    bc_passes: int = 1
    domains: str | None = None
    batch_profile: str | None = None
    max_batch: int = 256
    batch_requests: int = 96
    profile: str | None = None
    profile_jitter: float | None = None
    drafter: str | None = None
    shapes: list | None = None

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str, origins: dict[str, str] | None = None) -> PPOConfig:
        """Build and validate; unknown keys, wrong types and out-of-range values name ``where`` (or, for a key in
        ``origins``, where its value came from: a YAML entry or ``--hyperparams``) and the key."""
        values = check_entry(data, where)
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        missing = sorted(set(required) - set(values))
        if missing:
            raise SpecgymError(f"{where}: hyperparameter(s) {missing} missing (no default)")
        if "normalize" in values:
            values["normalize"] = Normalize(**values["normalize"])
        cfg = cls(**values)
        cfg.validate(where, origins)
        return cfg

    def validate(self, where: str = "config", origins: dict[str, str] | None = None) -> None:
        """Range checks that a type check cannot express; an error names where the bad value came from."""
        origins = origins or {}

        def bad(key: str, why: str) -> SpecgymError:
            return SpecgymError(f"{origins.get(key, where)}: {key} {why}, got {getattr(self, key)!r}")

        for key in ("n_envs", "n_steps", "batch_size", "n_epochs", "bc_epochs", "bc_passes", "timesteps"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        if self.timesteps % self.n_envs:  # every step advances all n_envs envs: the run stops exactly at a multiple
            lo = self.timesteps // self.n_envs * self.n_envs
            hint = f"(each step advances every env; e.g. timesteps {lo or self.n_envs} or {lo + self.n_envs})"
            if origins.get("n_envs") == "--hyperparams" and origins.get("timesteps") != "--hyperparams":
                raise bad("n_envs", f"must divide timesteps = {self.timesteps} {hint}")
            raise bad("timesteps", f"must be a multiple of n_envs = {self.n_envs} {hint}")
        if not 1 <= self.k_max <= K_MAX_LIMIT:
            raise bad("k_max", f"must be in [1, {K_MAX_LIMIT}]")
        if not 0 <= self.k_min <= self.k_max:
            raise bad("k_min", "must be in [0, k_max]")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise bad("learning_rate", "must be > 0")
        for key in ("gamma", "gae_lambda"):
            if not 0 < getattr(self, key) <= 1:
                raise bad(key, "must be in (0, 1]")
        for key in ("clip_range", "max_grad_norm"):
            if not getattr(self, key) > 0:
                raise bad(key, "must be > 0")
        for key in ("ent_coef", "vf_coef", "eval_freq", "bc_warmup"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0")
        if self.eval_max_requests is not None and self.eval_max_requests < 1:
            raise bad("eval_max_requests", "must be >= 1 or null")
        if self.lr_schedule not in ("constant", "linear"):
            raise bad("lr_schedule", "must be 'constant' or 'linear'")
        if self.activation not in ("tanh", "relu"):
            raise bad("activation", "must be 'tanh' or 'relu'")
        if not self.net_arch or not all(isinstance(h, int) and h > 0 for h in self.net_arch):
            raise bad("net_arch", "must be a non-empty list of positive layer widths")
        unknown = sorted(set(self.shaping) - set(SHAPINGS))
        if unknown:
            raise SpecgymError(f"{origins.get('shaping', where)}: shaping: unknown term(s) {unknown}; valid: "
                               f"{list(SHAPINGS)}")
        if isinstance(self.token_value, str) and self.token_value != "auto":
            raise bad("token_value", "must be 'auto' or a number")
        if not isinstance(self.token_value, str) and not self.token_value > 0:
            raise bad("token_value", "must be > 0")
        if self.max_batch < 1 or self.batch_requests < 1:
            raise bad("max_batch", "and batch_requests must be >= 1")
        if self.domains not in (None, "generalist"):
            raise bad("domains", "must be null or 'generalist'")
        if self.drafter not in (None, HEAD_DRAFTER):
            raise bad("drafter", f"must be null (trees drafted by the draft model) or {HEAD_DRAFTER!r} (tree mode)")
        if self.shapes is not None:  # tree mode: the action menu (default: the env's)
            try:
                menu(self.shapes, self.k_max, "shapes")
            except SpecgymError as exc:
                raise SpecgymError(f"{origins.get('shapes', where)}: {exc}") from None
        if self.profile_jitter is not None and not (1.0 <= self.profile_jitter <= 10.0):
            raise bad("profile_jitter", "must be null or a spread in [1, 10] (each cost factor within [1/spread, "
                                        "spread])")
        if self.profile_jitter is not None and self.domains is not None:
            raise bad("profile_jitter", "and domains exclude each other (the generalist randomises profiles itself)")
        for key, check in (("profile", lambda v: load_profile(v)),  # bad names fail here, before any work
                           ("predictor", lambda v: catalogue.resolve("predictor", v)),
                           ("bc_init", lambda v: build_spec(v, self.k_max, ("chain", "drafter", "batch")))):
            value = getattr(self, key)
            if value is not None:
                try:
                    check(value)
                except SpecgymError as exc:
                    raise SpecgymError(f"{origins.get(key, where)}: {key}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_entry(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Type-check a (possibly partial) mapping of hyperparameters; returns the coerced values."""
    unknown = sorted(set(data) - set(PPOConfig.keys()))
    if unknown:
        raise SpecgymError(f"{where}: unknown hyperparameter(s) {unknown}; valid: {PPOConfig.keys()}")
    values = {k: _coerce(k, v, where) for k, v in data.items()}
    if "normalize" in values:
        norm = values["normalize"]
        bad = sorted(set(norm) - {f.name for f in dataclasses.fields(Normalize)})
        if bad:
            raise SpecgymError(f"{where}: normalize: unknown key(s) {bad}")
        values["normalize"] = {k: _coerce(f"normalize.{k}", v, where) for k, v in norm.items()}
    return values


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "bool": (bool,),
}


def _coerce(key: str, value: Any, where: str) -> Any:
    """Check one value against the dataclass field's type (YAML 1.1 reads ``1e-4`` as a string: accept it)."""
    leaf = key.split(".")[-1]
    owner = Normalize if key.startswith("normalize.") else PPOConfig
    if key == "normalize":
        if not isinstance(value, dict):
            raise SpecgymError(f"{where}: normalize must be a mapping, got {value!r}")
        return value
    ftype = {f.name: f.type for f in dataclasses.fields(owner)}[leaf]
    optional = "None" in str(ftype)
    if value is None:
        if optional:
            return None
        raise SpecgymError(f"{where}: hyperparameter {key} must not be null")
    base = str(ftype).replace(" | None", "")
    if base == "float | str":  # token_value
        if isinstance(value, str) and value != "auto":
            value = _number(value)
        ok = isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
    elif base in ("int", "float", "bool"):
        if base == "float" and isinstance(value, str):
            value = _number(value)
        ok = isinstance(value, _TYPES[base]) and (base == "bool" or not isinstance(value, bool))
        if base == "float" and ok:
            value = float(value)
    elif base == "str":
        ok = isinstance(value, str)
    elif base.startswith("list"):
        ok = isinstance(value, list)
    else:  # pragma: no cover - every field type is listed above
        ok = True
    if not ok:
        raise SpecgymError(f"{where}: hyperparameter {key} has the wrong type ({value!r}; expected {base})")
    return value


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


@dataclass
class RunConfig:
    """What reproduces a run: its hyperparameters plus mode, seed and the identity of the training data.

    Attributes:
        ppo: The resolved hyperparameters.
        mode: ``k`` or ``token``.
        seed: Training seed.
        workload_name, workload_path, workload_sha256, workload_synthetic: The training workload.
        token_value_resolved: The reward's token value after resolving ``auto``.
        token_value_note: How ``auto`` was resolved.
        predictor_sha256: The checksum of the acceptance predictor the run's observations read (``predictor``
            key), fixed when the run starts: export and resume refuse a predictor file changed since.
    """

    ppo: PPOConfig
    mode: str
    seed: int
    workload_name: str
    workload_path: str
    workload_sha256: str
    workload_synthetic: bool
    token_value_resolved: float = 1.0
    token_value_note: str = ""
    predictor_sha256: str | None = None

    def to_yaml(self) -> str:
        data = {**self.ppo.to_dict(), **{k: v for k, v in dataclasses.asdict(self).items() if k != "ppo"}}
        return yaml.safe_dump(data, sort_keys=False)

    @classmethod
    def from_file(cls, path: Path) -> RunConfig:
        data = read_yaml(path)
        run_keys = [f.name for f in dataclasses.fields(cls) if f.name != "ppo"]
        missing = [k for k in ("mode", "seed", "workload_path", "workload_sha256") if k not in data]
        if missing:
            raise SpecgymError(f"{path}: missing key(s) {missing} (not a specgym run config)")
        ppo = PPOConfig.from_dict({k: v for k, v in data.items() if k not in run_keys}, str(path))
        return cls(ppo=ppo, **{k: data[k] for k in run_keys if k in data})


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


def resolve_config(mode: str, workload_name: str, config_file: str | Path | None = None,
                   overrides: dict[str, Any] | None = None) -> PPOConfig:
    """The hyperparameters of a run: ``default`` <- workload entry of the mode's YAML <- overrides.

    Args:
        mode: ``k``, ``token``, ``batch``, ``tree`` or ``alloc``.
        workload_name: Selects the YAML entry (RL-Zoo style); ``default`` applies to every workload.
        config_file: YAML to use instead of the shipped ``training/configs/MODE.yaml``.
        overrides: Command-line ``KEY=VALUE`` pairs (highest priority).
    """
    if mode not in MODES:
        raise SpecgymError(f"--mode must be one of {MODES}, got {mode!r}")
    path = Path(config_file) if config_file else TRAINING_CONFIGS_DIR / f"{mode}.yaml"
    data = read_yaml(path)
    if "default" not in data and workload_name not in data:
        raise SpecgymError(f"{path}: needs a 'default' entry or one named {workload_name!r}")
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}  # where each key's value came from: an error blames the right place
    for entry, part in (("default", data.get("default")), (workload_name, data.get(workload_name)),
                        ("--hyperparams", overrides)):
        part = part or {}
        if not isinstance(part, dict):
            raise SpecgymError(f"{path}: entry {entry!r} must be a mapping")
        where = "--hyperparams" if entry == "--hyperparams" else f"{path} [{entry}]"
        check_entry(part, where)
        for key, value in part.items():
            origins[key] = where
            if key == "normalize" and isinstance(merged.get(key), dict) and isinstance(value, dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = copy.deepcopy(value)
    return PPOConfig.from_dict(merged, str(path), origins)
