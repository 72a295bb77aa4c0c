"""The token-mode decision protocol: how a token-level policy's decisions map onto a round, as the token env asks
them (``specgym/SpecDecodeToken-v1``).

A round opens with the ``j = 0`` decision: stop is ``K = 0`` (a plain autoregressive step), continue is
``K = k_max`` (the engine clips it). Each draft token then adds one decision, continue or verify, whose observation
carries the token's features and, with an acceptance predictor, its predicted acceptance. The exported policy
(:class:`~specgym.agents.policy_controller.PolicyController`) and behaviour cloning's demonstrations
(:mod:`specgym.training.bc_init`) both play it through this class, so a clone is trained on the observations the
policy will see.
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

    def draft(self, step: DraftStep) -> np.ndarray:
        """Fold a draft token in; the observation of the decision after it."""
        pred = self.predictor
        self.decisions.add(step, accept=None if pred is None else pred.predict_step(step, self.temperature))
        return self.decisions.observation()
