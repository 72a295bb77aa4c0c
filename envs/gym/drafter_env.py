"""``specgym/SpecDecodeDrafter-v0``: choose the drafter and the draft cap of each round."""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from specgym.envs.core.drafter_features import (
    DRAFTER_FEATURE_NAMES,
    DrafterFeatureTracker,
    decision_of,
    feature_bounds,
    n_actions,
)
from specgym.envs.gym.spec_env import _ReplayEnvBase
from specgym.errors import SpecgymError


class SpecDecodeDrafterEnv(_ReplayEnvBase):
    """Choose which drafter proposes each round, and how many tokens.

    ## Description
    An engine with two drafters (SpecDecode-Bench: an EAGLE head and vLLM's n-gram proposer) picks, before each
    round, the drafter and the draft cap K; the round replays that drafter's per-start runs exactly (format v3:
    ``min(run_d[g], K) + 1`` tokens) at that drafter's cost (:mod:`specgym.envs.core.drafter_choice`). One episode
    is one request. The workload must hold two or more drafters (the first three are the action slots).

    ## Action Space
    ``Discrete(1 + 3 * k_max)``: 0 = a plain target step; ``1 + s * k_max + (K - 1)`` = drafter slot ``s`` (the
    workload's drafters in order, the default first) with cap ``K`` in 1..k_max
    (:func:`~specgym.envs.core.drafter_features.decision_of`). Anything else raises
    :class:`~specgym.errors.InvalidAction`.

    ## Observation Space
    ``Box(0, 1)`` of float32, :class:`~specgym.envs.core.drafter_features.DrafterFeatureTracker` at
    :data:`~specgym.envs.core.drafter_features.DRAFTER_FEATURE_VERSION` (the code the exported policy runs): the
    context lookup (one-hot), log position and KV cache, the previous round's outcome (one-hot), per drafter slot its
    recent acceptance rate, accepted tokens per k_max and rounds since it last drafted, then per slot the online
    features read off the rounds' free counterfactual outcomes (greedy requests: what prompt lookup would have had
    accepted where it did not play; they stay at 0 at T > 0).

    ## Rewards
    ``produced - time_ms / t_AR`` per round, as the chain environments (``info["rewards"]`` holds the parts).

    ## Starting State
    Position 0 of a request drawn uniformly from the configured split, or ``reset(options={"request": ...})``.

    ## Episode End
    Terminates when the completion is fully produced; never truncated.

    ## Arguments
    ``gymnasium.make("specgym/SpecDecodeDrafter-v0", **config)``: the keys of the chain env (``k_min`` and
    ``predictor`` unused; ``domains`` unsupported).

    ## Info
    ``drafter``, ``planned_k``, ``drafted``, ``accepted``, ``produced``, ``time_ms``, the reward parts, request,
    position, length, elapsed time and ``t_ar_ms``.

    ## Version History
    * v0: initial release (drafter feature version 1); drafter feature version 3 (the per-slot online features
      appended: the observation grows by 9) since issue 54.
    """

    mode = "k"
    reads_draft_signals = False  # lookup, position and per-drafter outcomes only
    features = DRAFTER_FEATURE_NAMES

    def _build(self) -> None:
        super()._build()
        if self.domains is not None:
            raise SpecgymError("SpecDecodeDrafter-v0 does not support domains (one workload with its drafters)")
        self.drafters = tuple(self.workload.drafter_names)
        if len(self.drafters) < 2:
            raise SpecgymError(f"SpecDecodeDrafter-v0: workload {self.workload.name!r} holds one drafter "
                               f"({self.drafters[0]}); drafter choice needs two (a per-start trace such as an "
                               f"imported SpecDecode-Bench file)")
        low, high = feature_bounds()
        self.observation_space = spaces.Box(low, high, dtype=low.dtype)
        self.action_space = spaces.Discrete(n_actions(self.k_max))
        self.tracker = DrafterFeatureTracker(self.k_max)  # type: ignore[assignment]

    def _start(self, seed: int | None, options: dict[str, Any] | None) -> None:
        super()._start(seed, options)
        assert self.req is not None
        self.tracker.reset(self.req.context, self.drafters)  # type: ignore[call-arg]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new request; returns ``(observation, info)``."""
        self._start(seed, options)
        assert self.req is not None
        return self.tracker.observation(self.req.round_start()), self._base_info()  # type: ignore[call-arg]

    def step(self, action):
        """Play one round with the decision of ``action``; returns the Gymnasium 5-tuple."""
        req = self.req
        self._check_running(req is not None and not req.done)
        assert req is not None
        dec = decision_of(self._check_action(action), self.drafters, self.k_max)
        o = req.play(0) if dec.plain else req.play(dec.k, None, drafter=dec.drafter)
        info = self._round_info(o)
        info["drafter"] = o.drafter if o.drafted else "none"
        info.update(self._base_info())
        return self.tracker.observation(req.round_start()), self._reward(o), o.done, False, info  # type: ignore

