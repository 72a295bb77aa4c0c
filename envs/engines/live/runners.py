"""One live request of a controller, by its decision kind: the live counterpart of the replay runners.

Each decision kind's row (:data:`specgym.envs.core.kinds.KIND_ROWS`) names its live runner (``live_runner``), as it
names its replay runner; :func:`run_live` picks it. ``specgym generate`` and the live bench run every controller
through it, by the kind of the row they built (a learned row's kind follows the policy it loaded), never by a
spec's name. A runner decodes one :class:`LiveCall` on a :class:`~specgym.envs.engines.live.engine.LiveEngine`:

* ``chain``: the engine's own round loop (a draft cap per round, or a stop per draft token; ``None``: plain);
* ``tree``: live tree verification (greedy), :func:`~specgym.envs.engines.live.tree.run_live_tree`;
* ``drafter``: the drafter and cap of each round, :func:`~specgym.envs.core.drafter_choice.drive_drafters`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specgym.envs.core.drafter_choice import drive_drafters
from specgym.envs.core.kinds import kind_row, load_runner, runs_in
from specgym.envs.engines.live.engine import LiveEngine, LiveResult
from specgym.envs.engines.live.tree import LiveTreeResult, run_live_tree
from specgym.errors import SpecgymError


@dataclass(frozen=True)
class LiveCall:
    """One request to decode live.

    Attributes:
        prompt_ids: The prompt's token ids.
        max_new_tokens: The completion length (fewer where ``stop_at_eos`` ends it).
        temperature: 0 = greedy; above 0, exact speculative sampling (chain and drafter kinds).
        seed: The sampling seed.
        stop_at_eos: End the completion at the target's EOS token.
        request_id: How the request is named in its context (reports, controllers' messages).
        category: Its category label.
    """

    prompt_ids: Sequence[int]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stop_at_eos: bool = False
    request_id: str = "live"
    category: str = "live"


def run_chain(engine: LiveEngine, controller: Any, call: LiveCall) -> LiveResult:
    """A chain controller (``None``: plain decoding) on the engine's round loop."""
    return engine.run_request(call.prompt_ids, controller, call.max_new_tokens, call.temperature, call.seed,
                              call.request_id, call.category, stop_at_eos=call.stop_at_eos)


def run_tree(engine: LiveEngine, controller: Any, call: LiveCall) -> LiveTreeResult:
    """A tree controller, each round's tree verified in one target forward (greedy only), drafted by the draft model
    or, where the controller names ``drafter = "head"`` (``TREE_SPEC@head``), by the pair's draft head."""
    if call.temperature != 0:
        raise SpecgymError(f"{controller.name}: live tree verification is greedy (temperature 0), not "
                           f"{call.temperature:g}: tree speculative sampling is not implemented")
    return run_live_tree(engine, call.prompt_ids, controller, call.max_new_tokens, call.request_id, call.category,
                         stop_at_eos=call.stop_at_eos)


def run_drafter(engine: LiveEngine, controller: Any, call: LiveCall) -> LiveResult:
    """A drafter-choice controller: the drafter and cap of every round among the engine's drafters."""
    req = engine.start(call.prompt_ids, call.max_new_tokens, call.temperature, call.seed,
                       stop_at_eos=call.stop_at_eos, request_id=call.request_id, category=call.category)
    drive_drafters(controller, req, engine.drafter_names)
    return req.result


def live_runner(kind: str) -> Callable[[LiveEngine, Any, LiveCall], Any] | None:
    """The live runner its kind's row names (:attr:`~specgym.envs.core.kinds.DecisionKind.live_runner`), or None
    for a kind no live engine runs (a batch kind decides serving steps)."""
    return load_runner(kind_row(kind).live_runner)


def run_live(engine: LiveEngine, kind: str, controller: Any, call: LiveCall) -> Any:
    """Decode ``call`` with ``controller`` by the live runner of decision kind ``kind``.

    Returns:
        The runner's result: ``tokens``, ``rounds``, ``drafted``, ``accepted`` and ``time_ms`` for every kind.
    """
    runner = live_runner(kind)
    if runner is None:
        raise SpecgymError(f"{getattr(controller, 'name', controller)}: a {kind_row(kind).label} controller does "
                           f"not run on a live engine{runs_in(kind)}")
    return runner(engine, controller, call)
