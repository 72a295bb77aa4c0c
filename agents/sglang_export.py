"""``specgym export --to sglang``: an exported batch-mode policy as ONE self-contained Python module (numpy only)
that SGLang imports as its ``AdaptiveSpecPolicy``.

The module is assembled from specgym's own code, copied verbatim with :func:`inspect.getsource` (so it cannot drift
from what specgym evaluates): the records :class:`~specgym.envs.core.batch.BatchState` and
:class:`~specgym.envs.core.batch.BatchStep`, the observation :class:`~specgym.envs.core.batch.BatchFeatureTracker`,
the numpy actor :class:`~specgym.agents.policy_controller.PolicyNetwork`, the guard
:class:`~specgym.agents.policy_controller.RangeGuard` and :func:`~specgym.agents.batch_policy.batch_decision` (outside
the policy's training range, its teacher the goodput rule decides, as in specgym) and the Protocol adapter
:class:`~specgym.agents.sglang_policy.SGLangPolicyBase`; plus the policy's weights, observation statistics and
training range, and the batched cost profile, tabulated at every batch size ``1..max_batch`` (the tracker reads the
profile only through ``draft(b)``, ``verify(b, 1)``, ``verify(b, k_max + 1)``, ``overhead(b)`` and
``step_times(b, k_max)``; a batch size above ``max_batch`` is priced as ``max_batch``).
``make_policy(initial_steps=None, cfg_path=None)`` in the module builds the policy, so the module's ``make_policy``
is a drop-in for SGLang's ``AdaptiveSpeculativeParams`` (see ``docs/guides/sglang.md``). Its decisions are identical
to :class:`~specgym.agents.batch_policy.BatchPolicyController`'s under SGLang's view (``tests/test_sglang_export.py``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specgym.agents.artifact import PolicyArtifact
from specgym.agents.batch_policy import BATCH_FEATURE_HIGH, BATCH_FEATURE_LOW, batch_decision
from specgym.agents.policy_controller import GUARD_MARGIN, PolicyNetwork, RangeGuard
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
#: The largest ``--max-batch``: SGLang's largest batches (``--max-running-requests``) are in the thousands; the
#: module tabulates every batch size up to it (at 16,384: ~4 MB of tables, ~2 s), and a batch above it is priced as
#: this one, so a larger bound only costs memory and time.
SGLANG_MAX_BATCH = 16384

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
        guard = p["guard"] or {}
        self.features, self.teacher = p["features"], guard.get("teacher")
        self.obs_low = None if not guard else np.asarray(guard["obs_low"], dtype=np.float64)
        self.obs_high = None if not guard else np.asarray(guard["obs_high"], dtype=np.float64)


class _Policy:
    """The batch policy: the tracker's observation, the actor's argmax; outside its training range, its teacher's
    (the goodput rule's) K (specgym's BatchPolicyController)."""

    def __init__(self):
        self.name = PARAMS["name"]
        art = _Artifact(PARAMS)
        self.network = PolicyNetwork(art)
        self.tracker = BatchFeatureTracker(PARAMS["k_max"])
        self.tracker.reset(_CostTable(PARAMS["costs"]))
        g = PARAMS["guard"]
        self.guard = None if not g else RangeGuard(art, np.asarray(g["bounds_low"], dtype=np.float64),
                                                   np.asarray(g["bounds_high"], dtype=np.float64), self.name)

    def propose(self, state):
        return batch_decision(self.network, self.tracker, self.guard, state)

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
    if PARAMS["warning"]:
        print(f"{PARAMS['name']}: WARNING: {PARAMS['warning']}", file=sys.stderr)
    policy = _Policy()
    return SGLangPolicyBase(policy, sorted(steps), PARAMS["k_max"], policy.tracker.profile)
'''


def cost_tables(profile: BatchCostProfile, k_max: int, max_batch: int) -> dict[str, list]:
    """The profile's terms the tracker and the adapter read, at batch sizes ``1..max_batch``."""
    bs = range(1, max_batch + 1)
    return {"draft": [profile.draft(b) for b in bs], "overhead": [profile.overhead(b) for b in bs],
            "verify_1": [profile.verify(b, 1) for b in bs], "verify_kmax": [profile.verify(b, k_max + 1) for b in bs],
            "step_times": [profile.step_times(b, k_max).tolist() for b in bs]}


def require_batch_policy(art: PolicyArtifact, who: str | None = None) -> None:
    """One line unless ``art`` chooses one draft length per serving step (a batch-mode policy), what SGLang runs;
    ``who`` starts the line (default: the policy's mode)."""
    row = art.row
    if not kind_row(row.kind).serving_step or row.action != "draft_cap":
        raise SpecgymError(f"{who or f'policy mode is {art.mode!r}'}: SGLang chooses one step count per batch; "
                           f"export a batch-mode policy (a run of `specgym train --mode batch`, or its exported "
                           f"folder)")


def module_source(art: PolicyArtifact, profile: BatchCostProfile, name: str,
                  candidate_steps: Sequence[int] | None = None, max_batch: int = MAX_BATCH,
                  warning: str | None = None) -> str:
    """The module's text (see the module docstring); ``warning`` (an export forced past its validation verdict) is
    written into its docstring and said on stderr when SGLang builds the policy."""
    art.validate()
    require_batch_policy(art)
    if not 1 <= max_batch <= SGLANG_MAX_BATCH:  # before the tables are built: one row per batch size
        raise SpecgymError(f"--max-batch must be in 1..{SGLANG_MAX_BATCH} (SGLang's largest batches are in the "
                           f"thousands; a larger batch is priced as the largest tabulated), got {max_batch}")
    profile.check_k_max(art.k_max)
    steps = sorted({int(s) for s in (candidate_steps if candidate_steps is not None else range(art.k_max + 1))})
    if not steps or steps[0] < 0 or steps[-1] > art.k_max:
        raise SpecgymError(f"--candidate-steps must be integers in 0..{art.k_max}, got {list(candidate_steps or [])}")
    if steps[-1] < 1:
        raise SpecgymError(f"--candidate-steps {','.join(map(str, candidate_steps or []))}: the module could only "
                           f"choose no speculation; name at least one step in 1..{art.k_max}")
    guard = None
    if art.teacher is not None and art.obs_low is not None and art.obs_high is not None:
        guard = {"teacher": art.teacher, "obs_low": np.asarray(art.obs_low).tolist(),
                 "obs_high": np.asarray(art.obs_high).tolist(), "bounds_low": BATCH_FEATURE_LOW.tolist(),
                 "bounds_high": BATCH_FEATURE_HIGH.tolist()}
    params = {
        "name": name, "k_max": art.k_max, "candidate_steps": steps, "activation": art.activation,
        "weights": [w.tolist() for w in art.weights], "biases": [b.tolist() for b in art.biases],
        "obs_mean": None if art.obs_mean is None else np.asarray(art.obs_mean).tolist(),
        "obs_var": None if art.obs_var is None else np.asarray(art.obs_var).tolist(),
        "epsilon": art.epsilon, "clip_obs": art.clip_obs, "profile": profile.name, "features": list(art.features),
        "guard": guard, "warning": warning, "costs": cost_tables(profile, art.k_max, max_batch),
    }
    guard_line = (f"Outside the range of every feature it saw in training, a step's K is its teacher's "
                  f"({art.teacher}), as in specgym." if guard else
                  "No guard: the policy was exported without its training range, so it decides everywhere.")
    parts = [
        f'"""{name}: a specgym batch policy as SGLang\'s AdaptiveSpecPolicy (written by specgym {__version__}\n'
        f"`specgym export --to sglang`; self-contained, numpy only; priced with batched cost profile {profile.name!r}"
        f" at batch sizes 1..{max_batch}).\n\n"
        + (f"WARNING: {warning}\n\n" if warning else "") + f"{guard_line}\n\n"
        "Use: make_policy(initial_steps=N) returns the policy (docs/guides/sglang.md in specgym).\n"
        '"""\n\nfrom __future__ import annotations\n\nimport json\nimport math\nimport sys\n'
        "from dataclasses import dataclass\n\nimport numpy as np\n",
        f"_LOG512 = {batch_mod._LOG512!r}\n_LOG1P512 = {batch_mod._LOG1P512!r}\n_NONE = np.zeros(0, dtype=np.int64)\n"
        f"GUARD_MARGIN = {GUARD_MARGIN!r}\n",
        *(inspect.getsource(obj) for obj in (BatchState, BatchStep, BatchFeatureTracker, PolicyNetwork, RangeGuard,
                                             batch_decision, SGLangPolicyBase)),
        _RUNTIME,
        f"\nPARAMS = json.loads({json.dumps(params)!r})\n",
    ]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def write_sglang_module(art: PolicyArtifact, profile: BatchCostProfile, out: str | Path,
                        candidate_steps: Sequence[int] | None = None, max_batch: int = MAX_BATCH,
                        overwrite: bool = False, warning: str | None = None) -> Path:
    """Write the module to ``out`` (a ``.py`` file, atomically); ``warning``: see :func:`module_source`."""
    out = Path(out)
    if out.suffix != ".py" or not out.stem.isidentifier():
        raise SpecgymError(f"--out {out}: name a .py file whose stem is a Python identifier (SGLang imports it)")
    name = str(art.meta.get("training", {}).get("run") or out.stem)
    text = module_source(art, profile, name, candidate_steps, max_batch, warning)
    return atomic_write_text(out, text, overwrite=overwrite)
