"""ConfidenceStop: stop drafting after a low-confidence draft token.

Source: transformers' ``assistant_confidence_threshold`` (``AssistedCandidateGenerator``,
``src/transformers/generation/candidate_generator.py``, read at commit 00a11b6a0745b442473aef0221e098d022b8158c;
the DISCO line of work uses the same stop signal). ``GenerationConfig``'s docstring: "If the assistant model's
confidence in its prediction for the current token is lower than this threshold, the assistant model stops the
current token generation iteration, even if the number of speculative tokens is not yet reached." Default 0.4.
Adaptive threshold, from ``update_candidate_strategy``:

    self.matches.extend([1] * num_matches)
    if len(self.probs) > len(self.matches): self.matches.append(0)
    ...drop the probs beyond len(self.matches)...
    fpr, tpr, thresholds = roc_curve(self.matches, self.probs); fnr = 1 - tpr
    costs = fpr + 3 * fnr      # "A cost of 25% is assigned to false positives and 75% to false negatives"
    threshold = thresholds[argmin(costs)]

Rule here: the cap is k_max; after drafted token j, ``keep_drafting`` returns False iff ``conf_j < tau``.

Choices (documented and tested):

* Labels: drafted token j of a round is positive ("accepted") iff ``j <= accepted``; the first rejected token
  (``j == accepted + 1``) is negative; tokens after the first rejection are **excluded** -- the target never
  judged them (and in replay their confidences come from the correct-prefix trace), exactly as transformers
  truncates ``probs`` to ``matches``.
* Positive class = accepted; a token is "predicted positive" (keep drafting) iff ``conf >= tau``. So
  fpr = share of rejected tokens we would have kept drafting past (wasted draft + verify work) and
  fnr = share of accepted tokens at which we would have stopped (lost tokens); fnr costs 3x.
* Refit starts once **both** classes have more than ``min_class_samples`` (5) samples (transformers
  only needs > 5 samples in all and one of each). Thresholds are the distinct observed confidences (as
  ``roc_curve`` without dropping collinear points); ties in cost go to the highest threshold (``argmin`` over
  descending thresholds, like transformers).
* Like transformers, samples are per request (cleared by ``reset``) while the fitted tau carries over to the
  next request; ``keep_samples_across_requests=True`` keeps them (bounded by ``max_samples``, oldest dropped).
"""

from __future__ import annotations

import numpy as np

from specgym.baselines.token_stop import TokenStopController
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome


def roc_threshold(conf: np.ndarray, accepted: np.ndarray, fp_cost: float = 1.0, fn_cost: float = 3.0) -> float:
    """Threshold ``t`` (a sample value; predict accepted iff conf >= t) minimising ``fp_cost*fpr + fn_cost*fnr``.

    Args:
        conf: Draft confidences, shape ``(n,)``.
        accepted: Labels (True = accepted, the positive class), shape ``(n,)``; both classes must be present.
    """
    order = np.argsort(-conf, kind="stable")
    c = conf[order]
    lab = accepted[order]
    tp = np.cumsum(lab)
    fp = np.arange(1, c.size + 1) - tp
    last = np.flatnonzero(np.diff(c) != 0)  # last index of each run of equal confidences
    ends = np.append(last, c.size - 1)
    n_pos, n_neg = tp[-1], fp[-1]
    cost = fp_cost * fp[ends] / n_neg + fn_cost * (1.0 - tp[ends] / n_pos)
    return float(c[ends[int(np.argmin(cost))]])


class ConfidenceStop(TokenStopController):
    """Draft up to k_max, stop after the first token with draft confidence below tau (optionally ROC-adapted).

    Args:
        tau: Confidence threshold (0.4); the starting value in adaptive mode.
        adaptive: Refit tau from observed (confidence, accepted?) pairs.
        fp_cost: Weight of the false-positive rate in the ROC cost (1).
        fn_cost: Weight of the false-negative rate (3).
        min_class_samples: Refit only when each class has more than this many samples (5).
        max_samples: Ring-buffer size of the sample window (4096).
        refit_every: Refit tau after every this many rounds that added samples (1 = every round, like transformers).
        keep_samples_across_requests: Keep samples over ``reset`` (transformers clears them per generate call).
        k_max: Draft cap; ``None`` = ``ctx.k_max``.
    """

    needs = frozenset({"draft_conf"})

    def __init__(
        self,
        tau: float = 0.4,
        adaptive: bool = False,
        fp_cost: float = 1.0,
        fn_cost: float = 3.0,
        min_class_samples: int = 5,
        max_samples: int = 4096,
        refit_every: int = 1,
        keep_samples_across_requests: bool = False,
        k_max: int | None = None,
    ) -> None:
        self.tau0 = self.tau = float(tau)
        self.adaptive = adaptive
        self.fp_cost, self.fn_cost, self.min_class_samples = fp_cost, fn_cost, min_class_samples
        self.max_samples, self.refit_every = max_samples, max(1, refit_every)
        self.keep_samples_across_requests = keep_samples_across_requests
        self.k_max = k_max
        self.name = "confidence:adaptive" if adaptive else f"confidence:{self.tau:g}"
        self._conf = np.zeros(max_samples, dtype=np.float64)
        self._lab = np.zeros(max_samples, dtype=bool)
        self._clear()
        super().__init__(k_max)

    def _clear(self) -> None:
        self._size = 0  # valid samples in the ring buffer
        self._head = 0  # next write slot
        self._n_pos = 0
        self._pending = 0  # rounds with new samples since the last refit

    def reset(self, ctx: RequestContext) -> None:
        """New request; samples are cleared unless kept across requests, tau is kept."""
        super().reset(ctx)
        if not self.keep_samples_across_requests:
            self._clear()

    def keep_drafting(self, step: DraftStep) -> bool:
        """Continue iff the token just drafted has confidence >= tau."""
        return step.conf >= self.tau

    def observe(self, outcome: RoundOutcome) -> None:
        """In adaptive mode, record the judged tokens' (conf, accepted?) pairs and refit tau."""
        if not self.adaptive or outcome.drafted <= 0:
            return
        a = outcome.accepted
        n = min(a + 1, outcome.drafted)  # accepted tokens + the first rejected one; later tokens excluded
        conf = outcome.draft_conf
        cap, buf, lab = self.max_samples, self._conf, self._lab
        for j in range(n):
            h = self._head
            if self._size == cap:
                self._n_pos -= bool(lab[h])
            else:
                self._size += 1
            positive = j < a
            buf[h] = conf[j]
            lab[h] = positive
            self._n_pos += positive
            self._head = h + 1 if h + 1 < cap else 0
        self._pending += 1
        if self._pending >= self.refit_every:
            n_pos, n_neg = self._n_pos, self._size - self._n_pos
            if n_pos > self.min_class_samples and n_neg > self.min_class_samples:
                self._pending = 0
                self.tau = roc_threshold(buf[: self._size], lab[: self._size], self.fp_cost, self.fn_cost)
