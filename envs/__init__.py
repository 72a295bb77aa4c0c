"""Engines, trace format, features and Gymnasium environments."""

from specgym.envs.cost import CostProfile, load_profile
from specgym.envs.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.envs.trace_engine import ReplayRequest, TraceEngine, VectorReplay
from specgym.envs.trace_format import Workload, load_workload, save_workload

__all__ = [
    "CostProfile", "DraftStep", "ReplayRequest", "RequestContext", "RoundOutcome", "TraceEngine",
    "VectorReplay", "Workload", "load_profile", "load_workload", "save_workload",
]
