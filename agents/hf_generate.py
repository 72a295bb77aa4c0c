"""Drive transformers' assisted generation with any specgym :class:`Controller`.

One call::

    from specgym.agents.hf_generate import generate_with_controller
    out = generate_with_controller(target, draft, input_ids, controller, max_new_tokens=128)

runs ``target.generate(input_ids, assistant_model=draft, ...)`` with a candidate generator that asks the
controller for the number of draft tokens each round (``propose``), lets a token-level controller stop drafting
after any draft token (``keep_drafting``, through a stopping criterion on the assistant's generate), and reports
every verified round to the controller (``observe``) as a :class:`RoundOutcome`. transformers' own adaptivity is
disabled (``num_assistant_tokens_schedule="constant"``, ``assistant_confidence_threshold=0``), so the controller
alone decides. With ``do_sample=False`` the output is identical to plain greedy ``target.generate()``.

How it hooks in (transformers 5.x): ``generate`` builds its candidate generator with the model's
``_get_candidate_generator``; the helper shadows that method on the target instance for the duration of the call
(and removes the shadow afterwards, also on error). The generator subclasses ``AssistedCandidateGenerator`` and
overrides ``get_candidates`` (K per round), ``_prepare_generation_args`` (token-level stops) and
``update_candidate_strategy`` (the verified outcome goes to the controller).

transformers' assistant stops drafting at EOS (the draft model's generation config), even when the target's
``eos_token_id`` is None; the controller then sees ``drafted < planned_k`` for that round.

Round time in the :class:`RoundOutcome` is the wall clock from ``get_candidates`` to ``update_candidate_strategy``
(draft + verify of that round).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from specgym.baselines.base import Controller
from specgym.envs.cost import CostProfile
from specgym.envs.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.errors import SpecgymError

try:  # transformers is an optional dependency (extra "hf")
    import torch
    from transformers.generation.candidate_generator import AssistedCandidateGenerator
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
except ImportError:  # pragma: no cover - reported by generate_with_controller
    AssistedCandidateGenerator = object  # type: ignore[misc,assignment]
    StoppingCriteria = object  # type: ignore[misc,assignment]
    StoppingCriteriaList = None  # type: ignore[assignment]


class _ControllerStop(StoppingCriteria):
    """Stopping criterion on the assistant's generate: records draft features and asks ``keep_drafting``."""

    def __init__(self, gen: "ControllerCandidateGenerator"):
        self.gen = gen

    def __call__(self, input_ids, scores, **kwargs):
        g = self.gen
        logits = scores[-1][0].float()
        probs = torch.softmax(logits, -1)
        tok = int(input_ids[0, -1])
        conf = float(probs[tok])
        ent = float(-(probs * torch.log(probs.clamp_min(1e-30))).sum())
        g._conf.append(conf)
        g._ent.append(ent)
        j = len(g._conf)
        stop = False
        if g.controller.token_level and j < g._cap:
            stop = not g.controller.keep_drafting(DraftStep(j, g._cap, g._position + j - 1, conf, ent))
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class ControllerCandidateGenerator(AssistedCandidateGenerator):
    """An ``AssistedCandidateGenerator`` whose draft length per round comes from a specgym controller.

    Args:
        controller: The controller (reset here with a :class:`RequestContext` for this generate call).
        k_max: Largest draft cap.
        profile: Costs shown to the controller in its context (optional; a flat placeholder otherwise).
        rounds: If given, every :class:`RoundOutcome` is appended to it.
        *args, **kwargs: ``AssistedCandidateGenerator``'s own arguments.
    """

    def __init__(self, *args, controller: Controller, k_max: int = 8, profile: CostProfile | None = None,
                 rounds: list | None = None, temperature: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.controller = controller
        self.k_max = k_max
        self.rounds = rounds
        # the controller alone decides: no built-in schedule, no confidence-threshold stopping
        self.assistant_generation_config.num_assistant_tokens_schedule = "constant"
        self.assistant_generation_config.assistant_confidence_threshold = 0.0
        self.generation_config.assistant_confidence_threshold = 0.0
        self.assistant_confidence_threshold = 0.0
        input_ids = args[0] if args else kwargs["input_ids"]
        self.prompt_len = int(input_ids.shape[-1])
        if profile is not None:
            verify = profile.verify_table(k_max)
            ctx = RequestContext("generate", "live", temperature, self.prompt_len, k_max, profile.draft_ms, verify,
                                 profile.round_overhead_ms)
        else:
            ctx = RequestContext("generate", "live", temperature, self.prompt_len, k_max, 1.0,
                                 (0.0,) + (10.0,) * (k_max + 1))
        controller.reset(ctx)
        self._cap = 0
        self._position = 0
        self._conf: list[float] = []
        self._ent: list[float] = []
        self._t0 = 0.0

    def get_candidates(self, input_ids, **kwargs):
        """Ask the controller for K, clip it, and draft up to that many tokens."""
        self._t0 = time.perf_counter()
        k = int(self.controller.propose())
        if k < 0:
            raise SpecgymError(f"controller proposed K={k}; K must be >= 0")
        cur = int(input_ids.shape[-1])
        self._position = cur - self.prompt_len
        remaining = self.main_model_max_length - cur  # tokens still to generate, this round's included
        self._cap = max(0, min(k, self.k_max, remaining - 1))
        self.num_assistant_tokens = self._cap
        self._conf, self._ent = [], []
        return super().get_candidates(input_ids, **kwargs)

    def _prepare_generation_args(self, input_ids, min_new_tokens: int, max_new_tokens: int) -> dict:
        args = super()._prepare_generation_args(input_ids, min_new_tokens, max_new_tokens)
        args["stopping_criteria"] = StoppingCriteriaList([_ControllerStop(self)])
        return args

    def update_candidate_strategy(self, input_ids, scores, num_matches: int):
        """Report the verified round to the controller (instead of transformers' heuristic)."""
        drafted = int(scores.shape[1]) - 1
        accepted = int(num_matches)
        outcome = RoundOutcome(
            self._position, self._cap, drafted, accepted, accepted + 1, (time.perf_counter() - self._t0) * 1000.0,
            np.asarray(self._conf[:drafted], dtype=np.float32), np.asarray(self._ent[:drafted], dtype=np.float32),
            done=int(input_ids.shape[-1]) >= self.main_model_max_length,
        )
        if self.rounds is not None:
            self.rounds.append(outcome)
        self.controller.observe(outcome)


def generate_with_controller(target, draft, input_ids, controller: Controller, *, k_max: int = 8,
                             profile: CostProfile | None = None, rounds: list | None = None,
                             **generate_kwargs: Any):
    """``target.generate(input_ids, assistant_model=draft, **generate_kwargs)`` with ``controller`` choosing K.

    Args:
        target: The target ``PreTrainedModel``.
        draft: The assistant model (same tokenizer).
        input_ids: ``(1, L)`` prompt ids (assisted generation supports batch size 1).
        controller: Any specgym controller.
        k_max: Largest draft cap per round.
        profile: Cost profile for the controller's context (cost-aware controllers such as SpecLane).
        rounds: Optional list that receives one :class:`RoundOutcome` per round.
        **generate_kwargs: Passed to ``generate`` (``max_new_tokens``, ``do_sample``, ``attention_mask``...).

    Returns:
        Whatever ``target.generate`` returns (identical tokens to plain greedy generate when ``do_sample=False``).
    """
    if StoppingCriteriaList is None:
        raise SpecgymError("generate_with_controller needs transformers; install specgym[hf]")
    if input_ids.shape[0] != 1:
        raise SpecgymError(f"assisted generation supports batch size 1, got {input_ids.shape[0]}")
    temperature = float(generate_kwargs.get("temperature", 1.0)) if generate_kwargs.get("do_sample") else 0.0

    def factory(generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs, assistant_model=None,
                **_ignored):
        return ControllerCandidateGenerator(
            input_ids=input_ids, assistant_model=assistant_model, generation_config=generation_config,
            model_kwargs=model_kwargs, inputs_tensor=inputs_tensor, logits_processor=logits_processor,
            controller=controller, k_max=k_max, profile=profile, rounds=rounds, temperature=temperature,
        )

    target._get_candidate_generator = factory
    try:
        return target.generate(input_ids, assistant_model=draft, **generate_kwargs)
    finally:
        del target._get_candidate_generator
