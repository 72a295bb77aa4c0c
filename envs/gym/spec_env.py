"""Gymnasium environments: choose the speculation length of each round (or stop drafting token by token).

Two ids, registered by ``import specgym``:

* ``specgym/SpecDecode-v1`` (:class:`SpecDecodeEnv`): one action per round, the draft cap K.
* ``specgym/SpecDecodeToken-v1`` (:class:`SpecDecodeTokenEnv`): one action per draft token, continue or stop.

Both replay a workload trace with :class:`~specgym.envs.engines.replay.trace_engine.TraceEngine` and observe through
:class:`~specgym.envs.core.features.FeatureTracker` (token mode also through
:class:`~specgym.envs.core.features.TokenDecisionState`), the same code the exported controller runs in deployment.
Configuration follows HighwayEnv: ``default_config()`` lists every key, ``configure(dict)`` or keyword arguments
to ``gymnasium.make`` override them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

import specgym.catalogue as catalogue
from specgym.envs.core.acceptance_predictor import AcceptancePredictor, SignalSource, load_predictor
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.features import FeatureTracker, feature_bounds, feature_table
from specgym.envs.core.kinds import TOKEN_LEVEL_MODES
from specgym.envs.core.rounds import DEFAULT_K_MAX, RoundOutcome, check_k_max
from specgym.envs.core.token_protocol import TokenProtocol
from specgym.envs.engines.replay.trace_engine import ReplayRequest, TraceEngine
from specgym.envs.gym.config import check_reset_options, int_key, source_key, update_config
from specgym.envs.gym.shell import EnvShell
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.domains import DomainDistribution, generalist_domains
from specgym.envs.workloads.trace_format import SPLITS, Workload, cached_workload
from specgym.errors import SpecgymError
from specgym.paths import MODEL_ROOTS, default_workload_name


class _ReplayEnvBase(EnvShell):
    """Shared configuration, request sampling and reward bookkeeping of the replay environments."""

    metadata = {"render_modes": ["ansi"], "render_fps": 30}
    mode = "k"
    #: The observation reads the draft's confidence and entropy: a workload without them is refused at once (its
    #: observations would be NaN, and a policy trained on NaN learns nothing a validation could rescue).
    reads_draft_signals = True

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
            domains: a :class:`~specgym.envs.workloads.domains.DomainDistribution`: every episode draws its own
                workload and cost profile from it (domain randomisation; ``workload`` and ``profile`` are then
                unused, requests still come from ``split``).
            predictor: token mode: an acceptance predictor (shipped name, ``.json`` path or
                :class:`~specgym.envs.core.acceptance_predictor.AcceptancePredictor`) whose probability of each
                draft token becomes its acceptance estimate where the trace carries the predictor's signals
                (``tok_predicted`` = 1); ``None`` = calibrated confidence. K mode: must be ``None``.
        """
        return {
            "workload": default_workload_name(),
            "split": "train",
            "profile": None,
            "k_max": DEFAULT_K_MAX,
            "k_min": 0,
            "outcome_seed": 0,
            "domains": None,
            "predictor": None,
        }

    def __init__(self, config: dict[str, Any] | None = None, render_mode: str | None = None, **overrides: Any):
        self._merge_config(config, overrides, render_mode)
        self._build()

    def configure(self, config: dict[str, Any]) -> None:
        """Override configuration keys (unknown keys are an error); call ``reset`` afterwards."""
        update_config(self.config, config)
        if hasattr(self, "engine"):
            self._build()

    def _build(self) -> None:
        cfg = self.config
        self.k_max = check_k_max(int_key(cfg, "k_max", -(2**62)))
        self.k_min = int(int_key(cfg, "k_min") or 0)
        if not 0 <= self.k_min <= self.k_max:
            raise SpecgymError(f"k_min must be in [0, k_max={self.k_max}], got {self.k_min}")
        int_key(cfg, "outcome_seed", allow_none=True)
        if cfg["split"] not in (*SPLITS, "all"):
            raise SpecgymError(f"env config split: expected one of {[*SPLITS, 'all']}, got {cfg['split']!r}")
        if cfg["domains"] == "generalist":  # the shipped training distribution, by name
            cfg["domains"] = generalist_domains()
        source_key(cfg, "workload", (Workload,))
        source_key(cfg, "profile", (CostProfile,), allow_none=True)
        self.domains = cfg["domains"]
        if self.domains is not None and not isinstance(self.domains, DomainDistribution):
            raise SpecgymError(f"env config domains: expected None, 'generalist' or a DomainDistribution, got "
                               f"{self.domains!r}")
        if self.domains is not None:
            self._use(self.domains.workloads[0], None)
        else:
            wl = cfg["workload"]
            prof = cfg["profile"]
            self._use(wl if isinstance(wl, Workload) else cached_workload(wl),
                      prof if isinstance(prof, CostProfile) or prof is None else load_profile(prof))
        self.predictor = self._load_predictor(cfg["predictor"])
        low, high = feature_bounds(self.mode)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self.tracker = FeatureTracker(self.k_max)
        self.req: ReplayRequest | None = None

    def _load_predictor(self, spec: Any) -> AcceptancePredictor | None:
        if spec is None or isinstance(spec, AcceptancePredictor):
            pred = spec
        elif isinstance(spec, str):
            pred = load_predictor(catalogue.resolve("predictor", spec))
        else:
            raise SpecgymError(f"env config predictor: expected None, a predictor name or path, or an "
                               f"AcceptancePredictor, got {spec!r}")
        if pred is not None and self.mode not in TOKEN_LEVEL_MODES:
            raise SpecgymError(f"env config predictor: only the token-mode env reads an acceptance predictor "
                               f"(this is {self.mode} mode)")
        if pred is not None:  # another pair's predictor is refused (a fallback keeps predicting per step)
            for wl in self.domains.workloads if self.domains is not None else [self.workload]:
                pred.for_source(SignalSource.of_workload(wl, MODEL_ROOTS))
        return pred

    def _use(self, workload: Workload, profile: CostProfile | None) -> None:
        """Replay ``workload`` priced with ``profile`` (None = its own) from now on."""
        seed = self.config["outcome_seed"]
        if self.reads_draft_signals and (workload.draft_conf is None or workload.draft_entropy is None):
            raise SpecgymError(f"workload {workload.name!r} has no draft confidence or entropy ({workload.trace_kind} "
                               f"trace, e.g. published per-start runs), which the {type(self).__name__} observation "
                               "reads: train --mode drafter on it, or record a trace with draft signals")
        self.workload = workload
        self.engine = TraceEngine(workload, profile, self.k_max, seed=0 if seed is None else int(seed))
        self.requests = workload.split_indices(self.config["split"])
        if len(self.requests) == 0:
            raise SpecgymError(f"workload {workload.name!r} has no requests in split {self.config['split']!r}")
        self._id_index: dict[str, int] | None = None
        self.t_ar = self.engine.t_ar

    def _pick_request(self, options: dict[str, Any] | None) -> int:
        check_reset_options(options, ("request",))
        if options and "request" in options:
            if self.domains is not None:
                raise SpecgymError("reset(options={'request': ...}) needs a fixed workload (domains is set)")
            sel = options["request"]
            if isinstance(sel, (int, np.integer)) and not isinstance(sel, bool):
                if not 0 <= sel < self.workload.n_requests:
                    raise SpecgymError(f"request index {sel} out of range [0, {self.workload.n_requests})")
                return int(sel)
            if self._id_index is None:
                self._id_index = {rid: i for i, rid in enumerate(self.workload.request_id.tolist())}
            if sel not in self._id_index:
                raise SpecgymError(f"unknown request id {sel!r} in workload {self.workload.name!r}")
            return self._id_index[sel]
        return int(self.requests[self.np_random.integers(len(self.requests))])

    def _start(self, seed: int | None, options: dict[str, Any] | None) -> None:
        super().reset(seed=seed)
        if self.domains is not None:
            self._use(*self.domains.sample(self.np_random))
        r = self._pick_request(options)
        outcome_seed = self.config["outcome_seed"]
        if outcome_seed is None:
            outcome_seed = int(self.np_random.integers(2**31))
        self.req = self.engine.start(r, seed=outcome_seed)
        self.request_index = r
        self._request_id = str(self.workload.request_id[r])
        self.tracker.reset(self.req.context)
        self.episode_time_ms = 0.0
        self.episode_tokens = 0

    def _round_info(self, o: RoundOutcome) -> dict[str, Any]:
        self.tracker.update(o)
        self.episode_time_ms += o.time_ms
        self.episode_tokens += o.produced
        return {**self.round_info(o), "rewards": {"tokens": float(o.produced), "time": -o.time_ms / self.t_ar}}

    def _reward(self, o: RoundOutcome) -> float:
        return self.round_reward(o, self.t_ar)

    def _base_info(self) -> dict[str, Any]:
        assert self.req is not None
        return {
            "request": self._request_id,
            "position": self.req.position,
            "length": self.req.length,
            "episode_time_ms": self.episode_time_ms,
            "t_ar_ms": self.t_ar,
        }

    def render(self) -> str | None:
        """ANSI text: request, position and the time spent so far."""
        if self.render_mode != "ansi" or self.req is None:
            return None
        return (f"{self._request_id}: {self.req.position}/{self.req.length} tokens, "
                f"{self.episode_time_ms:.1f} ms")


class SpecDecodeEnv(_ReplayEnvBase):
    """Choose the draft length K of each speculative-decoding round.

    ## Description
    A small draft model proposes up to K tokens, the large target verifies them in one forward pass, and the round
    produces the accepted prefix plus one token of the target's own. The environment replays a workload trace
    (recorded from a real draft/target pair, or synthetic) under a hardware cost profile: the agent chooses K each
    round and pays the round's time. One episode is one request.

    ## Action Space
    ``Discrete(k_max - k_min + 1, start=k_min)``: the draft cap K (default 0..8). K = 0 is a plain autoregressive
    target step. The engine clips K to ``N - i - 1`` near the end of a request and reports the clipped value. An
    action outside the space (``9``, ``-1``, ``2.7``) raises :class:`~specgym.errors.InvalidAction`.
    Stable-baselines3 needs ``start=0``: wrap with :class:`~specgym.envs.gym.wrappers.SB3ActionWrapper`.

    ## Observation Space
    ``Box`` of float32 with finite bounds; every entry is computed from rounds already verified (never the
    completion length or a future outcome):

    {features}

    ## Rewards
    ``produced - time_ms / t_AR`` per round: tokens gained over plain decoding in the same time. The return of an
    episode is ``N - T / t_AR``, so maximising it minimises the request's total time ``T``. ``info["rewards"]``
    holds the two components (``tokens``, ``time``).

    ## Starting State
    Position 0 of a request drawn uniformly from the configured split with ``np_random``, or the one named by
    ``reset(options={{"request": id_or_index}})``.

    ## Episode End
    Terminates when the request's completion is fully produced. Never truncated: every round produces at least
    one token, so an episode of an N-token request lasts at most N steps.

    ## Arguments
    ``gymnasium.make("specgym/SpecDecode-v1", **config)`` or ``SpecDecodeEnv(config, render_mode=...)`` with the
    keys of :meth:`default_config` (``workload``, ``split``, ``profile``, ``k_max``, ``k_min``, ``outcome_seed``);
    ``configure(dict)`` changes them later (call ``reset`` afterwards). ``render_mode="ansi"`` renders text.

    ## Info
    ``planned_k``, ``drafted``, ``accepted``, ``produced``, ``time_ms`` of the round (simulated, never wall
    clock), the reward components, the request's id, position, length and elapsed simulated time, and the
    episode's ``t_ar_ms``.

    ## Version History
    * v1: feature version 3 (online-calibration and cost features); invalid actions raise instead of being clipped.
    * v0: initial release (feature versions 1 and 2).
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
        self._check_running(self.req is not None and not self.req.done)
        o = self.req.play(self._check_action(action))
        info = self._round_info(o)
        info.update(self._base_info())
        return self.tracker.observation(), self._reward(o), o.done, False, info


class SpecDecodeTokenEnv(_ReplayEnvBase):
    """Decide after each draft token whether to keep drafting or to verify now.

    ## Description
    The rounds, rewards and episodes of :class:`SpecDecodeEnv` at token granularity. A decision is taken with
    ``j`` tokens drafted in the current round, ``j = 0 .. cap - 1`` (cap = min(k_max, N - i - 1)); stopping at
    ``j = 0`` is a plain autoregressive step, reaching the cap verifies automatically. Rounds where no draft is
    possible (the last token) are played automatically and their reward is added to the step that led there; a
    request with no room to draft at all (one token) is played whole by ``reset()`` and its one step (any valid
    action) ends the episode with that reward.

    ## Action Space
    ``Discrete(2)``: 0 = stop drafting and verify, 1 = draft one more token. Anything else raises
    :class:`~specgym.errors.InvalidAction`.

    ## Observation Space
    The round features of :class:`SpecDecodeEnv` (frozen at the round's start) followed by token features:

    {features}

    ``tok_room`` uses cap = k_max at the first decision of a round (a deployed controller learns the clipped cap
    only with the first draft token).

    ## Rewards
    ``produced - time_ms / t_AR`` at each verification; 0 for decisions that continue drafting.

    ## Starting State
    As :class:`SpecDecodeEnv`: the first decision (``j = 0``) of a request's first round.

    ## Episode End
    Terminates when the request's completion is fully produced; never truncated.

    ## Arguments
    As :class:`SpecDecodeEnv` (``gymnasium.make("specgym/SpecDecodeToken-v1", **config)``).

    ## Info
    As :class:`SpecDecodeEnv`; round fields are present on steps that verified a round (``verified`` is True).

    ## Version History
    * v1: feature version 4 (``tok_predicted``; config key ``predictor``); version 3 before; invalid actions
      raise (v0 treated any nonzero action other than 1 as "stop").
    * v0: initial release (feature versions 1 and 2).
    """

    mode = "token"

    def _build(self) -> None:
        super()._build()
        self.action_space = spaces.Discrete(2)
        self.protocol = TokenProtocol(self.tracker, self.k_max, self.predictor)
        self.decisions = self.protocol.decisions
        self._done_at_reset = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new request; returns ``(observation, info)`` at the first decision."""
        self._start(seed, options)
        self.protocol.temperature = float(self.req.context.temperature) if self.req is not None else 0.0
        self._auto_reward = 0.0
        self._begin_round()
        assert self.req is not None
        self._done_at_reset = self.req.done
        return self.decisions.observation(), self._base_info()

    def _begin_round(self) -> None:
        """Open a round; play forced K = 0 rounds (no room to draft) without asking."""
        req = self.req
        assert req is not None
        while not req.done and req.clip(self.k_max) == 0:
            o = req.verify(0, 0)
            self._auto_info = self._round_info(o)
            self._auto_reward += self._reward(o)
        self._cap = req.clip(self.k_max) if not req.done else 0
        self.decisions.begin_round()

    def step(self, action):
        """Continue (1) or stop (0); returns the Gymnasium 5-tuple."""
        if self._done_at_reset:  # the request was played whole by reset(): this step reports it and ends
            self._check_action(action)
            self._done_at_reset = False
            info = {**self._auto_info, **self._base_info(), "verified": True}
            reward, self._auto_reward = self._auto_reward, 0.0
            return self.decisions.observation(), reward, True, False, info
        self._check_running(self.req is not None and not self.req.done)
        dec = self.decisions
        if self._check_action(action) == 1:
            j = dec.drafted + 1
            self.protocol.fold(self.req.draft_step(j, self._cap))
            if j < self._cap:
                info = self._base_info()
                info["verified"] = False
                return dec.observation(), 0.0, False, False, info
        # A stop before the first draft token is a plain autoregressive step (K = 0), as a deployed controller
        # would report it; otherwise the round's cap is the engine's clipped k_max.
        o = self.req.verify(self._cap if dec.drafted > 0 else 0, dec.drafted)
        info = self._round_info(o)
        reward = self._reward(o) + self._auto_reward
        self._auto_reward = 0.0
        self._begin_round()
        reward += self._auto_reward
        self._auto_reward = 0.0
        info.update(self._base_info())
        info["verified"] = True
        return dec.observation(), reward, self.req.done, False, info


SpecDecodeEnv.__doc__ = (SpecDecodeEnv.__doc__ or "").format(features=feature_table("k").replace("\n", "\n    "))
SpecDecodeTokenEnv.__doc__ = (SpecDecodeTokenEnv.__doc__ or "").format(
    features=feature_table("token").replace("\n", "\n    ")
)
