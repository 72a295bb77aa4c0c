"""specgym: learning the speculation length of speculative decoding.

Public API: workloads and cost profiles, the replay engine, the Gymnasium environments (registered on import as
``specgym/SpecDecode-v0``, ``specgym/SpecDecodeToken-v0`` and, over real models, ``specgym/SpecDecodeLive-v0``)
and the controller interface.
"""

from gymnasium.envs.registration import register, registry

from specgym.envs.cost import CostProfile, load_profile
from specgym.envs.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.envs.trace_engine import TraceEngine, VectorReplay
from specgym.envs.trace_format import Workload, load_workload, save_workload
from specgym.errors import SpecgymError

__version__ = "0.1.0"

# id -> (entry point, nondeterministic). The live env runs real models and measures time: not reproducible.
_ENVS = {
    "specgym/SpecDecode-v0": ("specgym.envs.spec_env:SpecDecodeEnv", False),
    "specgym/SpecDecodeToken-v0": ("specgym.envs.spec_env:SpecDecodeTokenEnv", False),
    "specgym/SpecDecodeLive-v0": ("specgym.envs.live_env:SpecDecodeLiveEnv", True),
}
for _id, (_entry, _nondeterministic) in _ENVS.items():
    if _id not in registry:
        register(id=_id, entry_point=_entry, nondeterministic=_nondeterministic)

__all__ = [
    "CostProfile", "DraftStep", "RequestContext", "RoundOutcome", "SpecgymError", "TraceEngine", "VectorReplay",
    "Workload", "load_profile", "load_workload", "save_workload", "__version__",
]
