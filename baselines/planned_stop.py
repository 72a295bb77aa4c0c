"""PlannedStop (``planned:NAME``): optimal stopping on a learned acceptance predictor.

``predicted:NAME`` feeds the predictor's acceptance probability to the myopic marginal rule, whose threshold then
has to be tuned below 1 to make up for what it cannot see: that a repeated span goes on. This controller plans for
it instead: after each draft token it asks the predictor for the token's acceptance probability and consults the
optimal stopping tables (:class:`~specgym.envs.core.stopping_plan.StoppingPlan`) built from the cost profile and the
predictor's continuation model (how a prediction is followed by the next, fitted on the train split with the
predictor). Sequential and deployable: it sees only the tokens drafted so far.

The decision to open a round is the plan's too once the engine has shown that it carries the predictor's signals;
before that, and at every draft step lacking them, the controller decides as ``predicted:`` (which is ``marginal``
without signals), so on a trace without v2 signals it decides exactly as ``marginal``.
"""

from __future__ import annotations

import specgym.catalogue as catalogue
from specgym.baselines.predicted_marginal import PredictedMarginal
from specgym.envs.core.acceptance_predictor import AcceptancePredictor, load_draft_predictor
from specgym.envs.core.rounds import DraftStep, RequestContext
from specgym.envs.core.stopping_plan import StoppingPlan
from specgym.errors import SpecgymError


class PlannedStop(PredictedMarginal):
    """Draft on while the planned gain of continuing is positive (see the module docstring).

    Args:
        predictor: A loaded predictor that carries continuation models (``specgym predictor train`` fits them).
        name: Row name (default ``planned:<predictor name>``).
    """

    def __init__(self, predictor: AcceptancePredictor, name: str | None = None) -> None:
        if not predictor.continuation:
            raise SpecgymError(f"predictor {predictor.name!r} has no continuation model: retrain it with "
                               f"specgym predictor train (planned: needs one)")
        super().__init__(predictor, name=name or f"planned:{predictor.name}")
        self._plans: dict[tuple[object, ...], StoppingPlan] = {}
        self._plan: StoppingPlan | None = None

    def reset(self, ctx: RequestContext) -> None:
        """New request: the stopping tables of its cost profile and temperature (built once, then cached)."""
        super().reset(ctx)
        group = "greedy" if ctx.temperature == 0.0 else "sampled"
        model = self.predictor.continuation.get(group) or next(iter(self.predictor.continuation.values()))
        costs = self.tracker.costs
        assert costs is not None
        key = (group, tuple(costs.cost))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = StoppingPlan(model, costs)
        self._plan = plan

    def propose(self) -> int:
        """The cap if the plan expects an opened round to beat a plain step (``predicted:``'s rule until the engine
        has shown the predictor's signals), else 0."""
        if not self._signals or self._plan is None:
            return super().propose()
        self.decisions.begin_round()
        return self._cap if self._plan.open_gain > 0.0 else 0

    def keep_drafting(self, step: DraftStep) -> bool:
        """Draft on iff the planned gain of continuing after this token is positive."""
        p = self._fold(step)
        if p is None:
            return self.decisions.marginal_ratio() > self.threshold
        assert self._plan is not None
        return self._plan.keep_drafting(step.index, self.decisions.prefix_prob, p)


def make_planned(arg: str | None, k_max: int) -> PlannedStop:
    """Registry factory of ``planned:NAME|PATH``."""
    if not arg:
        raise SpecgymError("planned needs a shipped predictor name or a predictor .json path, e.g. planned:midpair")
    return PlannedStop(load_draft_predictor(catalogue.resolve("predictor", arg), f"planned:{arg}"),
                       name=f"planned:{arg}")
