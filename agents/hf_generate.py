"""Drive transformers' assisted generation with any specgym :class:`Controller`.

One call::

    from specgym.agents.hf_generate import generate_with_controller
    out = generate_with_controller(target, draft, input_ids, controller, max_new_tokens=128)

runs ``target.generate(input_ids, assistant_model=draft, ...)`` with a candidate generator that runs the controller
through an :class:`~specgym.envs.core.request.Episode` (the steps of the ``drive`` loop every specgym engine uses):
K each round (``propose``), a token-level controller may stop drafting after any draft token (``keep_drafting``,
through a stopping criterion on the assistant's generate), and every verified round is reported (``observe``) as a
:class:`RoundOutcome`. transformers' own adaptivity is disabled (``num_assistant_tokens_schedule="constant"``,
``assistant_confidence_threshold=0``), so the controller alone decides. With ``do_sample=False`` the output is
identical to plain greedy ``target.generate()``.

How it hooks in (transformers 5.x): ``generate`` builds its candidate generator with the model's
``_get_candidate_generator``; the helper shadows that method on the target instance for the duration of the call
(and removes the shadow afterwards, also on error). The generator subclasses ``AssistedCandidateGenerator`` and
overrides ``get_candidates`` (K per round), ``_prepare_generation_args`` (token-level stops) and
``update_candidate_strategy`` (the verified outcome goes to the controller).

transformers' assistant stops drafting at EOS (the draft model's generation config), even when the target's
``eos_token_id`` is None; the controller then sees ``drafted < planned_k`` for that round.

Round time in the :class:`RoundOutcome` is the wall clock from ``get_candidates`` to ``update_candidate_strategy``
(draft + verify of that round). Draft features come from
:func:`~specgym.envs.engines.live.draft_stats.draft_stats` over the assistant's scores (already tempered by its logits
processors), the definition the live engine and the recorder use. The pre-verification signals
(:class:`~specgym.envs.core.signals.DraftSignals` in ``DraftStep.signals`` and ``RoundOutcome.signals``) are those
of the live engine: the top-8 probabilities of the same scores, and the context lookup from an incremental n-gram
index over the prompt and the accepted tokens (O(1) per token; each round's drafts are appended tentatively and
rolled back at the next round). The hidden sketch is not available here (transformers' assistant loop does not
expose the draft's hidden states to a stopping criterion): ``hidden_sketch`` is ``None``.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np

from specgym.envs.core.acceptance_predictor import SignalSource, bind_signals, model_signature
from specgym.envs.core.controller import Controller
from specgym.envs.core.cost import CostProfile, placeholder_profile
from specgym.envs.core.lookup import NGramIndex
from specgym.envs.core.request import Episode
from specgym.envs.core.rounds import DEFAULT_K_MAX, DraftStep, RequestContext, RoundOutcome
from specgym.envs.core.signals import TOPK, DraftSignals, SignalColumns
from specgym.envs.engines.live.clock import timed
from specgym.envs.engines.live.draft_stats import draft_stats, top_probs
from specgym.envs.engines.live.draft_vocab import output_rows
from specgym.errors import SpecgymError
from specgym.paths import MODEL_ROOTS

try:  # transformers is an optional dependency (extra "hf")
    import torch
    from transformers.generation.candidate_generator import AssistedCandidateGenerator
    from transformers.generation.logits_process import LogitsProcessor, LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
except ImportError:  # pragma: no cover - reported by generate_with_controller
    AssistedCandidateGenerator = object  # type: ignore[misc,assignment]
    LogitsProcessor = object  # type: ignore[misc,assignment]
    StoppingCriteria = object  # type: ignore[misc,assignment]
    StoppingCriteriaList = None  # type: ignore[assignment,misc]


class _TokenizerSpace(LogitsProcessor):
    """Scores only the first ``vocab`` ids: a target padded past its tokenizer never emits a padding row's id
    (the live engine's token space too; greedy output is plain generate()'s wherever that picks no padding id)."""

    def __init__(self, vocab: int):
        self.vocab = int(vocab)

    def __call__(self, input_ids, scores):
        scores[:, self.vocab:] = float("-inf")
        return scores


class _ControllerStop(StoppingCriteria):
    """Stopping criterion on the assistant's generate: records draft features and asks ``keep_drafting``."""

    def __init__(self, gen: ControllerCandidateGenerator):
        self.gen = gen

    def __call__(self, input_ids, scores, **kwargs):
        g = self.gen
        # the scores are the assistant's processed logits: already tempered, so no further temperature here
        st = draft_stats(scores[-1][:1], 1.0, tokens=input_ids[:1, -1])
        conf, ent = float(st.conf[0]), float(st.entropy[0])
        g._conf.append(conf)
        g._ent.append(ent)
        j = len(g._conf)
        signals = None
        topk, lens, agree = g._rows
        if j <= len(lens):
            tok = int(input_ids[0, -1])
            n, cont = g._index.lookup()  # the index holds the sequence before this draft token
            g._index.append(tok)
            topk[j - 1] = top_probs(st.probs)[0].cpu().numpy()
            lens[j - 1] = n
            agree[j - 1] = n > 0 and cont == tok
            signals = DraftSignals(g._signals, 0, j)
        stop = False
        keep = g.episode.keep_drafting
        if keep is not None and j < g._cap:
            stop = not keep(DraftStep(j, g._cap, g._position + j - 1, conf, ent, signals))
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

    def __init__(self, *args, controller: Controller, k_max: int = DEFAULT_K_MAX, profile: CostProfile | None = None,
                 rounds: list | None = None, temperature: float = 0.0, target_vocab: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.target_vocab = int(target_vocab)
        self.k_max = k_max
        self.rounds = rounds
        # the controller alone decides: no built-in schedule, no confidence-threshold stopping
        self.assistant_generation_config.num_assistant_tokens_schedule = "constant"
        self.assistant_generation_config.assistant_confidence_threshold = 0.0
        self.generation_config.assistant_confidence_threshold = 0.0
        self.assistant_confidence_threshold = 0.0
        input_ids = args[0] if args else kwargs["input_ids"]
        self.prompt_len = int(input_ids.shape[-1])
        ctx = RequestContext("generate", "live", temperature, self.prompt_len, k_max,
                             profile if profile is not None else placeholder_profile(k_max))
        self.episode = Episode(controller, ctx)
        self._cap = 0
        self._position = 0
        self._conf: list[float] = []
        self._ent: list[float] = []
        self._t0 = 0.0
        self._index = NGramIndex()
        self._rows = self._new_rows(0)
        self._signals = SignalColumns(*self._rows)

    @staticmethod
    def _new_rows(cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Zeroed signal rows (top-k, lookup length, lookup agreement) for up to ``cap`` draft tokens."""
        return np.zeros((cap, TOPK), np.float32), np.zeros(cap, np.int8), np.zeros(cap, np.bool_)

    def get_candidates(self, input_ids, **kwargs):
        """Ask the controller for K, clip it, and draft up to that many tokens."""
        self._t0 = timed(self.assistant_model.device)  # the previous round's kernels done
        k = self.episode.propose()
        cur = int(input_ids.shape[-1])
        self._position = cur - self.prompt_len
        remaining = self.main_model_max_length - cur  # tokens still to generate, this round's included
        self._cap = max(0, min(k, self.k_max, remaining - 1))
        self.num_assistant_tokens = self._cap
        self._conf, self._ent = [], []
        # roll back last round's drafts, add the tokens verified since (the prompt, the first time)
        index = self._index
        index.truncate(index.committed)
        index.extend(input_ids[0, index.committed:].tolist())
        index.commit()
        self._rows = self._new_rows(self._cap)
        self._signals = SignalColumns(*self._rows)
        ids, logits = super().get_candidates(input_ids, **kwargs)
        if logits is not None and self.target_vocab and logits.shape[-1] < self.target_vocab:
            # a padded target (more embedding rows, same tokenizer): the draft never proposes the extra ids
            import torch

            pad = logits.new_full((*logits.shape[:-1], self.target_vocab - logits.shape[-1]), float("-inf"))
            logits = torch.cat([logits, pad], dim=-1)
        return ids, logits

    def _prepare_generation_args(self, input_ids, min_new_tokens: int, max_new_tokens: int) -> dict:
        args = super()._prepare_generation_args(input_ids, min_new_tokens, max_new_tokens)
        # one generation config carrying every generation parameter (transformers deprecates passing a config
        # together with loose parameters), and the controller's token-level stop
        config = copy.copy(args.pop("generation_config"))
        config.min_new_tokens = args.pop("min_new_tokens")
        config.max_new_tokens = args.pop("max_new_tokens")
        if "use_cache" in self.assistant_kwargs:
            config.use_cache = self.assistant_kwargs.pop("use_cache")
        args["generation_config"] = config
        args["stopping_criteria"] = StoppingCriteriaList([_ControllerStop(self)])
        return args

    def update_candidate_strategy(self, input_ids, scores, num_matches: int):
        """Report the verified round to the controller (instead of transformers' heuristic)."""
        drafted = int(scores.shape[1]) - 1
        accepted = int(num_matches)
        round_ms = (timed(self.assistant_model.device) - self._t0) * 1000.0
        outcome = RoundOutcome(
            self._position, self._cap, drafted, accepted, accepted + 1, round_ms,
            np.asarray(self._conf[:drafted], dtype=np.float32), np.asarray(self._ent[:drafted], dtype=np.float32),
            done=int(input_ids.shape[-1]) >= self.main_model_max_length,
            signals=DraftSignals(self._signals, 0, min(drafted, len(self._conf))),
        )
        if self.rounds is not None:
            self.rounds.append(outcome)
        self.episode.observe(outcome)



def _model_name(model: Any) -> str | None:
    """The name a model was loaded by (specgym's loader keeps it: a cache folder is the model the user named), else
    transformers' ``name_or_path``."""
    return getattr(model, "specgym_name", None) or getattr(model, "name_or_path", None)

def generate_with_controller(target: Any, draft: Any, input_ids: Any, controller: Controller, *,
                             k_max: int = DEFAULT_K_MAX, profile: CostProfile | None = None,
                             rounds: list | None = None, **generate_kwargs: Any) -> Any:
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
    if not isinstance(controller, Controller):  # a TreeController: transformers' assisted generation drafts chains
        raise SpecgymError(f"generate_with_controller: {getattr(controller, 'name', controller)!r} is not a chain "
                           "controller; transformers' generate() integration drafts chains only (tree controllers run "
                           "live through specgym's engine: specgym.envs.engines.live.tree.run_live_tree)")
    if StoppingCriteriaList is None:
        raise SpecgymError("generate_with_controller needs transformers; install specgym[hf]")
    if input_ids.shape[0] != 1:
        raise SpecgymError(f"assisted generation supports batch size 1, got {input_ids.shape[0]}")
    temperature = float(generate_kwargs.get("temperature", 1.0)) if generate_kwargs.get("do_sample") else 0.0
    # a predictor-reading controller: another pair's predictor is refused; no hidden sketch here, so a predictor
    # reading it uses its fallback (said once, as a warning)
    source = SignalSource.of_engine("transformers' generate()", _model_name(draft), _model_name(target), True,
                                    signatures=(model_signature(draft.config), model_signature(target.config)),
                                    model_roots=MODEL_ROOTS)
    for note in bind_signals([controller], source):
        warnings.warn(note, stacklevel=2)

    # a target padded past the tokenizer (more embedding rows) is the same token space: transformers compares the
    # configs' vocab sizes, so the draft's config states the target's for the call, and its logits are padded
    d_cfg, t_vocab = draft.config.get_text_config(), output_rows(target)
    d_vocab = d_cfg.vocab_size
    if output_rows(draft) > t_vocab:
        raise SpecgymError(f"generate_with_controller: the draft scores {output_rows(draft)} tokens, the target only "
                           f"{t_vocab}; the draft's vocabulary must not exceed the target's")

    def factory(generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs, assistant_model=None,
                **_ignored):
        return ControllerCandidateGenerator(
            input_ids=input_ids, assistant_model=assistant_model, generation_config=generation_config,
            model_kwargs=model_kwargs, inputs_tensor=inputs_tensor, logits_processor=logits_processor,
            controller=controller, k_max=k_max, profile=profile, rounds=rounds, temperature=temperature,
            target_vocab=t_vocab,
        )

    if output_rows(draft) < t_vocab:
        procs = LogitsProcessorList(generate_kwargs.pop("logits_processor", None) or [])
        procs.append(_TokenizerSpace(output_rows(draft)))
        generate_kwargs["logits_processor"] = procs
    target._get_candidate_generator = factory
    try:
        d_cfg.vocab_size = target.config.get_text_config().vocab_size
        return target.generate(input_ids, assistant_model=draft, **generate_kwargs)
    finally:
        d_cfg.vocab_size = d_vocab
        del target._get_candidate_generator
