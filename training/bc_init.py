"""Behaviour-cloning initialisation of a PPO policy from a baseline controller (config key ``bc_init``).

``bc_init: confidence:0.4`` (or ``specgym train --init-from SPEC``) does, before PPO starts:

1. **Demonstrations.** The baseline (any chain controller spec of :mod:`specgym.agents.specs` of the run's level:
   token-level specs for token mode, any spec for K mode) is replayed on the *train* split with
   :func:`~specgym.envs.core.request.drive`. At every decision the training env would ask for,
   :class:`RecordingController` renders the observation exactly as the deployed
   :class:`~specgym.agents.policy_controller.PolicyController` does (the same :class:`FeatureTracker` and
   :class:`TokenDecisionState`) and records the baseline's decision as the label: token mode ``propose() > 0`` at
   ``j = 0`` and ``keep_drafting(step)`` (and ``j < proposed K``) at ``j >= 1``; K mode ``propose() - k_min``
   (clipped to the action range). Forced rounds (no room to draft) are not decisions, as in the env. Outcomes are
   drawn with ``bc_passes`` different seeds (the env draws fresh outcomes per episode too).
2. **Normalisation.** ``VecNormalize``'s observation statistics are set to the demonstrations' mean/variance, so the
   cloned actor sees the inputs it was fitted on.
3. **Cloning.** The actor (``mlp_extractor.policy_net`` + ``action_net``) is fitted by cross-entropy (Adam,
   ``bc_epochs`` epochs, minibatch 1024, label smoothing 0.1 so the clone still explores); the critic is untouched.
4. **Critic warm-up** (``bc_warmup`` timesteps, :class:`~specgym.training.callbacks.CriticWarmupCallback`): PPO
   first updates only the
   critic (actor parameters frozen), so the first policy-gradient steps use a critic fitted to the cloned policy
   instead of random advantages that would wash the clone out.

The validation callback evaluates the cloned policy before PPO starts, so the kept "best" model is never worse on
val than the clone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specgym.agents.alloc_policy import ALLOC_ESTIMATOR, TEACHER_ACTION
from specgym.agents.modes import get_mode
from specgym.agents.specs import build
from specgym.agents.specs import make as make_controller
from specgym.envs.core.controller import Controller
from specgym.envs.core.drafter_choice import DrafterController, DrafterDecision, drive_drafters
from specgym.envs.core.drafter_features import SLOTS, DrafterFeatureTracker, action_of
from specgym.envs.core.features import FeatureTracker
from specgym.envs.core.kinds import kind_row
from specgym.envs.core.request import drive
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome, RoundStart
from specgym.envs.core.token_protocol import TokenProtocol
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.domains import DomainDistribution
from specgym.errors import SpecgymError
from specgym.training.sb3_actor import actor_logits, actor_parameters


class RecordingController(Controller):
    """Runs ``inner`` and records (observation, label) pairs at the decisions the training env asks for."""

    def __init__(self, inner: Controller, mode: str, k_min: int, k_max: int, predictor: Any = None):
        self.inner, self.mode, self.k_min, self.k_max = inner, mode, k_min, k_max
        self.per_token = get_mode(mode).token_level  # the decisions are per draft token (else one K per round)
        self.predictor = predictor  # the observations' acceptance predictor (token mode), as the training env's
        self.name, self.token_level = f"record({inner.name})", inner.token_level
        self.tracker = FeatureTracker(k_max)
        self.protocol = TokenProtocol(self.tracker, k_max, predictor)
        self.obs: list[np.ndarray] = []
        self.labels: list[int] = []
        self._round_start = 0  # index of the current round's first record
        self._k = 0

    def reset(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.protocol.temperature = float(ctx.temperature)
        self.inner.reset(ctx)
        self.tracker.reset(ctx)

    def _add(self, obs: np.ndarray, label: int) -> None:
        self.obs.append(obs)
        self.labels.append(label)

    def propose(self) -> int:
        self._round_start = len(self.labels)
        k = int(self.inner.propose())
        if not self.per_token:
            a = min(max(k, self.k_min), self.k_max) - self.k_min
            self._add(self.tracker.observation(), a)
            return a + self.k_min
        # token mode: the j = 0 decision; continue -> cap k_max and stop at j = k
        self._k = k
        self._add(self.protocol.open_round(), int(k > 0))
        return self.protocol.cap(k > 0)

    def keep_drafting(self, step: DraftStep) -> bool:
        if not self.per_token:
            return True
        obs = self.protocol.draft(step)
        keep = step.index < self._k and bool(self.inner.keep_drafting(step))
        self._add(obs, int(keep))
        return keep

    def observe(self, outcome: RoundOutcome) -> None:
        if outcome.forced:  # the engine had no room to draft: the env never asks (not a decision)
            del self.obs[self._round_start:], self.labels[self._round_start:]
        self.inner.observe(outcome)
        self.tracker.update(outcome)


class DrafterRecorder(DrafterController):
    """Runs a drafter-choice controller and records (observation, action) at every round, as the drafter env and
    the exported :class:`~specgym.agents.drafter_policy.DrafterPolicyController` observe."""

    def __init__(self, inner: DrafterController, k_max: int):
        self.inner, self.k_max = inner, k_max
        self.name = f"record({inner.name})"
        self.tracker = DrafterFeatureTracker(k_max)
        self.obs: list[np.ndarray] = []
        self.labels: list[int] = []

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        super().reset(ctx, drafters)
        self.inner.reset(ctx, drafters)
        self.tracker.reset(ctx, drafters)

    def propose(self, start: RoundStart) -> DrafterDecision:
        dec = self.inner.propose(start)
        self.obs.append(self.tracker.observation(start))
        self.labels.append(action_of(dec, self.drafters[:SLOTS], self.k_max))
        return dec

    def observe(self, outcome: RoundOutcome) -> None:
        self.inner.observe(outcome)
        self.tracker.update(outcome)


def drafter_demonstrations(spec: str, workload: Any, k_max: int, split: str | None = None,
                           ) -> tuple[np.ndarray, np.ndarray]:
    """(observations, actions) of the drafter-choice baseline ``spec`` over ``split`` (``None``: the workload's fit
    split; per-start runs: one pass)."""
    if isinstance(workload, DomainDistribution):
        raise SpecgymError("bc_init: drafter mode trains on one workload (no domains)")
    inner = build(spec, k_max, ("drafter",)).controller
    if inner is None:
        raise SpecgymError(f"bc_init: {spec!r} is a plan row, not a controller")
    engine = TraceEngine(workload, k_max=k_max)
    inner.prepare(workload, engine.profile)
    rec = DrafterRecorder(inner, k_max)
    for r in workload.split_indices(split or workload.fit_split):
        drive_drafters(rec, engine.start(int(r)), workload.drafter_names)
    return np.asarray(rec.obs, np.float32), np.asarray(rec.labels, np.int64)


def demonstrations(spec: str, workload: Any, mode: str, k_min: int, k_max: int, passes: int = 2,
                   split: str | None = None, seed: int = 0,
                   domain_episodes: int = 1500, predictor: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(observations, labels) of the baseline ``spec`` replayed ``passes`` times over ``split`` (``None``: the
    workload's fit split, :attr:`Workload.fit_split`).

    ``workload`` may be a :class:`~specgym.envs.workloads.domains.DomainDistribution`: then ``passes *
    domain_episodes`` episodes are drawn from it as the training env draws them (a workload, a profile, a request
    of its ``split``), so the clone sees the same mix of domains PPO will.
    """
    if kind_row(get_mode(mode).kind).chooses_drafter:
        return drafter_demonstrations(spec, workload, k_max, split)
    inner = make_controller(spec, k_max)
    if get_mode(mode).token_level and not inner.token_level:
        raise SpecgymError(f"bc_init: {spec!r} is not a token-level controller (token mode needs one)")
    rec = RecordingController(inner, mode, k_min, k_max, predictor)
    split = split or workload.fit_split
    if isinstance(workload, DomainDistribution):
        rng = np.random.default_rng(seed)
        for e in range(passes * domain_episodes):
            wl, profile = workload.sample(rng)
            r = int(rng.choice(wl.split_indices(split)))
            drive(rec, TraceEngine(wl, profile, k_max=k_max, seed=seed).start(r, seed=seed + e + 1))
    else:
        engine = TraceEngine(workload, k_max=k_max, seed=seed)
        for p in range(passes):
            for r in workload.split_indices(split):
                drive(rec, engine.start(int(r), seed=seed + 1000 * p + 1))
    return np.asarray(rec.obs, np.float32), np.asarray(rec.labels, np.int64)


def alloc_demonstrations(spec: str, make_env: Callable[[], Any], episodes: int, seed: int = 0
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(observations, labels) of the learned allocator's teacher, the budget rule (``gamma = 1``), over
    ``episodes`` episodes of the run's own env (each at the concurrency it draws), so the clone sees the inputs
    PPO will. ``spec`` must name the rule the policy calibrates."""
    env = make_env()
    want = f"budget:{ALLOC_ESTIMATOR}" if getattr(env, "predictor", None) is None else "budget:predictor:"
    if not spec.startswith(want) or (want == "budget:predictor:" and spec == want):
        raise SpecgymError(f"bc_init: an alloc run calibrates the budget rule with its own estimator ({want}"
                           f"{'NAME' if want.endswith(':') else ''}, its only teacher); got {spec!r}")
    obs: list[np.ndarray] = []
    for e in range(episodes):
        o, _ = env.reset(seed=seed + 7919 * (e + 1))
        done = False
        while not done:
            obs.append(o)
            o, _, done, _, _ = env.step(TEACHER_ACTION)
    return np.asarray(obs, np.float32), np.full(len(obs), TEACHER_ACTION, np.int64)


def clone_into(model: Any, venv: Any, obs: np.ndarray, labels: np.ndarray, epochs: int = 10,
               lr: float = 1e-3, batch: int = 1024, seed: int = 0, smoothing: float = 0.1) -> dict[str, float]:
    """Fit ``model``'s actor to ``labels`` (cross-entropy) on ``obs`` normalised with statistics set in ``venv``;
    ``obs`` also join the range ``venv`` records for the policy's guard (a ``RangeVecNormalize``).

    ``smoothing`` (label smoothing) keeps the clone stochastic (about 95/5 for two actions): a deterministic
    clone gives PPO no exploration and vanishing policy gradients; the argmax is still the baseline's decision.
    """
    import torch

    rms = venv.obs_rms
    rms.mean = obs.mean(0).astype(np.float64)
    rms.var = obs.var(0).astype(np.float64)
    rms.count = float(len(obs))
    include = getattr(venv, "include", None)  # RangeVecNormalize: the demonstrations join the guard's range
    if callable(include):
        include(obs)
    x = torch.as_tensor(venv.normalize_obs(obs.copy()), dtype=torch.float32)
    y = torch.as_tensor(labels)
    opt = torch.optim.Adam(actor_parameters(model), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch):
            idx = perm[i:i + batch]
            logits = actor_logits(model, x[idx])
            loss = torch.nn.functional.cross_entropy(logits, y[idx], label_smoothing=smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        logits = actor_logits(model, x)
        final = float(torch.nn.functional.cross_entropy(logits, y))
        acc = float((logits.argmax(1) == y).float().mean())
    return {"samples": int(len(x)), "loss": final, "accuracy": acc, "positive_share": float(labels.mean())}
