"""The deployed PPO policy: a numpy-only :class:`Controller` over an exported artifact (:mod:`specgym.agents.artifact`).

The controller computes its observation with :class:`~specgym.envs.core.features.FeatureTracker` and (token mode)
the token-mode protocol (:mod:`specgym.agents.token_protocol`), the code the training environments use, normalises
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
"""

from __future__ import annotations


import numpy as np

from specgym.envs.core.controller import Controller
from specgym.agents.artifact import PolicyArtifact
from specgym.agents.token_protocol import TokenProtocol
from specgym.envs.core.acceptance_predictor import AcceptancePredictor
from specgym.envs.core.features import (
    FEATURE_VERSION, FeatureTracker,
)
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.errors import SpecgymError

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


class PolicyController(Controller):
    """Runs an exported policy as a :class:`Controller` (K mode or token mode), numpy only.

    Args:
        artifact: The loaded policy (:func:`load_policy`) or one built in memory during training.
        name: Display name (default ``ppo-MODE``).
    """

    needs = frozenset({"draft_conf", "draft_entropy"})  # its observation reads both

    def __init__(self, artifact: PolicyArtifact, name: str | None = None):
        artifact.validate()
        if artifact.mode == "tree":
            raise SpecgymError("a tree-mode policy chooses draft trees: use it as tree-ppo:NAME (a tree controller)")
        if artifact.mode == "batch":
            raise SpecgymError("a batch-mode policy chooses K for serving steps: use it as a batch controller "
                               "(specgym tune compare --controllers ppo:NAME)")
        self.artifact = artifact
        self.mode = artifact.mode
        self.token_level = artifact.mode == "token"
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

    def propose(self) -> int:
        """K mode: the policy's draft cap. Token mode: the ``j = 0`` decision (0 = plain step, else k_max)."""
        if self.mode == "k":
            return self.k_min + self.act(self.tracker.observation())
        return self.protocol.cap(self.act(self.protocol.open_round()) != 0)

    def keep_drafting(self, step: DraftStep) -> bool:
        """Token mode: continue after draft token ``step.index``? (K mode: always.)"""
        if self.mode == "k":
            return True
        return self.act(self.protocol.draft(step)) == 1

    def observe(self, outcome: RoundOutcome) -> None:
        """Fold the verified round into the features."""
        self.tracker.update(outcome)
