"""Observation features: the one place that turns verified history into a policy's input.

The K-level environment, the token-level environment, the evaluation harness and the exported
``PolicyController`` all build observations with :class:`FeatureTracker` (and, in token mode,
:class:`TokenDecisionState`), so a policy sees in deployment exactly what it saw in training. Only information a real
serving loop has at decision time is used: outcomes of rounds already verified, draft features of tokens already
proposed, the request's temperature and the cost profile. Never the completion length or a future outcome.

Draft features of the last round are taken over the *judged* tokens only: the accepted prefix plus the first
rejected token (``min(accepted + 1, drafted)``). Tokens drafted after the first rejection are excluded: in a live
engine they were conditioned on a wrong token, and in replay their confidences come from the correct-prefix trace,
which would reveal the next round's first draft token (version 1 leaked it; a policy learned to exploit it).

On an engine without draft features (a per-start trace: ``RequestContext.lacks`` names ``draft_conf`` /
``draft_entropy``) the confidence and entropy features keep their start values (0.5 / 0 for the EMAs, 0 for the last
round's, the calibration at the identity) and a token's calibrated acceptance is a single bin: the request's running
acceptance estimate. With a context term in the cost profile the round costs follow the KV cache
(``prompt_len + tokens generated``).

Version 3 adds what a cost-aware controller needs to generalise across hardware and drafts: the round overhead, the
gap between recent acceptance and recent judged confidence (how mis-calibrated the draft is), the model-optimal K
under the request's full cost model, and in token mode the calibrated acceptance of the token just drafted, the
calibrated probability that the whole draft so far is accepted and the marginal ratio of drafting one more token
(:mod:`specgym.envs.core.economics`).

Version 4 lets a token-mode policy see a learned acceptance predictor
(:mod:`specgym.envs.core.acceptance_predictor`): where the environment (training) or the controller (deployment) has
one and the draft step carries its signals, the acceptance estimate of the token just drafted is the predictor's
(``tok_accept_est``, and through it ``tok_prefix_prob`` and ``tok_marginal``), and the new last feature
``tok_predicted`` says so. Without a predictor a version-4 observation is the version-3 one followed by a 0, so a
version-3 policy (which never had a predictor) still runs: it is shown its own feature list
(:data:`SUPPORTED_FEATURE_VERSIONS`). K mode is unchanged: a K chosen before drafting cannot see the predictions of
tokens not yet drafted.

Bump :data:`FEATURE_VERSION` whenever a feature's meaning, order or scaling changes: exported policies record it
and refuse to run against another version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specgym.envs.core.economics import Calibration, RoundCosts
from specgym.envs.core.kinds import TOKEN_LEVEL_MODES
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.errors import SpecgymError

FEATURE_VERSION = 4
#: The versions this code renders: the current one, and version 3 for policies trained before the predictor.
SUPPORTED_FEATURE_VERSIONS = (3, 4)
ENTROPY_SCALE = 8.0  # nats; entropies are clipped to this and scaled to [0, 1]
MARGINAL_SCALE = 3.0  # log marginal ratio, clipped to +-3 and scaled to [-1, 1]
_EMA_FAST, _EMA_MID, _EMA_SLOW, _EMA_FEAT = 0.5, 0.8, 0.95, 0.8
_ALPHA_PRIOR = 0.6  # per-token acceptance assumed before any evidence
_LOG_TOKENS, _LOG_ROUNDS = math.log1p(4096.0), math.log1p(2048.0)


@dataclass(frozen=True)
class Feature:
    """One observation entry: name, bounds and meaning."""

    name: str
    low: float
    high: float
    doc: str


ROUND_FEATURES: tuple[Feature, ...] = (
    Feature("acc_rate_ema_fast", 0, 1, "EMA (beta 0.5) of accepted/drafted over verified rounds"),
    Feature("acc_rate_ema_mid", 0, 1, "EMA (beta 0.8) of accepted/drafted"),
    Feature("acc_rate_ema_slow", 0, 1, "EMA (beta 0.95) of accepted/drafted"),
    Feature("alpha_ema", 0, 1, "EMA (beta 0.8) of accepted/min(accepted+1, drafted): per-token acceptance estimate"),
    Feature("last_k", 0, 1, "draft cap of the last round / k_max"),
    Feature("last_drafted", 0, 1, "tokens drafted in the last round / k_max"),
    Feature("last_accepted", 0, 1, "tokens accepted in the last round / k_max"),
    Feature("last_full_accept", 0, 1, "1 if every drafted token of the last round was accepted"),
    Feature("last_conf_mean", 0, 1,
            "mean draft confidence of the last round's judged tokens (accepted + first rejected)"),
    Feature("last_conf_min", 0, 1, "min draft confidence of the last round's judged tokens"),
    Feature("last_conf_last", 0, 1, "draft confidence of the last judged token of the last round"),
    Feature("last_entropy_mean", 0, 1, "mean draft entropy of the last round's judged tokens / 8 nats (clipped)"),
    Feature("conf_ema", 0, 1, "EMA (beta 0.8) of per-round mean draft confidence"),
    Feature("entropy_ema", 0, 1, "EMA (beta 0.8) of per-round mean draft entropy / 8 nats"),
    Feature("produced_ema", 0, 1, "EMA (beta 0.8) of tokens produced per round / (k_max + 1)"),
    Feature("full_streak", 0, 1, "consecutive fully accepted rounds / 8 (clipped)"),
    Feature("zero_streak", 0, 1, "consecutive rounds with nothing accepted / 8 (clipped)"),
    Feature("tokens_generated", 0, 1, "log1p(tokens generated) / log1p(4096) (clipped)"),
    Feature("rounds_played", 0, 1, "log1p(rounds) / log1p(2048) (clipped)"),
    Feature("cost_ratio", 0, 2, "draft_ms / t_AR of the cost profile (clipped to 2)"),
    Feature("verify_slope", 0, 4, "verify(k_max+1) / t_AR - 1: how much verifying more tokens costs (clipped)"),
    Feature("temperature", 0, 2, "sampling temperature (0 = greedy; clipped to 2)"),
    Feature("no_history", 0, 1, "1 before the first verified draft round of the request"),
    Feature("overhead_ratio", 0, 1, "round_overhead_ms / t_AR (clipped to 1)"),
    Feature("calib_gap", -1, 1, "EMA (beta 0.8) over judged tokens of accepted (0/1) minus draft confidence: > 0 "
                                "under-confident draft, < 0 over-confident"),
    Feature("k_model", 0, 1, "model-optimal K / k_max: argmax_K E(K)/cost(K) with the ratio-of-EMAs acceptance "
                             "estimate (relaxing towards 0.6 in rounds without drafts) and every cost term"),
)

TOKEN_FEATURES: tuple[Feature, ...] = (
    Feature("tok_index", 0, 1, "tokens drafted so far in this round / k_max"),
    Feature("tok_has_token", 0, 1, "1 once at least one token was drafted in this round"),
    Feature("tok_conf", 0, 1, "draft confidence of the token just drafted (0 before the first)"),
    Feature("tok_entropy", 0, 1, "draft entropy of the token just drafted / 8 nats"),
    Feature("tok_conf_prod", 0, 1, "product of this round's draft confidences so far (1 before the first)"),
    Feature("tok_conf_min", 0, 1, "min draft confidence in this round so far (1 before the first)"),
    Feature("tok_room", 0, 1, "remaining draft room in this round (cap - drafted) / k_max"),
    Feature("tok_accept_est", 0, 1, "acceptance probability of the token just drafted: the acceptance predictor's "
                                    "where there is one and the step carries its signals, else calibrated confidence "
                                    "(online Platt scaling); the acceptance estimate before the first"),
    Feature("tok_prefix_prob", 0, 1, "calibrated probability that every token drafted so far is accepted"),
    Feature("tok_marginal", -1, 1, "log of the marginal ratio of drafting one more token (> 0: it raises the "
                                   "round's expected rate) / 3, clipped"),
)

#: Token features added by version 4.
PREDICTOR_FEATURES: tuple[Feature, ...] = (
    Feature("tok_predicted", 0, 1, "1 if tok_accept_est of the token just drafted is the acceptance predictor's, "
                                   "0 if calibrated confidence (no predictor, or the step lacks its signals)"),
)


def check_feature_version(version: int) -> int:
    """``version`` if this code renders it, else a one-line error."""
    if version not in SUPPORTED_FEATURE_VERSIONS:
        raise SpecgymError(f"feature version {version!r}: this specgym computes versions "
                           f"{', '.join(map(str, SUPPORTED_FEATURE_VERSIONS))}: retrain and re-export the policy")
    return int(version)


def _features(mode: str, version: int = FEATURE_VERSION) -> tuple[Feature, ...]:
    if mode not in TOKEN_LEVEL_MODES:
        return ROUND_FEATURES
    return ROUND_FEATURES + TOKEN_FEATURES + (PREDICTOR_FEATURES if check_feature_version(version) >= 4 else ())


def feature_names(mode: str, version: int = FEATURE_VERSION) -> list[str]:
    """Ordered feature names of a mode (``k`` or ``token``) at a feature version."""
    return [f.name for f in _features(mode, version)]


def feature_bounds(mode: str, version: int = FEATURE_VERSION) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) float32 bounds of a mode's observation vector (at a feature version)."""
    feats = _features(mode, version)
    return (np.array([f.low for f in feats], np.float32), np.array([f.high for f in feats], np.float32))


def feature_table(mode: str) -> str:
    """Markdown-ish table of a mode's features, for docstrings and ``specgym features``."""
    feats = _features(mode)
    return "\n".join(f"{i:>2}  {f.name:<20} [{f.low:g}, {f.high:g}]  {f.doc}" for i, f in enumerate(feats))


class FeatureTracker:
    """Keeps the running statistics of one request and renders observation vectors.

    Usage: ``reset(ctx)`` at request start, ``update(outcome)`` after each verified round, ``observation()`` before
    choosing K; token mode goes through a :class:`TokenDecisionState`.

    Attributes:
        calibration: The request's online confidence calibration.
        costs: The request's round costs (None before the first ``reset(ctx)``).
        alpha_hat: Ratio-of-EMAs per-token acceptance estimate (EMA of accepted over EMA of judged tokens).
    """

    def __init__(self, k_max: int):
        self.k_max = int(k_max)
        self._kv0 = 0
        self.has_conf = True
        self._static = (0.0, 0.0, 0.0, 0.0)
        self._round_obs: list[float] = []
        self.calibration = Calibration()
        self.costs: RoundCosts | None = None
        self.reset(None)

    def reset(self, ctx: RequestContext | None) -> None:
        """Clear the request's history; read the static features (costs, temperature) from ``ctx``."""
        if ctx is not None:
            prof = ctx.profile
            t_ar = prof.t_ar_ms
            cost = min(prof.draft_ms / t_ar, 2.0)
            slope = min(max(prof.verify(min(self.k_max + 1, len(prof.verify_ms))) / t_ar - 1.0, 0.0), 4.0)
            overhead = min(prof.round_overhead_ms / t_ar, 1.0)
            self._static = (cost, slope, min(max(ctx.temperature, 0.0), 2.0), overhead)
            self.costs = RoundCosts(prof, self.k_max)
            self._kv0 = ctx.prompt_len
            self.has_conf = "draft_conf" not in ctx.lacks and "draft_entropy" not in ctx.lacks
        if self.costs is not None:
            self.costs.at_context(self._kv0)
        self.acc_fast = self.acc_mid = self.acc_slow = 0.5
        self.alpha = _ALPHA_PRIOR
        self.ema_acc, self.ema_judged = _ALPHA_PRIOR, 1.0
        self.alpha_hat = _ALPHA_PRIOR
        self.calib_gap = 0.0
        self.calibration.reset()
        self.last_k = self.last_drafted = self.last_accepted = 0.0
        self.last_full = 0.0
        self.last_conf_mean = self.last_conf_min = self.last_conf_last = 0.0
        self.last_ent = 0.0
        self.conf_ema = 0.5
        self.ent_ema = 0.0
        self.produced_ema = 1.0 / (self.k_max + 1)
        self.full_streak = self.zero_streak = 0
        self.tokens = 0
        self.rounds = 0
        self.no_history = 1.0
        self._k_model = self.costs.best_k(self.alpha_hat) / self.k_max if self.costs is not None else 0.0
        self._render_round()

    def update(self, o: RoundOutcome) -> None:
        """Fold one verified round into the statistics."""
        # the hot path of every environment step: locals and plain floats (a numpy scalar op costs ~1 us)
        k = self.k_max
        d, a = o.drafted, o.accepted
        self.tokens += o.produced
        self.rounds += 1
        self.last_k = min(o.planned_k / k, 1.0)
        self.last_drafted = d / k
        self.last_accepted = a / k
        self.produced_ema = _EMA_FEAT * self.produced_ema + (1 - _EMA_FEAT) * (o.produced / (k + 1))
        if d > 0:
            rate = a / d
            self.acc_fast = _EMA_FAST * self.acc_fast + (1 - _EMA_FAST) * rate
            self.acc_mid = _EMA_MID * self.acc_mid + (1 - _EMA_MID) * rate
            self.acc_slow = _EMA_SLOW * self.acc_slow + (1 - _EMA_SLOW) * rate
            judged = a + 1 if a < d else d  # accepted prefix + the first rejected token; later tokens never judged
            self.alpha = _EMA_MID * self.alpha + (1 - _EMA_MID) * (a / judged)
            ema_acc = self.ema_acc = _EMA_MID * self.ema_acc + (1 - _EMA_MID) * a
            ema_judged = self.ema_judged = _EMA_MID * self.ema_judged + (1 - _EMA_MID) * judged
            self.alpha_hat = ema_acc / ema_judged
            full = a == d
            self.last_full = 1.0 if full else 0.0
            self.full_streak = self.full_streak + 1 if full else 0
            self.zero_streak = self.zero_streak + 1 if a == 0 else 0
            self.no_history = 0.0
            if self.has_conf:
                self._update_conf(o, a, judged)
        else:
            # a round that drafted nothing carries no evidence: the acceptance estimate relaxes towards its prior,
            # so a controller that stopped drafting after bad luck tries again (otherwise it never would)
            self.ema_acc = _EMA_MID * self.ema_acc + (1 - _EMA_MID) * _ALPHA_PRIOR
            self.ema_judged = _EMA_MID * self.ema_judged + (1 - _EMA_MID)
            self.alpha_hat = self.ema_acc / self.ema_judged
            self.last_full = 0.0
            self.last_conf_mean = self.last_conf_min = self.last_conf_last = 0.0
            self.last_ent = 0.0
        costs = self.costs
        if costs is not None:
            if costs.has_context:
                costs.at_context(self._kv0 + self.tokens)
            self._k_model = costs.best_k(self.alpha_hat) / k
        self._render_round()

    def _update_conf(self, o: RoundOutcome, a: int, judged: int) -> None:
        """The draft-feature statistics of a round's judged tokens (skipped when the engine has no draft features:
        a per-start trace; they stay at their start values and the calibration at the identity)."""
        conf = o.draft_conf[:judged].tolist()
        self.calibration.update_round(conf, a)
        gap = self.calib_gap
        for m, c in enumerate(conf):
            gap = _EMA_MID * gap + (1 - _EMA_MID) * ((1.0 if m < a else 0.0) - c)
        self.calib_gap = gap
        conf_mean = self.last_conf_mean = sum(conf) / judged
        self.last_conf_min = min(conf)
        self.last_conf_last = conf[-1]
        ent = sum(o.draft_entropy[:judged].tolist()) / judged
        ent = self.last_ent = (ent if ent < ENTROPY_SCALE else ENTROPY_SCALE) / ENTROPY_SCALE
        self.conf_ema = _EMA_FEAT * self.conf_ema + (1 - _EMA_FEAT) * conf_mean
        self.ent_ema = _EMA_FEAT * self.ent_ema + (1 - _EMA_FEAT) * ent

    def _render_round(self) -> None:
        cost, slope, temp, overhead = self._static
        gap = self.calib_gap
        self._round_obs = [
            self.acc_fast, self.acc_mid, self.acc_slow, self.alpha,
            self.last_k, self.last_drafted, self.last_accepted, self.last_full,
            self.last_conf_mean, self.last_conf_min, self.last_conf_last, self.last_ent,
            self.conf_ema, self.ent_ema, self.produced_ema,
            (self.full_streak if self.full_streak < 8 else 8) / 8.0,
            (self.zero_streak if self.zero_streak < 8 else 8) / 8.0,
            min(math.log1p(self.tokens) / _LOG_TOKENS, 1.0), min(math.log1p(self.rounds) / _LOG_ROUNDS, 1.0),
            cost, slope, temp, self.no_history,
            overhead, -1.0 if gap < -1.0 else (1.0 if gap > 1.0 else gap), self._k_model,
        ]

    def observation(self) -> np.ndarray:
        """K-mode observation (float32, ``len(ROUND_FEATURES)``)."""
        return np.array(self._round_obs, dtype=np.float32)


class TokenDecisionState:
    """The running state of one round's token-level decisions, as the token-mode observation shows it.

    Shared by the token environment, the exported controller and behaviour cloning, so the three see the same
    observation at every decision. Decision ``j`` is taken with ``j`` tokens drafted in the round (``j = 0`` before
    the first). At ``j = 0`` the cap shown is ``k_max``: a deployed controller learns the engine's clipped cap only
    with the first draft token (:class:`DraftStep` carries it).

    Args:
        tracker: The request's :class:`FeatureTracker` (its calibration and costs price the next draft).
        version: Feature version of the observation (:data:`SUPPORTED_FEATURE_VERSIONS`; 3 omits ``tok_predicted``).
    """

    __slots__ = ("tracker", "k_max", "drafted", "cap", "conf", "entropy", "conf_prod", "conf_min", "accept_est",
                 "prefix_prob", "expected", "predicted", "_flag")

    def __init__(self, tracker: FeatureTracker, version: int = FEATURE_VERSION):
        self.tracker = tracker
        self.k_max = tracker.k_max
        self._flag = check_feature_version(version) >= 4
        self.begin_round()

    def begin_round(self) -> None:
        """A new round: nothing drafted yet."""
        self.drafted = 0
        self.cap = self.k_max
        self.conf = self.entropy = 0.0
        self.conf_prod = self.conf_min = 1.0
        self.accept_est = self.tracker.alpha_hat
        self.prefix_prob = 1.0
        self.expected = 1.0  # tokens the round produces if it verifies now: the target's own token
        self.predicted = False

    def add(self, step: DraftStep, accept: float | None = None) -> None:
        """Fold in the draft token just proposed; ``accept`` (a predictor's acceptance probability) replaces the
        calibrated confidence as its acceptance estimate when given. On an engine without draft features
        (``RequestContext.lacks``) the calibrated estimate is a single bin, the running acceptance estimate
        ``alpha_hat``, and the confidence features keep their values before the first token."""
        self.drafted = step.index
        self.cap = step.cap
        if self.tracker.has_conf:
            self.conf, self.entropy = step.conf, step.entropy
            self.conf_prod *= step.conf
            if step.conf < self.conf_min:
                self.conf_min = step.conf
            calibrated = self.tracker.calibration.accept_prob(step.conf)
        else:  # no draft features: calibration by a single bin, the request's running acceptance estimate
            calibrated = self.tracker.alpha_hat
        self.accept_est = calibrated if accept is None else accept
        self.predicted = accept is not None
        self.prefix_prob *= self.accept_est
        self.expected += self.prefix_prob

    def marginal_ratio(self) -> float:
        """The marginal ratio of drafting one more token now (:meth:`RoundCosts.marginal_ratio`)."""
        costs = self.tracker.costs
        if costs is None or self.drafted >= self.k_max:
            return 0.0
        return costs.marginal_ratio(self.drafted, self.expected, self.prefix_prob, self.accept_est)

    def observation(self) -> np.ndarray:
        """The token-mode observation of the current decision."""
        k = self.k_max
        has = self.drafted > 0
        ratio = self.marginal_ratio()
        log_ratio = math.log(ratio) if ratio > 0.0 else -MARGINAL_SCALE
        tok = [
            self.drafted / k, 1.0 if has else 0.0, self.conf if has else 0.0,
            (min(self.entropy, ENTROPY_SCALE) / ENTROPY_SCALE) if has else 0.0,
            self.conf_prod, self.conf_min, (self.cap - self.drafted) / k,
            self.accept_est, self.prefix_prob, max(-1.0, min(1.0, log_ratio / MARGINAL_SCALE)),
        ]
        if self._flag:
            tok.append(1.0 if self.predicted else 0.0)
        return np.array(self.tracker._round_obs + tok, dtype=np.float32)
