"""The core every layer builds on: round records, the cost model, the controller interface, the request shape and
the one decoding loop (:func:`drive`), and the observation features shared by training and deployment."""

from specgym.envs.core.controller import Controller
from specgym.envs.core.cost import CostProfile, save_profile
from specgym.envs.core.features import FEATURE_VERSION, FeatureTracker, TokenDecisionState
from specgym.envs.core.request import Request, Totals, drive
from specgym.envs.core.rounds import DEFAULT_K_MAX, DraftStep, RequestContext, RoundOutcome, check_k_max

__all__ = [
    "DEFAULT_K_MAX", "FEATURE_VERSION", "Controller", "CostProfile", "DraftStep", "FeatureTracker", "Request",
    "RequestContext", "RoundOutcome", "TokenDecisionState", "Totals", "check_k_max", "drive",
    "save_profile",
]
