"""Gymnasium environment over the live engine: choose K each round while real models decode (``SpecDecodeLive-v1``).

Same action space, observation (:class:`~specgym.envs.core.features.FeatureTracker`) and reward as the replay
environment ``specgym/SpecDecode-v1``, but every step runs one real speculative-decoding round with the draft and
target models. Use it to check a policy trained in replay against the real thing (sim-to-real), not to train:
a live step costs milliseconds instead of microseconds.

Round time (and so the reward ``produced - time_ms / t_AR``) comes from ``timing``: ``"profile"`` prices rounds
with the cost profile (deterministic), ``"wall"``/``"cpu"`` measure them. ``t_AR`` is always the profile's.

Registered by ``import specgym`` as ``specgym/SpecDecodeLive-v1`` (``nondeterministic=True``); heavy imports
happen on construction.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.features import FeatureTracker, feature_bounds
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.live.engine import LiveEngine, LiveRequest
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair
from specgym.envs.engines.live.profiler import measure_profile
from specgym.envs.gym.shell import EnvShell
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.prompts import read_prompts
from specgym.errors import SpecgymError
from specgym.paths import DEFAULT_PAIRS, MODELS_DIR, default_pair_name, pair_profile

ENV_ID = "specgym/SpecDecodeLive-v1"


class SpecDecodeLiveEnv(EnvShell):
    """Choose the draft cap K of each round of live speculative decoding.

    ## Description
    The rounds of ``specgym/SpecDecode-v1`` played by a real Hugging Face draft/target pair (default: the shipped
    midpair): every step drafts and verifies with the models. Use it to check a policy trained in replay against
    real decoding (sim-to-real), not to train: a step costs milliseconds instead of microseconds.

    ## Action Space
    ``Discrete(k_max - k_min + 1, start=k_min)``, as ``specgym/SpecDecode-v1``.

    ## Observation Space
    As ``specgym/SpecDecode-v1`` (the same feature tracker, fed with the live rounds).

    ## Rewards
    ``produced - time_ms / t_AR``; ``time_ms`` from ``timing`` (``"profile"``: priced by the cost profile,
    deterministic; ``"wall"`` or ``"cpu"``: measured), ``t_AR`` always the profile's.

    ## Starting State
    The prompt's prefill: ``reset(options={"prompt": text})`` decodes a given prompt, otherwise one is drawn with
    ``np_random`` from the configured list.

    ## Episode End
    Terminates when ``max_new_tokens`` tokens are produced; never truncated.

    ## Arguments
    ``draft``, ``target`` (folders or hub names), ``prompts``, ``max_new_tokens``, ``temperature``, ``k_max``,
    ``k_min``, ``timing``, ``profile`` (None: a shipped pair's measured profile, another pair's measured when the
    env is made), ``device``, ``dtype``.

    ## Info
    The round's fields plus ``position``, ``length``, ``episode_time_ms`` and ``tokens`` (the completion so far).

    ## Version History
    * v1: feature version 3 and action checks, as ``specgym/SpecDecode-v1``.
    * v0: initial release.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 30}
    config_name = "live env"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Every configuration key with its default (models: the default shipped pair). ``profile`` None: a shipped
        pair's measured profile, another pair's costs measured on this machine when the env is made (a warning says
        so): a pair is never priced with another pair's costs."""
        pair = default_pair_name()
        return {
            "draft": str(MODELS_DIR / pair / "draft"),
            "target": str(MODELS_DIR / pair / "target"),
            "prompts": ["def main():\n", "The import statement "],
            "max_new_tokens": 128,
            "temperature": 0.0,
            "k_max": DEFAULT_K_MAX,
            "k_min": 0,
            "timing": "profile",
            "profile": None,
            "device": "cpu",
            "dtype": "float32",
        }

    def __init__(self, config: dict[str, Any] | None = None, render_mode: str | None = None, **overrides: Any):
        self._merge_config(config, overrides, render_mode)
        cfg = self.config
        prof = cfg["profile"]
        given = prof if isinstance(prof, CostProfile) or prof is None else load_profile(prof)
        timing = cfg["timing"]
        if timing not in ("profile", "wall", "cpu"):
            raise SpecgymError(f"timing must be 'profile', 'wall' or 'cpu', got {timing!r}")
        self.pair = load_pair(cfg["draft"], cfg["target"], cfg["device"], cfg["dtype"])
        self.k_max, self.k_min = int(cfg["k_max"]), int(cfg["k_min"])
        if not 0 <= self.k_min <= self.k_max:
            raise SpecgymError(f"k_min must be in [0, k_max={self.k_max}], got {self.k_min}")
        self.profile = given if given is not None else self._pair_profile(cfg["draft"], cfg["target"])
        self.engine = LiveEngine.from_pair(self.pair, k_max=self.k_max, profile=self.profile,
                                           timing=self.profile if timing == "profile" else timing)
        self.t_ar = self.profile.t_ar_ms
        self.tracker = FeatureTracker(self.k_max)
        low, high = feature_bounds("k")
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self.action_space = spaces.Discrete(self.k_max - self.k_min + 1, start=self.k_min)
        prompts = cfg["prompts"]
        if isinstance(prompts, str):
            prompts = [p.text for p in read_prompts(prompts)]
        if not prompts:
            raise SpecgymError("live env: no prompts")
        self.prompts = list(prompts)
        self.req: LiveRequest | None = None

    def _pair_profile(self, draft: str, target: str) -> CostProfile:
        """The shipped measured profile of a shipped pair; for any other pair its costs measured now."""
        for name in DEFAULT_PAIRS:
            if _same_path(draft, MODELS_DIR / name / "draft") and _same_path(target, MODELS_DIR / name / "target"):
                shipped = pair_profile(name)
                if shipped is not None:
                    return load_profile(shipped)
        prof = measure_profile(self.pair, k_max=self.k_max, repeats=12, warmup=3, name="measured-now")
        warnings.warn(f"{self.config_name}: no profile for the pair {draft} / {target}: its costs were measured on "
                      f"this machine now (draft {prof.draft_ms:.2f} ms, verify {prof.verify_ms[0]:.2f} ms); pass "
                      "profile= to reuse a saved one", stacklevel=3)
        return prof

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Prefill a prompt; returns ``(observation, info)``."""
        super().reset(seed=seed)
        text = (options or {}).get("prompt")
        if text is None:
            text = self.prompts[int(self.np_random.integers(len(self.prompts)))]
        ids = encode_prompt(self.pair.tokenizer, text)
        sample_seed = int(self.np_random.integers(2**31))
        self.req = self.engine.start(ids, int(self.config["max_new_tokens"]), float(self.config["temperature"]),
                                     seed=sample_seed)
        self.tracker.reset(self.req.context)
        self.episode_time_ms = 0.0
        return self.tracker.observation(), {"position": 0, "length": self.req.length, "prompt": text}

    def step(self, action):
        """Run one live round with draft cap ``action``; returns the Gymnasium 5-tuple."""
        self._check_running(self.req is not None and not self.req.done)
        assert self.req is not None
        o = self.req.play(self._check_action(action))
        self.tracker.update(o)
        self.episode_time_ms += o.time_ms
        reward = self.round_reward(o, self.t_ar)
        info = {**self.round_info(o), "position": self.req.position, "length": self.req.length,
                "episode_time_ms": self.episode_time_ms, "tokens": list(self.req.result.tokens)}
        return self.tracker.observation(), float(reward), o.done, False, info

    def render(self) -> str | None:
        """ANSI: the completion so far."""
        if self.render_mode != "ansi" or self.req is None:
            return None
        return self.pair.tokenizer.decode(self.req.result.tokens)


def _same_path(a: str | Path, b: Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == b.resolve()
    except OSError:
        return False
