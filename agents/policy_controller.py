"""The deployed PPO policy: a numpy-only :class:`Controller` over an exported artifact (:mod:`specgym.agents.artifact`).

The controller computes its observation with :class:`~specgym.envs.core.features.FeatureTracker` and (token mode)
the token-mode protocol (:mod:`specgym.envs.core.token_protocol`), the code the training environments use, normalises
it exactly as SB3's ``VecNormalize`` does (``clip((obs - mean) / sqrt(var + eps), -clip_obs, clip_obs)``) and takes
the argmax of the actor's logits (``model.predict(deterministic=True)``). Nothing here imports torch or
stable-baselines3.

Modes:

* ``k``: ``propose()`` returns ``k_min + argmax(logits(obs))``.
* ``token``: decisions follow :class:`~specgym.envs.gym.spec_env.SpecDecodeTokenEnv`. ``propose()`` is the decision
  at ``j = 0``: stop -> ``0`` (a plain autoregressive step), continue -> ``k_max`` (the engine clips it);
  ``keep_drafting(step)`` is the decision at ``j = step.index``.

A policy trained with ``k_max`` runs on any engine whose cap is at least that (its features are scaled by its own
``k_max``; it never proposes more); :meth:`PolicyController.check_engine_k_max` is the one check.

**The guard: never below its teacher.** A policy exported with the range of every feature it saw in training
(``obs_low``/``obs_high`` and its ``teacher`` under the artifact's checksum) knows where it has no experience: a
decision whose observation leaves that range in any feature (by more than
:data:`GUARD_MARGIN` of the feature's bound) is the teacher's (``marginal``, or ``planned:``
on the embedded predictor for a predictor-reading policy), and so is the rest of that round. The teacher runs in
lockstep (it sees every round and every draft token), so it can take over at any decision with its state warm; a
K-mode policy with a guard therefore takes its per-token calls too (it drafts to its own K unless the teacher
leads). The controller says so once on stderr and counts the decisions handed over (:meth:`guard_stats`; the
evaluation report marks the row).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from specgym.baselines.marginal import MarginalStop
from specgym.baselines.planned_stop import PlannedStop
from specgym.envs.core.acceptance_predictor import AcceptancePredictor
from specgym.envs.core.controller import Controller
from specgym.envs.core.features import FEATURE_VERSION, FeatureTracker, feature_bounds
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.envs.core.token_protocol import TokenProtocol
from specgym.errors import SpecgymError

if TYPE_CHECKING:  # the artifact's module imports the mode table, which imports this one
    from specgym.agents.artifact import PolicyArtifact

#: The rules a guarded policy hands its decisions to outside its training range (a chain policy's: ``marginal`` or
#: ``planned``; a drafter-choice policy's: ``drafter-marginal``; a batch policy's: ``goodput``).
TEACHERS = ("marginal", "planned", "drafter-marginal", "goodput")
#: How far outside its training range a feature may go before the guard hands over: this share of the feature's
#: bound range (:func:`~specgym.envs.core.features.feature_bounds`).
GUARD_MARGIN = 0.02


class PolicyNetwork:
    """The exported actor in numpy: VecNormalize's observation transform, the MLP, the argmax.

    Args:
        artifact: A validated policy artifact.
    """

    def __init__(self, artifact: PolicyArtifact):
        # Pre-transposed float32 layers: h = act(h @ W.T + b), as torch's Linear computes.
        self._layers = [(np.ascontiguousarray(w.T, dtype=np.float32), np.asarray(b, np.float32))
                        for w, b in zip(artifact.weights, artifact.biases)]
        self._act = np.tanh if artifact.activation == "tanh" else (lambda x, out: np.maximum(x, 0, out=out))
        self._mean: np.ndarray | None = None
        self._std: np.ndarray | None = None
        if artifact.obs_mean is not None:
            self._mean = np.asarray(artifact.obs_mean, np.float64)
            self._std = np.sqrt(np.asarray(artifact.obs_var, np.float64) + artifact.epsilon)
        self._clip = float(artifact.clip_obs)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """VecNormalize's observation transform (float64, as SB3 computes it), cast to float32 for the MLP."""
        if self._mean is None or self._std is None:
            return np.asarray(obs, np.float32)
        x = np.subtract(obs, self._mean, dtype=np.float64)
        np.divide(x, self._std, out=x)
        # np.clip's Python wrapper costs microseconds; two ufuncs compute the same thing.
        np.maximum(x, -self._clip, out=x)
        np.minimum(x, self._clip, out=x)
        return x.astype(np.float32)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """Action logits of raw (un-normalised) observations, shape ``(..., n_actions)``."""
        h = self.normalize(obs)
        *hidden, (w_out, b_out) = self._layers
        act = self._act
        for w, b in hidden:
            h = h.dot(w)
            h += b
            h = act(h, out=h)
        h = h.dot(w_out)
        h += b_out
        return h

    def act(self, obs: np.ndarray) -> int:
        """The deterministic action index (argmax of the logits) for one raw observation."""
        return int(self.logits(obs).argmax())


class RangeGuard:
    """Where a policy has no experience: an observation outside the range it saw in training (by more than
    :data:`GUARD_MARGIN` of a feature's bound range) in any feature. Counts the decisions it checks and hands over,
    and says once on stderr which feature first left its range.

    Args:
        artifact: The policy (its ``obs_low``/``obs_high``, ``features`` and ``teacher``).
        low, high: The bound range of every feature (:func:`~specgym.envs.core.features.feature_bounds`).
        name: The policy's display name (in the stderr line).
    """

    def __init__(self, artifact: PolicyArtifact, low: np.ndarray, high: np.ndarray, name: str):
        assert artifact.obs_low is not None and artifact.obs_high is not None
        tol = GUARD_MARGIN * (np.asarray(high, np.float64) - low)
        self.artifact, self.name = artifact, name
        self.lo, self.hi = artifact.obs_low - tol, artifact.obs_high + tol
        self.decisions_made = self.decisions_handed = 0
        self.first_out: tuple[str, float, float, float] | None = None

    def outside(self, obs: np.ndarray) -> bool:
        """Count a decision; True (and said once on stderr) when ``obs`` leaves the training range."""
        self.decisions_made += 1
        out = (obs < self.lo) | (obs > self.hi)
        if not out.any():
            return False
        self.decisions_handed += 1
        if self.first_out is None:
            i = int(np.flatnonzero(out)[0])
            name = self.artifact.features[i]
            lo, hi = float(self.artifact.obs_low[i]), float(self.artifact.obs_high[i])  # type: ignore[index]
            self.first_out = (name, float(obs[i]), lo, hi)
            print(f"{self.name}: feature {name} = {float(obs[i]):.4g} is outside its training range [{lo:.4g}, "
                  f"{hi:.4g}]; such decisions go to its teacher, {self.artifact.teacher}", file=sys.stderr)
        return True

    def stats(self) -> dict[str, Any]:
        """Its teacher, decisions taken and handed over, the first feature found outside its range."""
        first = self.first_out
        return {"teacher": self.artifact.teacher, "decisions": self.decisions_made,
                "handed": self.decisions_handed,
                "share": self.decisions_handed / self.decisions_made if self.decisions_made else 0.0,
                "first_outside": None if first is None else {"feature": first[0], "value": first[1],
                                                             "low": first[2], "high": first[3]}}


class PolicyController(Controller):
    """Runs an exported policy as a :class:`Controller` (K mode or token mode), numpy only.

    Args:
        artifact: The loaded policy (:func:`load_policy`) or one built in memory during training.
        name: Display name (default ``ppo-MODE``).
    """

    needs = frozenset({"draft_conf", "draft_entropy"})  # its observation reads both

    def __init__(self, artifact: PolicyArtifact, name: str | None = None):
        artifact.validate()
        row = artifact.require(("k", "token"), "a chain policy controller")
        self.artifact = artifact
        self.mode = artifact.mode
        self.token_level = row.token_level
        self.name = name or f"ppo-{artifact.mode}"
        self.k_min, self.k_max = artifact.k_min, artifact.k_max
        self.network = PolicyNetwork(artifact)
        self.logits, self.normalize = self.network.logits, self.network.normalize
        self.tracker = FeatureTracker(self.k_max)
        self.predictor = None if artifact.predictor is None else \
            AcceptancePredictor.from_dict(artifact.predictor, where=f"policy {self.name}: field 'predictor'")
        self.protocol = TokenProtocol(self.tracker, self.k_max, self.predictor,
                                      artifact.feature_version if self.token_level else FEATURE_VERSION)
        self.decisions = self.protocol.decisions
        self.per_token = row.token_level  # the policy's own decisions are per draft token
        self.teacher: Controller | None = None
        self.guard: RangeGuard | None = None
        if artifact.teacher is not None and artifact.obs_low is not None and artifact.obs_high is not None:
            pred = self.predictor
            self.teacher = PlannedStop(pred) if artifact.teacher == "planned" and pred is not None else MarginalStop()
            low, high = feature_bounds(row.name if row.token_level else "k", artifact.feature_version)
            self.guard = RangeGuard(artifact, low, high, self.name)
            self.token_level = True  # the teacher stops token by token
        self._led = False  # the current round is the teacher's

    def bind_signals(self, src: Any) -> str | None:
        """A token-mode policy reading an acceptance predictor: predict with the model of its chain that ``src``
        (a :class:`~specgym.envs.core.acceptance_predictor.SignalSource`) feeds; another pair's is refused."""
        if self.predictor is None:
            return None
        self.protocol.predictor, note = self.predictor.for_source(src)
        bind = getattr(self.teacher, "bind_signals", None)
        if bind is not None:  # a planned: teacher reads the same predictor
            bind(src)
        return note

    def act(self, obs: np.ndarray) -> int:
        """The policy's deterministic action index for one raw observation (a method, so subclasses can wrap it)."""
        return self.network.act(obs)

    # --- the Controller interface ------------------------------------------------------------------------
    def check_engine_k_max(self, k_max: int) -> None:
        """Raise unless an engine capped at ``k_max`` can run this policy (it needs ``k_max >= its own``)."""
        if k_max < self.k_max:
            raise SpecgymError(f"policy {self.name} was trained with k_max={self.k_max}, the engine allows only "
                               f"{k_max} (pass --k-max {self.k_max})")

    def reset(self, ctx: RequestContext) -> None:
        """Start a request: clear the feature history, read the static features from ``ctx``."""
        self.check_engine_k_max(ctx.k_max)
        self.ctx = ctx
        self.protocol.temperature = float(ctx.temperature)
        self.tracker.reset(ctx)
        if self.teacher is not None:
            self.teacher.reset(ctx)

    def propose(self) -> int:
        """K mode: the policy's draft cap. Token mode: the ``j = 0`` decision (0 = plain step, else k_max). Outside
        the training range: the teacher's."""
        teacher_k = self.teacher.propose() if self.teacher is not None else 0
        obs = self.protocol.open_round() if self.per_token else self.tracker.observation()
        self._led = self._outside(obs)
        if self._led:
            return teacher_k
        if not self.per_token:
            return self.k_min + self.act(obs)
        return self.protocol.cap(self.act(obs) != 0)

    def keep_drafting(self, step: DraftStep) -> bool:
        """Token mode: continue after draft token ``step.index``? (K mode: always.) In a round the teacher leads,
        or once a token's observation leaves the training range: the teacher's answer."""
        teacher_keep = self.teacher.keep_drafting(step) if self.teacher is not None else True
        if self._led:
            return teacher_keep
        if not self.per_token:
            return True
        obs = self.protocol.draft(step)
        self._led = self._outside(obs)
        return teacher_keep if self._led else self.act(obs) == 1

    def observe(self, outcome: RoundOutcome) -> None:
        """Fold the verified round into the features (the teacher's too)."""
        self.tracker.update(outcome)
        if self.teacher is not None:
            self.teacher.observe(outcome)

    # --- the guard -------------------------------------------------------------------------------------------
    def _outside(self, obs: np.ndarray) -> bool:
        """True when the guard hands ``obs``'s decision to the teacher (:class:`RangeGuard`)."""
        return self.guard is not None and self.guard.outside(obs)

    def guard_stats(self) -> dict[str, Any] | None:
        """The guard's record (None without one): its teacher, decisions taken and handed over, the first
        feature found outside its range."""
        return None if self.guard is None else self.guard.stats()
