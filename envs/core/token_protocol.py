"""The token-mode decision protocol: how per-token decisions map onto a round, the one implementation every
token-level decider plays.

A round opens with the ``j = 0`` decision: stop is ``K = 0`` (a plain autoregressive step), continue is
``K = k_max`` (the engine clips it). Each draft token then adds one decision, continue or verify, taken after the
token is folded into the round's :class:`~specgym.envs.core.features.TokenDecisionState`: its acceptance estimate
is the acceptance predictor's probability where a predictor is given and the step carries its signals, else the
calibrated draft confidence. The token env (``specgym/SpecDecodeToken-v1``), the exported token policy, behaviour
cloning's demonstrations and the predictor controllers (``predicted:``, ``planned:``) all fold draft tokens
through this class, so each sees the very estimates the others do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specgym.envs.core.features import FEATURE_VERSION, FeatureTracker, TokenDecisionState
from specgym.envs.core.rounds import DraftStep


class TokenProtocol:
    """The decisions of one request in token mode.

    Args:
        tracker: The request's round features (the caller resets and updates it).
        k_max: The cap a ``continue`` at ``j = 0`` asks for.
        predictor: Acceptance predictor of the draft tokens (None: calibrated confidence).
        feature_version: Feature version of the observations.
    """

    def __init__(self, tracker: FeatureTracker, k_max: int, predictor: Any = None,
                 feature_version: int = FEATURE_VERSION):
        self.decisions = TokenDecisionState(tracker, feature_version)
        self.k_max, self.predictor = k_max, predictor
        self.temperature = 0.0

    def open_round(self) -> np.ndarray:
        """Start a round; the observation of its ``j = 0`` decision."""
        self.decisions.begin_round()
        return self.decisions.observation()

    def cap(self, keep: bool) -> int:
        """The round's draft cap for the ``j = 0`` decision: ``k_max`` to draft, 0 for a plain step."""
        return self.k_max if keep else 0

    def fold(self, step: DraftStep) -> float | None:
        """Fold a draft token in; returns the predictor's acceptance probability of it, or ``None`` where the
        token's estimate is the calibrated confidence (no predictor, or the step lacks its signals)."""
        pred = self.predictor
        p = None if pred is None else pred.predict_step(step, self.temperature)
        self.decisions.add(step, accept=p)
        return p

    def draft(self, step: DraftStep) -> np.ndarray:
        """Fold a draft token in; the observation of the decision after it."""
        self.fold(step)
        return self.decisions.observation()
