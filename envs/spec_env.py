"""Gymnasium environments: choose the speculation length of each round (or stop drafting token by token).

Two ids, registered by ``import specgym``:

* ``specgym/SpecDecode-v0`` (:class:`SpecDecodeEnv`): one action per round, the draft cap K.
* ``specgym/SpecDecodeToken-v0`` (:class:`SpecDecodeTokenEnv`): one action per draft token, continue or stop.

Both replay a workload trace with :class:`~specgym.envs.trace_engine.TraceEngine` and observe through
:class:`~specgym.envs.features.FeatureTracker`, the same code the exported controller runs in deployment.
Configuration follows HighwayEnv: ``default_config()`` lists every key, ``configure(dict)`` or keyword arguments
to ``gymnasium.make`` override them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from specgym.envs.cost import CostProfile, load_profile
from specgym.envs.features import FeatureTracker, feature_bounds, feature_table
from specgym.envs.rounds import RoundOutcome
from specgym.envs.trace_engine import ReplayRequest, TraceEngine, check_k_max
from specgym.envs.trace_format import Workload, load_workload, resolve_workload_path
from specgym.errors import SpecgymError
from specgym.paths import default_workload_name

_WORKLOAD_CACHE: dict[tuple[str, float], Workload] = {}


def cached_workload(name_or_path: str | Path) -> Workload:
    """Load a workload once per process (keyed by resolved path and modification time)."""
    path = resolve_workload_path(name_or_path).resolve()
    key = (str(path), path.stat().st_mtime)
    wl = _WORKLOAD_CACHE.get(key)
    if wl is None:
        wl = _WORKLOAD_CACHE[key] = load_workload(path)
    return wl


class _ReplayEnvBase(gym.Env):
    """Shared configuration, request sampling and reward bookkeeping of both replay environments."""

    metadata = {"render_modes": ["ansi"], "render_fps": 30}
    mode = "k"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Every configuration key with its default.

        Keys:
            workload: shipped workload name, path to a ``.parquet`` file, or a :class:`Workload` object.
            split: ``train``/``val``/``test``/``all``: which requests episodes draw from.
            profile: cost profile name/path/object; ``None`` = the workload's own.
            k_max: largest draft cap (1..16).
            k_min: smallest draft cap of the K-mode action space (0 allows plain autoregressive steps).
            outcome_seed: seed of the replayed acceptance draws (common random numbers); ``None`` draws fresh
                outcomes every episode from the env's ``np_random`` (only matters for sampled traces).
        """
        return {
            "workload": default_workload_name(),
            "split": "train",
            "profile": None,
            "k_max": 8,
            "k_min": 0,
            "outcome_seed": 0,
        }

    def __init__(self, config: dict[str, Any] | None = None, render_mode: str | None = None, **overrides: Any):
        self.config = self.default_config()
        self.configure(config or {})
        self.configure(overrides)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise SpecgymError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self._build()

    def configure(self, config: dict[str, Any]) -> None:
        """Override configuration keys (unknown keys are an error); call ``reset`` afterwards."""
        unknown = sorted(set(config) - set(self.default_config()))
        if unknown:
            raise SpecgymError(f"unknown env config key(s) {unknown}; valid: {sorted(self.default_config())}")
        self.config.update(config)
        if hasattr(self, "engine"):
            self._build()

    def _build(self) -> None:
        cfg = self.config
        wl = cfg["workload"]
        self.workload = wl if isinstance(wl, Workload) else cached_workload(wl)
        prof = cfg["profile"]
        profile = prof if isinstance(prof, CostProfile) or prof is None else load_profile(prof)
        self.k_max = check_k_max(cfg["k_max"])
        self.k_min = int(cfg["k_min"])
        if not 0 <= self.k_min <= self.k_max:
            raise SpecgymError(f"k_min must be in [0, k_max={self.k_max}], got {self.k_min}")
        seed = cfg["outcome_seed"]
        self.engine = TraceEngine(self.workload, profile, self.k_max, seed=0 if seed is None else int(seed))
        self.requests = self.workload.split_indices(cfg["split"])
        self._id_index = {rid: i for i, rid in enumerate(self.workload.request_id.tolist())}
        low, high = feature_bounds(self.mode)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self.tracker = FeatureTracker(self.k_max)
        self.t_ar = self.engine.t_ar
        self.req: ReplayRequest | None = None

    def _pick_request(self, options: dict[str, Any] | None) -> int:
        if options and "request" in options:
            sel = options["request"]
            if isinstance(sel, (int, np.integer)) and not isinstance(sel, bool):
                if not 0 <= sel < self.workload.n_requests:
                    raise SpecgymError(f"request index {sel} out of range [0, {self.workload.n_requests})")
                return int(sel)
            if sel not in self._id_index:
                raise SpecgymError(f"unknown request id {sel!r} in workload {self.workload.name!r}")
            return self._id_index[sel]
        return int(self.requests[self.np_random.integers(len(self.requests))])

    def _start(self, seed: int | None, options: dict[str, Any] | None) -> None:
        super().reset(seed=seed)
        r = self._pick_request(options)
        outcome_seed = self.config["outcome_seed"]
        if outcome_seed is None:
            outcome_seed = int(self.np_random.integers(2**31))
        self.req = self.engine.start(r, seed=outcome_seed)
        self.request_index = r
        self.tracker.reset(self.engine.context(r))
        self.episode_time_ms = 0.0
        self.episode_tokens = 0

    def _round_info(self, o: RoundOutcome) -> dict[str, Any]:
        self.tracker.update(o)
        self.episode_time_ms += o.time_ms
        self.episode_tokens += o.produced
        return {
            "planned_k": o.planned_k,
            "drafted": o.drafted,
            "accepted": o.accepted,
            "produced": o.produced,
            "time_ms": o.time_ms,
            "rewards": {"tokens": float(o.produced), "time": -o.time_ms / self.t_ar},
        }

    def _reward(self, o: RoundOutcome) -> float:
        return o.produced - o.time_ms / self.t_ar

    def _base_info(self) -> dict[str, Any]:
        return {
            "request": str(self.workload.request_id[self.request_index]),
            "position": self.req.position,
            "length": self.req.length,
            "episode_time_ms": self.episode_time_ms,
        }

    def render(self) -> str | None:
        """ANSI text: request, position and the time spent so far."""
        if self.render_mode != "ansi" or self.req is None:
            return None
        return (f"{self.workload.request_id[self.request_index]}: {self.req.position}/{self.req.length} tokens, "
                f"{self.episode_time_ms:.1f} ms")


class SpecDecodeEnv(_ReplayEnvBase):
    """Choose the draft length K of each speculative-decoding round.

    One episode is one request of the workload: the draft proposes up to K tokens, the target verifies them in one
    forward pass, and the episode terminates when the completion is fully produced (never truncated: every round
    produces at least one token). Replay follows REFERENCES sections 1-3 exactly.

    ## Action Space
    ``Discrete(k_max - k_min + 1, start=k_min)``: the draft cap K (default 0..8). K = 0 is a plain autoregressive
    target step. The engine clips K to ``N - i - 1`` near the end of a request and reports the clipped value.
    Stable-baselines3 needs ``start=0``: wrap with :class:`~specgym.envs.wrappers.SB3ActionWrapper`.

    ## Observation Space
    ``Box`` of float32 with finite bounds; every entry is computed from rounds already verified:

    {features}

    ## Rewards
    ``produced - time_ms / t_AR`` per round: tokens gained over plain decoding in the same time. The return of an
    episode is ``N - T / t_AR``, so maximising it minimises the request's total time ``T``. ``info["rewards"]``
    holds the two components (``tokens``, ``time``).

    ## Starting State
    Position 0 of a request drawn uniformly from the configured split with ``np_random``, or the one named by
    ``reset(options={{"request": id_or_index}})``.

    ## Info
    ``planned_k``, ``drafted``, ``accepted``, ``produced``, ``time_ms`` of the round (simulated, never wall
    clock), the reward components, and the request's id, position, length and elapsed simulated time.
    """

    mode = "k"

    def _build(self) -> None:
        super()._build()
        self.action_space = spaces.Discrete(self.k_max - self.k_min + 1, start=self.k_min)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new request; returns ``(observation, info)``."""
        self._start(seed, options)
        return self.tracker.observation(), self._base_info()

    def step(self, action):
        """Play one round with draft cap ``action``; returns the Gymnasium 5-tuple."""
        if self.req is None or self.req.done:
            raise SpecgymError("call reset() before step() (the episode is over)")
        o = self.req.play(int(action))
        info = self._round_info(o)
        info.update(self._base_info())
        return self.tracker.observation(), self._reward(o), o.done, False, info


class SpecDecodeTokenEnv(_ReplayEnvBase):
    """Decide after each draft token whether to keep drafting or to verify now.

    Same rounds, rewards and episodes as :class:`SpecDecodeEnv`, at token granularity. A decision is taken with
    ``j`` tokens drafted in the current round, ``j = 0 .. cap - 1`` (cap = min(k_max, N - i - 1)); stopping at
    ``j = 0`` is a plain autoregressive step, reaching the cap verifies automatically. Rounds where no draft is
    possible (the last token) are played automatically and their reward is added to the step that led there.

    ## Action Space
    ``Discrete(2)``: 0 = stop drafting and verify, 1 = draft one more token.

    ## Observation Space
    The round features of :class:`SpecDecodeEnv` (frozen at the round's start) followed by token features:

    {features}

    ``tok_room`` uses cap = k_max at the first decision of a round (a deployed controller learns the clipped cap
    only with the first draft token).

    ## Rewards
    ``produced - time_ms / t_AR`` at each verification; 0 for decisions that continue drafting.

    ## Info
    As :class:`SpecDecodeEnv`; round fields are present on steps that verified a round (``verified`` is True).
    """

    mode = "token"

    def _build(self) -> None:
        super()._build()
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new request; returns ``(observation, info)`` at the first decision."""
        self._start(seed, options)
        self._auto_reward = 0.0
        self._begin_round()
        return self._obs(), self._base_info()

    def _begin_round(self) -> None:
        """Open a round; play forced K = 0 rounds (no room to draft) without asking."""
        req = self.req
        while not req.done and req.clip(self.k_max) == 0:
            o = req.verify(0, 0)
            self._round_info(o)
            self._auto_reward += self._reward(o)
        self._cap = req.clip(self.k_max) if not req.done else 0
        self._drafted = 0
        self._conf = self._ent = 0.0
        self._prod = self._min = 1.0

    def _obs(self) -> np.ndarray:
        # Before the first draft token a deployed controller cannot know how close the end is (the cap it will
        # be clipped to), so the first decision sees cap = k_max; later ones see the engine's clipped cap.
        cap = self._cap if self._drafted > 0 else self.k_max
        return self.tracker.token_observation(self._drafted, cap, self._conf, self._ent, self._prod, self._min)

    def step(self, action):
        """Continue (1) or stop (0); returns the Gymnasium 5-tuple."""
        if self.req is None or self.req.done:
            raise SpecgymError("call reset() before step() (the episode is over)")
        if int(action) == 1:
            self._drafted += 1
            c, e = self.req.draft_features(self.req.position + self._drafted - 1)
            self._conf, self._ent = c, e
            self._prod *= c
            self._min = min(self._min, c)
            if self._drafted < self._cap:
                info = self._base_info()
                info["verified"] = False
                return self._obs(), 0.0, False, False, info
        # A stop before the first draft token is a plain autoregressive step (K = 0), as a deployed controller
        # would report it; otherwise the round's cap is the engine's clipped k_max.
        o = self.req.verify(self._cap if self._drafted > 0 else 0, self._drafted)
        info = self._round_info(o)
        reward = self._reward(o) + self._auto_reward
        self._auto_reward = 0.0
        self._begin_round()
        reward += self._auto_reward
        self._auto_reward = 0.0
        info.update(self._base_info())
        info["verified"] = True
        return self._obs(), reward, self.req.done, False, info


SpecDecodeEnv.__doc__ = SpecDecodeEnv.__doc__.format(features=feature_table("k").replace("\n", "\n    "))
SpecDecodeTokenEnv.__doc__ = SpecDecodeTokenEnv.__doc__.format(
    features=feature_table("token").replace("\n", "\n    ")
)
