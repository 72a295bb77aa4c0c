"""What a drafter-choice policy observes, and how its action index maps to a (drafter, K) decision.

One feature code for the env (``specgym/SpecDecodeDrafter-v0``), the exported policy
(:class:`~specgym.agents.drafter_policy.DrafterPolicyController`) and the harness: :class:`DrafterFeatureTracker`
turns the :class:`~specgym.envs.core.rounds.RoundStart` before a round and the verified rounds so far into a fixed
vector (:data:`DRAFTER_FEATURE_NAMES`, feature version :data:`DRAFTER_FEATURE_VERSION`). Three drafter slots: the
engine's first three drafters, in its order (the default first: a draft model, prompt lookup, a draft head on the
target's hidden state); a workload with fewer drafters leaves the other slots unused (their actions are plain
steps).

**Actions** (:func:`decision_of`): ``Discrete(1 + 3 * k_max)``: 0 is a plain step, ``1 + s * k_max + (K - 1)``
drafts ``K`` (1..k_max) tokens with the drafter of slot ``s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterDecision
from specgym.envs.core.rounds import RequestContext, RoundOutcome, RoundStart
from specgym.envs.core.run_predictor import RECENT_BUCKETS, RECENT_DRAFTERS, recent_code

#: Bump when a feature's meaning or scaling changes (2: a third drafter slot).
DRAFTER_FEATURE_VERSION = 2
#: Drafter slots of the observation and the action space (the drafters with recent-round codes).
SLOTS = RECENT_DRAFTERS
#: Exponential-average weight of each verified round in a slot's recent acceptance.
EMA = 0.3

DRAFTER_FEATURE_NAMES: tuple[str, ...] = (
    *(f"lookup_{n}" for n in ("0", "1", "2", "3", "4", "unknown")),
    "log_position",
    "log_kv",
    *(f"last_round_{c}" for c in range(RECENT_BUCKETS)),
    *(f"{what}_{s}" for s in range(SLOTS) for what in ("accept_rate", "accepted_per_k", "rounds_since")),
)


def n_actions(k_max: int) -> int:
    """Size of the drafter-choice action space."""
    return 1 + SLOTS * k_max


def decision_of(action: int, drafters: Sequence[str], k_max: int) -> DrafterDecision:
    """The decision of an action index (module docstring); a slot the engine lacks is a plain step."""
    if action <= 0:
        return DrafterDecision(NO_DRAFTER, 0)
    slot, k = divmod(int(action) - 1, k_max)
    return DrafterDecision(drafters[slot], k + 1) if slot < len(drafters) else DrafterDecision(NO_DRAFTER, 0)


def action_of(dec: DrafterDecision, drafters: Sequence[str], k_max: int) -> int:
    """The action index of a decision (the inverse of :func:`decision_of`; behaviour cloning)."""
    if dec.plain:
        return 0
    return 1 + list(drafters).index(dec.drafter) * k_max + min(dec.k, k_max) - 1


def feature_bounds() -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` of every feature (all in [0, 1])."""
    n = len(DRAFTER_FEATURE_NAMES)
    return np.zeros(n, np.float32), np.ones(n, np.float32)


class DrafterFeatureTracker:
    """The observation of a drafter-choice policy, updated round by round."""

    def __init__(self, k_max: int) -> None:
        self.k_max = int(k_max)
        self._obs = np.zeros(len(DRAFTER_FEATURE_NAMES), np.float32)
        self.drafters: tuple[str, ...] = ()
        self.reset(None, ())

    def reset(self, ctx: RequestContext | None, drafters: Sequence[str] = ()) -> None:
        """Start a request served by ``drafters``."""
        self.drafters = tuple(drafters)[:SLOTS]
        self._slot = {d: i for i, d in enumerate(self.drafters)}
        self._recent = 0
        self._rate = [0.5] * SLOTS
        self._acc = [0.0] * SLOTS
        self._since = [0] * SLOTS
        self._rounds = 0

    def update(self, o: RoundOutcome) -> None:
        """Learn a verified round."""
        name = o.drafter or (self.drafters[0] if self.drafters else "")  # None: the engine's default drafter
        s = self._slot.get(name, -1) if o.drafted else -1
        self._recent = recent_code(s, o.drafted, o.accepted)
        self._since = [n + 1 for n in self._since]
        if s >= 0:
            self._rate[s] = (1 - EMA) * self._rate[s] + EMA * (o.accepted / o.drafted)
            self._acc[s] = (1 - EMA) * self._acc[s] + EMA * (o.accepted / self.k_max)
            self._since[s] = 0

    def observation(self, start: RoundStart) -> np.ndarray:
        """The feature vector before the round at ``start``."""
        obs = self._obs
        obs[:] = 0.0
        lk = 5 if start.lookup_len < 0 else min(start.lookup_len, 4)
        obs[lk] = 1.0
        obs[6] = min(math.log1p(start.position) / math.log1p(8192), 1.0)
        obs[7] = min(math.log1p(start.kv) / math.log1p(32768), 1.0)
        obs[8 + self._recent] = 1.0
        base = 8 + RECENT_BUCKETS
        for s in range(SLOTS):
            obs[base + 3 * s] = self._rate[s]
            obs[base + 3 * s + 1] = min(self._acc[s], 1.0)
            obs[base + 3 * s + 2] = min(self._since[s], 16) / 16.0
        return obs.copy()
