"""``specgym export --to sglang``: an exported batch-mode policy as ONE self-contained Python module (numpy only)
that SGLang imports as its ``AdaptiveSpecPolicy``.

The module is assembled from specgym's own code, copied verbatim with :func:`inspect.getsource` (so it cannot drift
from what specgym evaluates): the records :class:`~specgym.envs.core.batch.BatchState` and
:class:`~specgym.envs.core.batch.BatchStep`, the observation :class:`~specgym.envs.core.batch.BatchFeatureTracker`,
the numpy actor :class:`~specgym.agents.policy_controller.PolicyNetwork` and the Protocol adapter
:class:`~specgym.agents.sglang_policy.SGLangPolicyBase`; plus the policy's weights and observation statistics and the
batched cost profile, tabulated at every batch size ``1..max_batch`` (the tracker reads the profile only through
``draft(b)``, ``verify(b, 1)``, ``verify(b, k_max + 1)``, ``overhead(b)`` and ``step_times(b, k_max)``; a batch size
above ``max_batch`` is priced as ``max_batch``). ``make_policy(initial_steps=None, cfg_path=None)`` in the module
builds the policy, so the module's ``make_policy`` is a drop-in for SGLang's ``AdaptiveSpeculativeParams`` (see
``docs/guides/sglang.md``). Its decisions are identical to :class:`~specgym.agents.batch_policy.BatchPolicyController`'s
under SGLang's view (``tests/test_sglang_export.py``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specgym.agents.artifact import PolicyArtifact
from specgym.agents.policy_controller import PolicyNetwork
from specgym.agents.sglang_policy import SGLangPolicyBase
from specgym.envs.core import batch as batch_mod
from specgym.envs.core.batch import BatchFeatureTracker, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.kinds import kind_row
from specgym.errors import SpecgymError
from specgym.io import atomic_write_text
from specgym.version import __version__

#: Batch sizes tabulated by default (SGLang's default CUDA-graph capture tops out well below).
MAX_BATCH = 512

_RUNTIME = '''

class _CostTable:
    """The batched cost profile, tabulated per batch size 1..max_batch (above: priced as max_batch)."""

    def __init__(self, t):
        self.t = {k: np.asarray(v, dtype=np.float64) for k, v in t.items()}
        self.max_batch = len(self.t["draft"])

    def _i(self, b):
        return min(max(int(b), 1), self.max_batch) - 1

    def draft(self, b):
        return float(self.t["draft"][self._i(b)])

    def overhead(self, b):
        return float(self.t["overhead"][self._i(b)])

    def verify(self, b, n):
        key = "verify_1" if n == 1 else "verify_kmax"
        if n not in (1, PARAMS["k_max"] + 1):
            raise ValueError(f"verify({b}, {n}): tabulated for n = 1 and k_max + 1 only")
        return float(self.t[key][self._i(b)])

    def step_times(self, b, k_max):
        return self.t["step_times"][self._i(b)][: k_max + 1]

    def step_time(self, b, k):
        return float(self.t["step_times"][self._i(b)][k])


class _Artifact:
    """What PolicyNetwork reads of a policy artifact."""

    def __init__(self, p):
        self.weights = [np.asarray(w, dtype=np.float32) for w in p["weights"]]
        self.biases = [np.asarray(b, dtype=np.float32) for b in p["biases"]]
        self.activation = p["activation"]
        self.obs_mean = None if p["obs_mean"] is None else np.asarray(p["obs_mean"], dtype=np.float64)
        self.obs_var = None if p["obs_var"] is None else np.asarray(p["obs_var"], dtype=np.float64)
        self.epsilon, self.clip_obs = p["epsilon"], p["clip_obs"]


class _Policy:
    """The batch policy: the tracker's observation, the actor's argmax (specgym's BatchPolicyController)."""

    def __init__(self):
        self.name = PARAMS["name"]
        self.network = PolicyNetwork(_Artifact(PARAMS))
        self.tracker = BatchFeatureTracker(PARAMS["k_max"])
        self.tracker.reset(_CostTable(PARAMS["costs"]))

    def propose(self, state):
        return self.network.act(self.tracker.observation(state))

    def observe(self, step):
        self.tracker.update(step)


def make_policy(initial_steps=None, cfg_path=None, candidate_steps=None, **_):
    """The policy SGLang calls (a drop-in for AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...)).

    candidate_steps: the step counts SGLang builds runtime states for (default: the exported ones); SGLang's
    initial steps join them.
    """
    steps = set(PARAMS["candidate_steps"] if candidate_steps is None else candidate_steps)
    if initial_steps is not None:
        steps.add(int(initial_steps))
    policy = _Policy()
    return SGLangPolicyBase(policy, sorted(steps), PARAMS["k_max"], policy.tracker.profile)
'''


def cost_tables(profile: BatchCostProfile, k_max: int, max_batch: int) -> dict[str, list]:
    """The profile's terms the tracker and the adapter read, at batch sizes ``1..max_batch``."""
    bs = range(1, max_batch + 1)
    return {"draft": [profile.draft(b) for b in bs], "overhead": [profile.overhead(b) for b in bs],
            "verify_1": [profile.verify(b, 1) for b in bs], "verify_kmax": [profile.verify(b, k_max + 1) for b in bs],
            "step_times": [profile.step_times(b, k_max).tolist() for b in bs]}


def module_source(art: PolicyArtifact, profile: BatchCostProfile, name: str,
                  candidate_steps: Sequence[int] | None = None, max_batch: int = MAX_BATCH) -> str:
    """The module's text (see the module docstring)."""
    art.validate()
    if not kind_row(art.row.kind).serving_step:
        raise SpecgymError(f"policy mode is {art.mode!r}: SGLang chooses steps per batch, export a batch-mode policy")
    if max_batch < 1:
        raise SpecgymError(f"--max-batch must be >= 1, got {max_batch}")
    profile.check_k_max(art.k_max)
    steps = sorted({int(s) for s in (candidate_steps if candidate_steps is not None else range(art.k_max + 1))})
    if not steps or steps[0] < 0 or steps[-1] > art.k_max:
        raise SpecgymError(f"--candidate-steps must be integers in 0..{art.k_max}, got {list(candidate_steps or [])}")
    params = {
        "name": name, "k_max": art.k_max, "candidate_steps": steps, "activation": art.activation,
        "weights": [w.tolist() for w in art.weights], "biases": [b.tolist() for b in art.biases],
        "obs_mean": None if art.obs_mean is None else np.asarray(art.obs_mean).tolist(),
        "obs_var": None if art.obs_var is None else np.asarray(art.obs_var).tolist(),
        "epsilon": art.epsilon, "clip_obs": art.clip_obs, "profile": profile.name,
        "costs": cost_tables(profile, art.k_max, max_batch),
    }
    parts = [
        f'"""{name}: a specgym batch policy as SGLang\'s AdaptiveSpecPolicy (written by specgym {__version__}\n'
        f"`specgym export --to sglang`; self-contained, numpy only; priced with batched cost profile {profile.name!r}"
        f" at batch sizes 1..{max_batch}).\n\n"
        "Use: make_policy(initial_steps=N) returns the policy (docs/guides/sglang.md in specgym).\n"
        '"""\n\nfrom __future__ import annotations\n\nimport json\nimport math\nfrom dataclasses import dataclass\n\n'
        "import numpy as np\n",
        f"_LOG512 = {batch_mod._LOG512!r}\n_LOG1P512 = {batch_mod._LOG1P512!r}\n_NONE = np.zeros(0, dtype=np.int64)\n",
        *(inspect.getsource(obj) for obj in (BatchState, BatchStep, BatchFeatureTracker, PolicyNetwork,
                                             SGLangPolicyBase)),
        _RUNTIME,
        f"\nPARAMS = json.loads({json.dumps(params)!r})\n",
    ]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def write_sglang_module(art: PolicyArtifact, profile: BatchCostProfile, out: str | Path,
                        candidate_steps: Sequence[int] | None = None, max_batch: int = MAX_BATCH,
                        overwrite: bool = False) -> Path:
    """Write the module to ``out`` (a ``.py`` file, atomically)."""
    out = Path(out)
    if out.suffix != ".py" or not out.stem.isidentifier():
        raise SpecgymError(f"--out {out}: name a .py file whose stem is a Python identifier (SGLang imports it)")
    name = str(art.meta.get("training", {}).get("run") or out.stem)
    text = module_source(art, profile, name, candidate_steps, max_batch)
    return atomic_write_text(out, text, overwrite=overwrite)
