"""What a drafter-choice policy observes, and how its action index maps to a (drafter, K) decision.

One feature code for the env (``specgym/SpecDecodeDrafter-v0``), the exported policy
(:class:`~specgym.agents.drafter_policy.DrafterPolicyController`) and the harness: :class:`DrafterFeatureTracker`
turns the :class:`~specgym.envs.core.rounds.RoundStart` before a round and the verified rounds so far into a fixed
vector (:func:`drafter_feature_names` of a feature version; new training uses :data:`DRAFTER_FEATURE_VERSION`, and
a policy exported at an older version in :data:`DRAFTER_FEATURE_VERSIONS` is served the vector it was trained on).
Three drafter slots: the engine's first three drafters, in its order (the default first: a draft model, prompt
lookup, a draft head on the target's hidden state); a workload with fewer drafters leaves the other slots unused
(their actions are plain steps).

**Features** (every one in [0, 1]). Version 2: the context lookup at the round's start (one-hot of 0..4 and
unknown), log position and log KV cache, the previous round's outcome (one-hot,
:func:`~specgym.envs.core.run_predictor.recent_code`), and per slot, from the rounds that slot drafted, its
acceptance-rate EMA (``accept_rate``, 0.5 before any), its accepted tokens per ``k_max`` EMA (``accepted_per_k``)
and the rounds since it last drafted (``rounds_since``, ``/16``, capped).

Version 3 is version 2 unchanged, in the same order, followed per slot by three **online** features read off the
free counterfactual outcomes the rounds carry (:attr:`~specgym.envs.core.rounds.RoundOutcome.counterfactual`: in
greedy decoding, after every round the verified tokens say how many of prompt lookup's (and, where an engine
reports it, the head's) proposal from the round's start would have been accepted, censored at the round's produced
tokens; a drafter that played is never its own counterfactual). They let a policy notice what a drafter it is not
playing would be doing on this request (prompt lookup matching 4 tokens a round while the head plays), as
:mod:`~specgym.baselines.drafter_online` does:

* ``cf_run_s``: EMA (weight :data:`EMA`) of the slot's counterfactual run ``/ k_max`` (capped at 1). Censored at
  the round's produced tokens, so a lower bound of what it would have accepted uncapped.
* ``cf_atleast_s``: EMA of "the counterfactual run reached the round's produced tokens" (``run >= produced``: the
  censoring's "at least", i.e. its round would have produced more than the round that played).
* ``cf_seen_s``: EMA, over every round, of "the round carried the slot's counterfactual": how often the slot is
  judged for free (prompt lookup is absent where it had nothing to propose and on the rounds it played itself).

``cf_run_s`` and ``cf_atleast_s`` move only on rounds whose counterfactual names the slot (a round without one says
nothing about it: it is not a rejection); ``cf_seen_s`` moves every round. All three start at 0.0, their neutral
value. At T > 0 (and on an engine or trace that reports no counterfactual, or a slot that is never one: the default
drafter) no round carries one, so they stay at 0.0 the whole request.

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
from specgym.errors import SpecgymError

#: Bump when a feature's meaning or scaling changes (2: a third drafter slot; 3: the per-slot online features).
DRAFTER_FEATURE_VERSION = 3
#: Feature versions an exported drafter policy may carry and still run (each is served its own vector).
DRAFTER_FEATURE_VERSIONS = (2, 3)
#: Drafter slots of the observation and the action space (the drafters with recent-round codes).
SLOTS = RECENT_DRAFTERS
#: Exponential-average weight of each verified round in a slot's recent acceptance (and of each counterfactual).
EMA = 0.3

_V2_NAMES: tuple[str, ...] = (
    *(f"lookup_{n}" for n in ("0", "1", "2", "3", "4", "unknown")),
    "log_position",
    "log_kv",
    *(f"last_round_{c}" for c in range(RECENT_BUCKETS)),
    *(f"{what}_{s}" for s in range(SLOTS) for what in ("accept_rate", "accepted_per_k", "rounds_since")),
)
#: The per-slot online features version 3 appends (module docstring), in slot order.
ONLINE_FEATURE_NAMES: tuple[str, ...] = tuple(f"{what}_{s}" for s in range(SLOTS)
                                              for what in ("cf_run", "cf_atleast", "cf_seen"))
#: The features of :data:`DRAFTER_FEATURE_VERSION` (what the env observes).
DRAFTER_FEATURE_NAMES: tuple[str, ...] = _V2_NAMES + ONLINE_FEATURE_NAMES


def check_drafter_feature_version(version: int) -> int:
    """``version`` where this specgym computes it; else one line naming it and the versions it computes."""
    if version not in DRAFTER_FEATURE_VERSIONS:
        raise SpecgymError(f"drafter feature version {version!r} is not computed here (versions "
                           f"{', '.join(map(str, DRAFTER_FEATURE_VERSIONS))}): retrain and re-export the policy")
    return int(version)


def drafter_feature_names(version: int = DRAFTER_FEATURE_VERSION) -> list[str]:
    """The ordered features of a drafter policy of feature ``version``."""
    return list(_V2_NAMES if check_drafter_feature_version(version) == 2 else DRAFTER_FEATURE_NAMES)


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


def feature_bounds(version: int = DRAFTER_FEATURE_VERSION) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` of every feature of ``version`` (all in [0, 1])."""
    n = len(drafter_feature_names(version))
    return np.zeros(n, np.float32), np.ones(n, np.float32)


class DrafterFeatureTracker:
    """The observation of a drafter-choice policy, updated round by round.

    Args:
        k_max: The policy's largest draft cap (the scale of the accepted-token features).
        version: The feature version to observe (:data:`DRAFTER_FEATURE_VERSIONS`): a version-2 policy is served
            exactly the version-2 vector, which is the prefix of version 3's.
    """

    def __init__(self, k_max: int, version: int = DRAFTER_FEATURE_VERSION) -> None:
        self.k_max = int(k_max)
        self.version = check_drafter_feature_version(version)
        self.names = drafter_feature_names(self.version)
        self._obs = np.zeros(len(self.names), np.float32)
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
        self._cf_run = [0.0] * SLOTS
        self._cf_atleast = [0.0] * SLOTS
        self._cf_seen = [0.0] * SLOTS

    def update(self, o: RoundOutcome) -> None:
        """Learn a verified round (the drafter that played; version 3: the counterfactuals it carries)."""
        name = o.drafter or (self.drafters[0] if self.drafters else "")  # None: the engine's default drafter
        s = self._slot.get(name, -1) if o.drafted else -1
        self._recent = recent_code(s, o.drafted, o.accepted)
        self._since = [n + 1 for n in self._since]
        if s >= 0:
            self._rate[s] = (1 - EMA) * self._rate[s] + EMA * (o.accepted / o.drafted)
            self._acc[s] = (1 - EMA) * self._acc[s] + EMA * (o.accepted / self.k_max)
            self._since[s] = 0
        if self.version >= 3:
            self._update_online(o, name if o.drafted else None)

    def _update_online(self, o: RoundOutcome, played: str | None) -> None:
        """The online features' part of a round: each named slot's counterfactual run, and who was judged."""
        seen = [0.0] * SLOTS
        for d, run in o.counterfactual:
            c = self._slot.get(d, -1)
            if c < 0 or d == played or seen[c]:
                continue
            seen[c] = 1.0
            self._cf_run[c] = (1 - EMA) * self._cf_run[c] + EMA * min(run / self.k_max, 1.0)
            self._cf_atleast[c] = (1 - EMA) * self._cf_atleast[c] + EMA * float(run >= o.produced)
        self._cf_seen = [(1 - EMA) * f + EMA * x for f, x in zip(self._cf_seen, seen)]

    def observation(self, start: RoundStart) -> np.ndarray:
        """The feature vector (of the tracker's version) before the round at ``start``."""
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
        if self.version >= 3:
            base += 3 * SLOTS
            for s in range(SLOTS):
                obs[base + 3 * s] = self._cf_run[s]
                obs[base + 3 * s + 1] = self._cf_atleast[s]
                obs[base + 3 * s + 2] = self._cf_seen[s]
        return obs.copy()
