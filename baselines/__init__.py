"""Baseline speculation-length controllers and the clairvoyant and informed oracles.

The spec table (strings -> controllers, learned ones included) is :mod:`specgym.agents.specs`.
"""

from specgym.baselines.assc import ASSC
from specgym.baselines.confidence import ConfidenceStop
from specgym.baselines.cumulative import CumulativeStop
from specgym.baselines.entropy import EntropyStop
from specgym.baselines.fixed import FixedK
from specgym.baselines.hf_heuristic import HFHeuristic
from specgym.baselines.informed_oracle import informed_plan
from specgym.baselines.marginal import MarginalStop
from specgym.baselines.oracle import oracle_plan, oracle_times, run_lengths
from specgym.baselines.speclane import SpecLane
from specgym.baselines.ucb import UCBBandit
from specgym.envs.core.controller import Controller

__all__ = [
    "ASSC",
    "ConfidenceStop",
    "Controller",
    "CumulativeStop",
    "EntropyStop",
    "FixedK",
    "HFHeuristic",
    "MarginalStop",
    "SpecLane",
    "UCBBandit",
    "informed_plan",
    "oracle_plan",
    "oracle_times",
    "run_lengths",
]
