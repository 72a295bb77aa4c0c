"""PredictedMarginal (``predicted:NAME``): the cost-aware marginal rule on a learned acceptance predictor.

The marginal rule (:mod:`specgym.baselines.marginal`) drafts on while one more token raises the round's expected
rate; the quality of that rule is the quality of its per-token acceptance estimate. ``marginal`` estimates it from
the draft's confidence, calibrated online; this controller asks a trained
:class:`~specgym.envs.core.acceptance_predictor.AcceptancePredictor` instead, which also reads the recorded context
signals (the draft's top-k shape, the context lookup). Everything else — costs, the expected-tokens arithmetic, the
decision before the first token, the online calibration it falls back on — is the marginal rule's, unchanged.

Where a draft step lacks a signal the predictor reads (a trace without v2 columns, an engine without lookups) the
step falls back to calibrated confidence, so on such input this controller decides exactly as ``marginal``.
Before a workload or an engine is served, :meth:`PredictedMarginal.bind_signals` checks that it can feed the
predictor (:meth:`~specgym.envs.core.acceptance_predictor.AcceptancePredictor.for_source`): another pair's is
refused; a missing signal group or another hidden sketch makes the predictor's fallback predict, with one note.

**On the draft head** (``predicted:NAME@head``, :class:`~specgym.baselines.drafter_chain.ChainOnDrafter`): a predictor
trained on the head's tokens (``specgym predictor train --drafter head``; its ``drafter`` is ``head``) reads the head's
top-8 probabilities at each of its draft tokens (``DraftStep.drafter_topk``; greedy requests of a recording with
``topk_head`` or of a live engine with a head) and nothing else, so it needs only the head's confidence. A predictor
and the drafter it is served on must agree, else it is refused in one line naming the file and the fix
(:meth:`PredictedMarginal.serve_drafter`: a draft-model predictor ``@head``, a head predictor without ``@head``).

Predictors: a shipped name (``data/predictors/NAME.json``, e.g. the pair's) or a path to a predictor JSON file
(``specgym predictor train``).
"""

from __future__ import annotations

from pathlib import Path

import specgym.catalogue as catalogue
from specgym.baselines.marginal import MarginalStop
from specgym.envs.core.acceptance_predictor import AcceptancePredictor, SignalSource, load_predictor
from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER
from specgym.envs.core.rounds import DraftStep, RequestContext
from specgym.errors import SpecgymError


class PredictedMarginal(MarginalStop):
    """The marginal rule with the predictor's acceptance probability per draft token.

    Args:
        predictor: A loaded predictor.
        name: Row name (default ``predicted:<predictor name>``).
        threshold: The marginal ratio above which a draft token the predictor priced is followed by another
            (default: the predictor's own, chosen on validation); also the threshold of the decision to open a
            round once the engine has shown it carries the predictor's signals. Until then, and for every step
            lacking them, ``marginal``'s threshold of 1: without signals this controller is ``marginal``.
        file: The predictor's file, for messages (default: its name).

    Attributes:
        serves: The drafter whose tokens it decides (:meth:`serve_drafter`; default the pair's draft model).
    """

    needs = frozenset({"draft_conf", "draft_entropy"})  # the predictor reads them

    def __init__(self, predictor: AcceptancePredictor, name: str | None = None,
                 threshold: float | None = None, file: str | Path | None = None) -> None:
        super().__init__(1.0)
        if predictor.on_head:  # the head's top-8, which travels with its confidence: never an entropy
            self.needs = frozenset({"draft_conf"})
        self.file = str(file) if file is not None else predictor.name
        self.serves: str = IMPLICIT_DRAFTER
        self.predicted_threshold = predictor.threshold if threshold is None else float(threshold)
        self.predictor = predictor
        self.active: AcceptancePredictor | None = predictor  # the model of its chain the source can feed
        self.protocol.predictor = predictor
        self.name = name or f"predicted:{predictor.name}"
        self.predicted = 0  # draft tokens priced by the predictor (the rest fell back to calibrated confidence)
        self.fallbacks = 0
        self._signals = False  # the engine's steps carry the predictor's signals

    def serve_drafter(self, drafter: str) -> None:
        """Decide the K of ``drafter``'s rounds (called by the chain rule on a drafter, ``predicted:NAME@DRAFTER``).

        Raises:
            SpecgymError: the predictor predicts another drafter's tokens (one line naming its file and the fix).
        """
        mine = self.predictor.drafter
        if mine != drafter:
            raise SpecgymError(self._mismatch(drafter))
        self.serves = drafter

    def _mismatch(self, drafter: str) -> str:
        """The one-line refusal of serving ``drafter``'s tokens with a predictor of another drafter's."""
        if self.predictor.on_head:
            at = "" if drafter == IMPLICIT_DRAFTER else f"@{drafter}"
            return (f"{self.name}{at}: predictor {self.file} predicts the draft head's tokens (trained with "
                    f"--drafter head): use it as {self.name}@{HEAD_DRAFTER}")
        return (f"{self.name}@{drafter}: predictor {self.file} predicts the draft model's tokens and reads their "
                f"draft_entropy, which the {drafter}'s rounds do not carry: train one on the draft head's with "
                f"specgym predictor train --drafter head --workload W --out P.json, then use predicted:P.json@head")

    def bind_signals(self, src: SignalSource) -> str | None:
        """Predict with the model of the predictor's chain that ``src`` feeds from now on; returns the note of a
        fallback (another pair is refused: :meth:`AcceptancePredictor.for_source`; so is a predictor of another
        drafter's tokens than those this controller decides: :meth:`serve_drafter`)."""
        if self.predictor.drafter != self.serves:
            raise SpecgymError(self._mismatch(self.serves))
        self.active, note = self.predictor.for_source(src)
        self.protocol.predictor = self.active
        return note

    def reset(self, ctx: RequestContext) -> None:
        """New request (see :class:`MarginalStop`); a predictor of another drafter's tokens is refused here too,
        where nothing bound it first."""
        if self.predictor.drafter != self.serves:
            raise SpecgymError(self._mismatch(self.serves))
        super().reset(ctx)

    def propose(self) -> int:
        """0 (plain step) if even the first draft token does not pay, else the cap (see :class:`MarginalStop`)."""
        self.decisions.begin_round()
        threshold = self.predicted_threshold if self._signals else self.threshold
        return self._cap if self.decisions.marginal_ratio() > threshold else 0

    def keep_drafting(self, step: DraftStep) -> bool:
        """Draft on iff one more token raises the round's expected rate, with the predicted acceptance."""
        p = self._fold(step)
        return self.decisions.marginal_ratio() > (self.threshold if p is None else self.predicted_threshold)

    def _fold(self, step: DraftStep) -> float | None:
        """Fold the draft token in through the token protocol; count whether the predictor priced it."""
        p = self.protocol.fold(step)
        if p is None:
            self.fallbacks += 1
        else:
            self.predicted += 1
            self._signals = True
        return p


def make_predicted(arg: str | None, k_max: int) -> PredictedMarginal:
    """Registry factory of ``predicted:NAME|PATH`` (``@DRAFTER`` is taken off by the spec parser, which wraps it in
    :class:`~specgym.baselines.drafter_chain.ChainOnDrafter`)."""
    if not arg:
        raise SpecgymError("predicted needs a shipped predictor name or a predictor .json path, e.g. predicted:midpair")
    path = catalogue.resolve("predictor", arg)
    return PredictedMarginal(load_predictor(path), name=f"predicted:{arg}", file=path)
