"""Live speculative decoding with a real Hugging Face draft/target pair (batch size 1).

The live engine runs the models and hands out :class:`LiveRequest` objects of the same shape as the replay
engine's requests (:class:`~specgym.envs.core.request.Request`), emitting the same :class:`RoundOutcome` records,
so any :class:`Controller` drives either through :func:`~specgym.envs.core.request.drive`. Semantics (the round of
:mod:`specgym.envs.core.rounds`):

* the controller's K is clipped to ``min(K, k_max, N - i - 1)`` (drafting past the end is useless);
* the draft proposes tokens one at a time; after token ``j < cap`` a token-level controller may stop;
* the target verifies ``drafted + 1`` positions in one forward; greedy accepts while the draft token equals the
  target's argmax, sampling uses exact rejection sampling (accept x with ``min(1, p(x)/q(x))``, on rejection
  resample from ``normalize(max(0, p - q))``, bonus token from ``p``), so outputs are distributed as the target's;
* the round produces ``accepted + 1`` tokens.

Drafters: the draft model (the default), prompt lookup (``ngram``) and, for a pair with one, the draft head
(``head``, :mod:`~specgym.envs.engines.live.draft_head`: it drafts from the target's last hidden state at the position
that produced the sequence's last token, which the engine keeps from each verify forward and the prefill). Prompt
lookup and the head propose a whole proposal at once; under sampling prompt lookup's tokens are deterministic (``q``
one-hot: a token is accepted with probability ``p(x)``, a rejection resamples from ``p`` without it) and the head
draws each token from its softmax at the request's temperature, so every drafter's output is the target's
distribution.

KV caches: both models keep a ``DynamicCache`` (GPT-2 and Llama-family models: the lean forward's ``KVCache``, with less
per-call overhead, :mod:`~specgym.envs.engines.live.lean_forward`). The target cache always holds every token but the
last
one; each round feeds ``[last, d_1..d_drafted]`` and crops the rejected suffix afterwards. The draft cache holds a
prefix of the accepted sequence and catches up (feeding one or two tokens) at the start of the next round. In
transformers 5.x ``DynamicCache.crop(n)`` takes ``n <= 0`` = the number of tokens to remove (a positive value raises),
and the model forward takes ``cache=`` (``past_key_values=`` is deprecated).

Draft features of each drafted token (``RoundOutcome.draft_conf`` / ``draft_entropy``) come from
:func:`~specgym.envs.engines.live.draft_stats.draft_stats`, the definition the recorder uses for trace columns. A
greedy head round carries the head's confidence in each token (its softmax maximum, what a recording's ``topk_head``
holds; :meth:`~specgym.envs.engines.live.draft_head._OneStart.propose_confident`) and no entropy; a token-level
controller may stop the head after any token, before it computes the next (``RequestContext.drafter_conf``).

Pre-verification signals (``signals=True``, the default): for each drafted token the engine computes online what
the recorder writes in the v2 trace columns and hands it to the controller as
:class:`~specgym.envs.core.signals.DraftSignals` (in ``DraftStep.signals`` and ``RoundOutcome.signals``): the
draft's top-8 probabilities, the context lookup from an incremental n-gram index
(:class:`~specgym.envs.core.lookup.NGramIndex`: O(1) per token; the round's drafts are appended tentatively, so
draft ``j`` looks up ``prompt + accepted + d_1..d_{j-1}``, and rolled back to the accepted ones after verification)
and, given a ``sketch`` projection (a trace's :meth:`~specgym.envs.workloads.trace_format.Workload.sketch_projection`),
the draft's projected last hidden state. At every draft token whose earlier drafts in the round are all accepted
the prefix is the correct one, so the signals equal the recorder's (up to float rounding of the cached forward).

Each model runs in its own dtype (e.g. draft float32, target bfloat16 where the CPU has native bf16): speedups are
measured against plain decoding of the same target in the same dtype.
Greedy outputs equal plain decoding's token for token in float32. In bfloat16 (or float16) the target's
multi-token verify forward rounds differently from its one-token forward, so where two logits nearly tie the
argmax can differ between them and a greedy output can differ from plain decoding's (measured on tiny random
pairs: docs/guides/own-pair.md).

Timing: ``timing="wall"`` measures each round with ``time.perf_counter``, the device synchronised before every
clock read (:mod:`~specgym.envs.engines.live.clock`: CUDA, MPS, XPU);
``timing="cpu"`` measures the calling thread's CPU time (``time.thread_time``): on a CPU shared with other jobs it
excludes the time the process was preempted, and with one torch thread it is the compute the round cost (CPU
device only); passing a :class:`CostProfile` prices each round with the cost model (deterministic, for tests and
simulations).
The engine never stops at EOS unless ``stop_at_eos=True`` (traces need fixed-length completions).

Loading the pair (model references, dtypes, the shared tokenizer, measured kernels) is
:mod:`specgym.envs.engines.live.model_loading`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.controller import Controller
from specgym.envs.core.cost import CostProfile, placeholder_profile
from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER, NGRAM_DRAFTER
from specgym.envs.core.lookup import NGramIndex, lookup_brute
from specgym.envs.core.ngram_proposer import NGRAM_MAX_N, NGRAM_MIN_N, ngram_propose
from specgym.envs.core.request import KeepDrafting, Request, drive
from specgym.envs.core.rounds import DEFAULT_K_MAX, DraftStep, RequestContext, RoundOutcome, RoundStart, check_k_max
from specgym.envs.core.signals import TOPK, DraftSignals, SignalColumns
from specgym.envs.engines.live.clock import host_generator, host_multinomial, host_uniform, synchronize
from specgym.envs.engines.live.draft_head import pair_head_folder
from specgym.envs.engines.live.draft_stats import draft_stats, top_probs
from specgym.envs.engines.live.draft_vocab import output_rows
from specgym.envs.engines.live.lean_forward import lean_runner
from specgym.envs.engines.live.model_loading import LivePair, context_limit
from specgym.errors import SpecgymError


@dataclass
class LiveResult:
    """One request decoded by the live engine.

    Attributes:
        tokens: The completion token ids (``N`` of them, fewer if ``stop_at_eos`` fired).
        rounds: One :class:`RoundOutcome` per round.
        time_ms: Total decode time (sum of round times), excluding the prompt prefill.
        prefill_ms: Prompt prefill time of both models.
        draft_phase_ms: Per round, the measured time of its drafting phase (the rest of the round is verification
            and bookkeeping): what :mod:`~specgym.envs.engines.live.calibration` fits the draft cost to.
    """

    tokens: list[int]
    rounds: list[RoundOutcome] = field(default_factory=list)
    time_ms: float = 0.0
    prefill_ms: float = 0.0
    draft_phase_ms: list[float] = field(default_factory=list)

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance(self) -> float:
        """Accepted / drafted over the request (NaN when nothing was drafted)."""
        d = self.drafted
        return self.accepted / d if d else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / (self.time_ms / 1000.0) if self.time_ms > 0 else float("nan")


class LiveEngine:
    """Speculative decoding with a real pair; one request at a time.

    Args:
        draft: The draft model (``PreTrainedModel``, causal LM).
        target: The target model; same tokenizer as the draft.
        k_max: Largest draft cap (1..16).
        timing: ``"wall"`` (measured, ``time.perf_counter``, CUDA-synchronised), ``"cpu"`` (the thread's CPU time,
            CPU only) or a :class:`CostProfile` (each round priced by the cost model: deterministic).
        profile: Cost profile controllers see in their :class:`RequestContext` (defaults to ``timing`` when it is
            a profile, else a flat placeholder: pass a measured profile to cost-aware controllers).
        eos_token_id: Used only with ``stop_at_eos``.
        lean: Run GPT-2 and Llama-family models (llama, qwen2, mistral) through
            :mod:`specgym.envs.engines.live.lean_forward` (same logits up to float rounding, far less per-call
            overhead);
            other models always use the transformers forward.
        signals: Compute the pre-verification signals of each draft token (:class:`DraftSignals` in the round
            records); ``False`` leaves them ``None`` (the recorder's generation pass).
        sketch: Projection ``(hidden, D)`` of the draft's last hidden state (``signals.hidden_sketch``); ``None`` =
            no sketch.
        head: A draft head on the target's hidden state (:mod:`~specgym.envs.engines.live.draft_head`), served as the
            drafter ``head``; the target's verify forward then also keeps its last hidden state.
    """

    def __init__(self, draft: Any, target: Any, k_max: int = DEFAULT_K_MAX, timing: str | CostProfile = "wall",
                 profile: CostProfile | None = None, eos_token_id: int | None = None, lean: bool = True,
                 signals: bool = True, sketch: np.ndarray | None = None, head: Any = None):
        import torch

        self.k_max = check_k_max(k_max)
        self.draft = draft
        self.target = target
        self.context = min(context_limit(draft), context_limit(target))
        if k_max + 2 > self.context:
            raise SpecgymError(f"k_max={k_max} is beyond the models' context of {self.context} tokens")
        if isinstance(timing, CostProfile):
            timing.check_k_max(k_max)
        elif timing not in ("wall", "cpu"):
            raise SpecgymError(f"timing must be 'wall', 'cpu' or a CostProfile, got {timing!r}")
        self.timing = timing
        if profile is None:
            profile = timing if isinstance(timing, CostProfile) else placeholder_profile(self.k_max)
        profile.check_k_max(self.k_max)
        self.profile = profile
        self.eos_token_id = eos_token_id
        self.device = target.device
        self._accelerated = self.device.type != "cpu"
        if timing == "cpu" and self._accelerated:
            raise SpecgymError(f"timing='cpu' measures CPU time and is meaningless on a {self.device.type} device; use "
                               f"'wall'")
        self._clock = time.thread_time if timing == "cpu" else time.perf_counter
        self.vocab = min(output_rows(draft), output_rows(target))
        self._torch = torch
        self._lean = {id(m): lean_runner(m) for m in (draft, target)} if lean else {}
        self.signals = bool(signals)
        self.head = head
        self.drafter_names = self.drafters_with(head is not None)
        self.sketch = None if sketch is None else np.asarray(sketch, dtype=np.float32)
        hidden = int(draft.get_output_embeddings().weight.shape[1])
        if self.sketch is not None and (self.sketch.ndim != 2 or self.sketch.shape[0] != hidden):
            raise SpecgymError(f"sketch projection has shape {self.sketch.shape}, expected ({hidden}, D) for the "
                               f"draft's hidden size {hidden}")

    #: The drafters a live engine serves, the default first: its draft model, then prompt lookup
    #: (:mod:`specgym.envs.core.ngram_proposer`, vLLM's ``ngram`` with ``prompt_lookup_min/max`` = ``ngram_n``), then
    #: its draft head when it has one.
    drafter_names: tuple[str, ...] = (IMPLICIT_DRAFTER, NGRAM_DRAFTER)
    ngram_n: tuple[int, int] = (NGRAM_MIN_N, NGRAM_MAX_N)

    @staticmethod
    def drafters_with(head: bool) -> tuple[str, ...]:
        """The drafters an engine serves, the default first; with ``head``, its draft head too."""
        return (IMPLICIT_DRAFTER, NGRAM_DRAFTER) + ((HEAD_DRAFTER,) if head else ())

    @classmethod
    def serves(cls, draft: str | Path) -> tuple[str, ...]:
        """The drafters an engine over the draft ``draft`` of a pair will serve (its pair folder's head loads with
        it, :func:`~specgym.envs.engines.live.model_loading.load_pair`), known before any model loads."""
        return cls.drafters_with(pair_head_folder(draft) is not None)

    @classmethod
    def from_pair(cls, pair: LivePair, **kw: Any) -> LiveEngine:
        """Engine over a :class:`LivePair` (EOS id taken from its tokenizer)."""
        kw.setdefault("eos_token_id", pair.tokenizer.eos_token_id)
        kw.setdefault("head", pair.head)
        return cls(pair.draft, pair.target, **kw)

    # ------------------------------------------------------------------------------------------ helpers
    def context_for(self, request_id: str, prompt_len: int, temperature: float,
                    category: str = "live") -> RequestContext:
        """The :class:`RequestContext` a controller sees (costs from the engine's profile; on a greedy request the draft
        head's rounds carry its confidence, ``drafter_conf``)."""
        confident = frozenset({HEAD_DRAFTER}) if self.head is not None and temperature == 0 else frozenset()
        return RequestContext(request_id, category, float(temperature), int(prompt_len), self.k_max, self.profile,
                              drafter_conf=confident)

    def _sync(self) -> None:
        """Wait for the device before a clock is read (:func:`~specgym.envs.engines.live.clock.synchronize`)."""
        if self._accelerated:
            synchronize(self.device)

    @property
    def lean(self) -> bool:
        """True when both models run through the lean forward."""
        return all(self._lean.get(id(m)) is not None for m in (self.draft, self.target))

    def runner_of(self, model: Any) -> Any:
        """``model``'s lean forward (:mod:`~specgym.envs.engines.live.lean_forward`), or None where it runs through
        transformers."""
        return self._lean.get(id(model))

    def new_cache(self, model: Any) -> Any:
        """An empty KV cache for ``model`` (the lean forward's, or a transformers ``DynamicCache``)."""
        runner = self._lean.get(id(model))
        if runner is not None:
            return runner.new_cache()
        from transformers import DynamicCache

        return DynamicCache()

    def forward(self, model: Any, ids: list[int], cache: Any) -> Any:
        """Logits ``(len(ids), V)`` of one cached forward."""
        runner = self._lean.get(id(model))
        if runner is not None:
            return runner(ids, cache)[:, : self.vocab]
        x = self._torch.tensor([ids], dtype=self._torch.long, device=self.device)
        return model(input_ids=x, cache=cache, use_cache=True).logits[0, :, : self.vocab]

    def forward_hidden(self, model: Any, ids: list[int], cache: Any) -> tuple[Any, Any]:
        """Logits ``(len(ids), V)`` and last hidden states ``(len(ids), width)`` of one cached forward."""
        runner = self._lean.get(id(model))
        if runner is not None:
            logits, h = runner(ids, cache, hidden=True)
            return logits[:, : self.vocab], h
        x = self._torch.tensor([ids], dtype=self._torch.long, device=self.device)
        out = model(input_ids=x, cache=cache, use_cache=True, output_hidden_states=True)
        return out.logits[0, :, : self.vocab], out.hidden_states[-1][0]

    def check_request(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise if a request does not fit the models' context."""
        if prompt_len < 1:
            raise SpecgymError("prompt must contain at least one token")
        if max_new_tokens < 1:
            raise SpecgymError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if prompt_len + max_new_tokens > self.context:
            raise SpecgymError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the models' context "
                f"of {self.context} tokens"
            )

    # ------------------------------------------------------------------------------------------ decoding
    def start(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
              stop_at_eos: bool = False, request_id: str = "live", category: str = "live") -> LiveRequest:
        """Prefill both models with the prompt and return a request to play round by round (or to ``drive``)."""
        return LiveRequest(self, prompt_ids, max_new_tokens, temperature, seed, stop_at_eos, request_id, category)

    def run_request(self, prompt_ids: Sequence[int], controller: Controller | int | None, max_new_tokens: int,
                    temperature: float = 0.0, seed: int = 0, request_id: str = "live", category: str = "live",
                    stop_at_eos: bool = False) -> LiveResult:
        """Decode one request with speculative decoding.

        Args:
            prompt_ids: Prompt token ids.
            controller: Chooses K each round; an ``int`` is a fixed draft cap; ``None`` = plain autoregressive
                decoding (K = 0).
            max_new_tokens: Completion length N.
            temperature: 0 = greedy; > 0 = exact speculative sampling at that temperature.
            seed: Seed of the sampling generator (sampling only).
            request_id, category: Passed to the controller's :class:`RequestContext`.
            stop_at_eos: Stop after the target emits EOS.

        Returns:
            A :class:`LiveResult` with the completion tokens and one :class:`RoundOutcome` per round.
        """
        req = self.start(prompt_ids, max_new_tokens, temperature, seed, stop_at_eos, request_id, category)
        if isinstance(controller, Controller):
            drive(controller, req)
        else:
            k = int(controller or 0)
            while not req.done:
                req.play(k)
        return req.result

    def run_plain(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                  seed: int = 0) -> LiveResult:
        """Plain autoregressive decoding with the target alone (KV cache), the baseline of every speedup."""
        return self.run_request(prompt_ids, None, max_new_tokens, temperature, seed)


class LiveRequest(Request):
    """One request being decoded: call :meth:`play` with a draft cap until :attr:`done` (or hand it to ``drive``).

    KV caches: both models keep a cache (``DynamicCache``, or the lean forward's ``KVCache``). The target cache
    always holds every token but the last one; each round feeds ``[last, d_1..d_drafted]`` and crops the rejected
    suffix afterwards. The draft cache holds a prefix of the accepted sequence and catches up (feeding one or two
    tokens) at the start of the next round. In transformers 5.x ``DynamicCache.crop(n)`` takes ``n <= 0`` = the
    number of tokens to remove, and the model forward takes ``cache=`` (``past_key_values=`` is deprecated).

    Attributes:
        context: The :class:`RequestContext` controllers see.
        position: Next completion position ``i``.
        length: Completion length ``N``.
        done: True once the completion is finished.
        result: The :class:`LiveResult` so far (tokens, rounds, time).
    """

    def __init__(self, engine: LiveEngine, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float,
                 seed: int, stop_at_eos: bool, request_id: str = "live", category: str = "live"):
        import torch

        self.engine = engine
        self.prompt = [int(t) for t in prompt_ids]
        self.length = int(max_new_tokens)
        self.k_max = engine.k_max
        engine.check_request(len(self.prompt), self.length)
        if temperature < 0 or not math.isfinite(temperature):
            raise SpecgymError(f"temperature must be >= 0, got {temperature}")
        self.temperature = float(temperature)
        self.context = engine.context_for(request_id, len(self.prompt), self.temperature, category)
        self.greedy = temperature == 0
        self.gen = None if self.greedy else host_generator(seed)  # on the host: traces do not depend on the device
        self.stop_at_eos = stop_at_eos
        self.position = 0
        self.done = False
        self.index = NGramIndex(self.prompt) if engine.signals else None
        #: The target's last hidden state before the last token (what the draft head drafts from), or None. Chain
        #: rounds and, with a draft head, tree rounds (:mod:`~specgym.envs.engines.live.tree`) keep it current.
        self.feature: Any = None
        with torch.inference_mode():
            t0 = engine._clock()
            self.tcache = engine.new_cache(engine.target)
            self.dcache = engine.new_cache(engine.draft)
            self.seq = list(self.prompt)
            if len(self.seq) > 1:
                if engine.head is not None:
                    self.feature = engine.forward_hidden(engine.target, self.seq[:-1], self.tcache)[1][-1]
                else:
                    engine.forward(engine.target, self.seq[:-1], self.tcache)
                engine.forward(engine.draft, self.seq[:-1], self.dcache)
            engine._sync()
            self.result = LiveResult(tokens=[], prefill_ms=(engine._clock() - t0) * 1000.0)

    def play(self, k: int, keep_drafting: KeepDrafting | None = None, drafter: str | None = None) -> RoundOutcome:
        """Play one round with draft cap ``k``; ``keep_drafting`` may stop after draft token ``j < cap``;
        ``drafter="ngram"`` proposes by prompt lookup, ``drafter="head"`` by the draft head, instead of the draft
        model (greedy or exact speculative sampling, as the draft model; ``keep_drafting`` is asked after each of
        their tokens, with the head's confidence on a greedy request, as the head drafts)."""
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        start = len(self.seq)
        with self.engine._torch.inference_mode():
            if drafter is not None and drafter != IMPLICIT_DRAFTER:
                outcome = self._play_proposal(self.clip(k), drafter, keep_drafting)
            else:
                outcome = self._play(self.clip(k), keep_drafting)
        return self._with_counterfactual(outcome, start)

    def _with_counterfactual(self, outcome: RoundOutcome, start: int) -> RoundOutcome:
        """The round with prompt lookup's run from its start, read off the verified tokens, when prompt lookup did
        not play and the request is greedy (:attr:`RoundOutcome.counterfactual`; outside the round's timing: one
        lookup over the context, ~0.2 ms at 700 tokens)."""
        eng = self.engine
        if not self.greedy or NGRAM_DRAFTER not in eng.drafter_names or outcome.drafter == NGRAM_DRAFTER:
            return outcome
        proposal = ngram_propose(self.seq[:start], eng.k_max, *eng.ngram_n)
        if not proposal:
            return outcome
        verified = self.seq[start:start + outcome.produced]
        run = next((j for j, (a, b) in enumerate(zip(proposal, verified)) if a != b), min(len(proposal),
                                                                                             len(verified)))
        return replace(outcome, counterfactual=((NGRAM_DRAFTER, run),))

    def round_start(self) -> RoundStart:
        """What a drafter-choice controller knows before the next round: the position, the KV cache and the context
        lookup of the sequence so far."""
        n = self.index.lookup()[0] if self.index is not None else lookup_brute(self.seq)[0]
        return RoundStart(self.position, len(self.seq), int(n))

    def _propose(self, cap: int, drafter: str, keep_drafting: KeepDrafting | None = None
                 ) -> tuple[list[int], list, list[float]]:
        """A proposal of up to ``cap`` tokens by prompt lookup (vLLM's ``ngram``; none when the context has no
        match) or by the draft head (from the target's feature before the last token; none without one), with the
        distributions it was drawn from (sampling: ``None`` for prompt lookup's deterministic tokens, the head's
        softmax for the head's draws; nothing when greedy) and each token's draft confidence: the head's softmax
        maximum on a greedy request (:attr:`RequestContext.drafter_conf`), else NaN. ``keep_drafting`` is asked after
        each token ``j < cap``: the greedy head stops drafting there (its ``DraftStep`` carries the head's top-8
        probabilities there, :func:`~specgym.envs.engines.live.draft_stats.top_probs` of its softmax: what a recording's
        ``topk_head`` holds and a head acceptance predictor reads), a whole proposal is cut there."""
        eng = self.engine
        if drafter not in eng.drafter_names or drafter == IMPLICIT_DRAFTER:
            raise SpecgymError(f"the live engine serves drafters {', '.join(eng.drafter_names)}, not {drafter!r}")
        if cap <= 0:
            return [], [], []
        i = self.position
        if drafter == HEAD_DRAFTER and self.greedy and self.feature is not None:
            keep = None if keep_drafting is None else \
                (lambda j, c, probs: keep_drafting(DraftStep(j, cap, i + j - 1, c, math.nan, None,
                                                             top_probs(probs)[0].tolist())))
            drafts, confs = eng.head.propose_confident(self.feature, self.seq[-1], cap, keep)
            eng._sync()
            return drafts, [], confs
        if drafter == NGRAM_DRAFTER:
            drafts = ngram_propose(self.seq, cap, *eng.ngram_n)
            q_probs: list = [] if self.greedy else [None] * len(drafts)
        elif self.feature is None:
            return [], [], []
        else:
            drafts, q_probs = eng.head.propose_sampled(self.feature, self.seq[-1], cap, self.temperature, eng.vocab,
                                                       self.gen)
            eng._sync()
        if keep_drafting is not None:
            for j in range(1, min(len(drafts), cap)):
                if not keep_drafting(DraftStep(j, cap, i + j - 1, math.nan, math.nan, None)):
                    drafts, q_probs = drafts[:j], q_probs[:j]
                    break
        return drafts, q_probs, [math.nan] * len(drafts)

    def _play_proposal(self, cap: int, drafter: str, keep_drafting: KeepDrafting | None = None) -> RoundOutcome:
        """A round drafted by prompt lookup or the draft head (:meth:`_propose`), verified by the target in one
        forward. Priced by the engine's timing: measured, or the profile's drafter of that name (a profile without a
        lookup drafter prices prompt lookup at no draft cost, :meth:`CostProfile.with_drafter`)."""
        eng = self.engine
        i = self.position
        r0 = eng._clock()
        drafts, q_probs, confs = self._propose(cap, drafter, keep_drafting)
        draft_phase_ms = (eng._clock() - r0) * 1000.0
        drafted = len(drafts)
        accepted, extra = self._verify(drafts, q_probs)
        if drafted > accepted:
            self.tcache.crop(-(drafted - accepted))
        new, accepted, produced, measured_ms = self._commit(drafts[:accepted] + [extra], 0, r0)
        timing = eng.timing
        if isinstance(timing, CostProfile):
            kind = "lookup" if drafter == NGRAM_DRAFTER else "model"
            time_ms = timing.with_drafter(drafter, kind).round_time(
                drafted, self.context.prompt_len + i, drafter if drafted else None)
        else:
            time_ms = measured_ms
        outcome = RoundOutcome(i, cap, drafted, accepted, produced, time_ms, np.asarray(confs, dtype=np.float32),
                               np.full(drafted, np.nan, dtype=np.float32), done=self.done,
                               drafter=drafter if drafted else None)
        self._record(self.result, new, outcome, time_ms)
        self.result.draft_phase_ms.append(draft_phase_ms)
        return outcome

    def _signal_rows(self, cap: int) -> SignalColumns | None:
        """Zeroed signal arrays for a round of up to ``cap`` draft tokens (``None`` without signals)."""
        eng = self.engine
        if not eng.signals:
            return None
        d = 0 if eng.sketch is None else eng.sketch.shape[1]
        return SignalColumns(np.zeros((cap, TOPK), np.float32), np.zeros(cap, np.int8), np.zeros(cap, np.bool_),
                             None if eng.sketch is None else np.zeros((cap, d), np.float32))

    def _draft(self, cap: int, keep_drafting: KeepDrafting | None
               ) -> tuple[list[int], list, list[float], list[float], SignalColumns | None]:
        """Propose up to ``cap`` tokens one at a time; returns tokens, their draft distributions, conf, entropy and
        their signals (the lookup index then holds the drafts, to be rolled back after verification)."""
        eng, seq, dcache = self.engine, self.seq, self.dcache
        temperature = 0.0 if self.greedy else self.temperature
        drafts: list[int] = []
        q_probs: list = []
        confs: list[float] = []
        ents: list[float] = []
        sig, index, sketch = self._signal_rows(cap), self.index, eng.sketch
        empty = np.zeros((cap, 1), np.float32)
        rows = [empty, empty, empty, empty] if sig is None else \
            [empty if a is None else a for a in (sig.topk, sig.lookup_len, sig.lookup_agree, sig.hidden_sketch)]
        topk_rows, len_rows, agree_rows, sketch_rows = rows
        feed = seq[dcache.get_seq_length():]  # catch the draft cache up with the accepted sequence
        for j in range(1, cap + 1):
            if sketch is not None:
                logits, hidden = eng.forward_hidden(eng.draft, feed, dcache)
            else:
                logits = eng.forward(eng.draft, feed, dcache)
            st = draft_stats(logits[-1:], temperature, generator=self.gen)
            tok, conf, ent = int(st.tokens[0]), float(st.conf[0]), float(st.entropy[0])
            drafts.append(tok)
            q_probs.append(st.probs[0])
            confs.append(conf)
            ents.append(ent)
            step_signals = None
            if sig is not None and index is not None:
                topk_rows[j - 1] = top_probs(st.probs)[0].cpu().numpy()
                n, cont = index.lookup()
                len_rows[j - 1] = n
                agree_rows[j - 1] = n > 0 and cont == tok
                if sketch is not None:
                    sketch_rows[j - 1] = hidden[-1].float().cpu().numpy() @ sketch
                index.append(tok)
                step_signals = DraftSignals(sig, 0, j)
            if j < cap and keep_drafting is not None and \
                    not keep_drafting(DraftStep(j, cap, self.position + j - 1, conf, ent, step_signals)):
                break
            feed = [tok]
        return drafts, q_probs, confs, ents, sig

    def _verify(self, drafts: list[int], q_probs: list) -> tuple[int, int]:
        """One target forward over ``[last, drafts...]``; returns (accepted, the target's extra token). With a draft
        head, keeps the target's hidden state at the position that produced the extra token (:attr:`feature`)."""
        eng = self.engine
        if eng.head is None:
            return self._accept(eng.forward(eng.target, [self.seq[-1]] + drafts, self.tcache), drafts, q_probs)
        tlogits, hidden = eng.forward_hidden(eng.target, [self.seq[-1]] + drafts, self.tcache)
        accepted, extra = self._accept(tlogits, drafts, q_probs)
        self.feature = hidden[accepted]
        return accepted, extra

    def _accept(self, tlogits: Any, drafts: list[int], q_probs: list) -> tuple[int, int]:
        """Greedy verification or exact speculative sampling of ``drafts`` against the target's logits (``q_probs``:
        the distribution each draft was drawn from; ``None`` for a deterministic one, whose residual is ``p`` without
        the drafted token)."""
        torch = self.engine._torch
        drafted = len(drafts)
        if self.greedy:
            targ = torch.argmax(tlogits, -1).tolist()
            accepted = 0
            while accepted < drafted and drafts[accepted] == targ[accepted]:
                accepted += 1
            return accepted, targ[accepted]
        # exact speculative sampling: accept x with min(1, p(x)/q(x)); on rejection resample from max(0, p - q)
        gen = self.gen
        p_all = torch.softmax(tlogits.float() / self.temperature, -1)
        for accepted in range(drafted):
            x = drafts[accepted]
            p, q = p_all[accepted], q_probs[accepted]
            px, qx = float(p[x]), 1.0 if q is None else float(q[x])  # None: a deterministic proposal, q one-hot
            u = host_uniform(gen)
            if qx > 0 and u < min(1.0, px / qx):
                continue
            if q is None:
                resid = p.clone()
                resid[x] = 0.0
            else:
                resid = torch.clamp(p - q, min=0)
            s = float(resid.sum())
            return accepted, int(host_multinomial(resid / s if s > 0 else p, gen))
        return drafted, int(host_multinomial(p_all[drafted], gen))

    def _play(self, cap: int, keep_drafting: KeepDrafting | None) -> RoundOutcome:
        eng, seq = self.engine, self.seq
        i = self.position
        r0 = eng._clock()
        drafts, q_probs, confs, ents, sig = self._draft(cap, keep_drafting) if cap > 0 else \
            ([], [], [], [], self._signal_rows(0))
        eng._sync()  # the drafting phase's kernels have finished: its time is the work, not the launches
        draft_phase_ms = (eng._clock() - r0) * 1000.0
        drafted = len(drafts)
        accepted, extra = self._verify(drafts, q_probs)
        if self.index is not None:  # keep the accepted drafts (the target's token is added by _commit)
            self.index.truncate(len(seq) + accepted)
        # roll back both caches to the accepted prefix
        if drafted > accepted:
            self.tcache.crop(-(drafted - accepted))
        dlen = self.dcache.get_seq_length()
        keep = len(seq) + min(accepted, max(drafted - 1, 0))
        if dlen > keep:
            self.dcache.crop(-(dlen - keep))
        new, accepted, produced, measured_ms = self._commit(drafts[:accepted] + [extra], accepted, r0)
        time_ms = eng.timing.round_time(drafted) if isinstance(eng.timing, CostProfile) else measured_ms
        outcome = RoundOutcome(i, cap, drafted, accepted, produced, time_ms, np.asarray(confs, dtype=np.float32),
                               np.asarray(ents, dtype=np.float32), done=self.done,
                               signals=None if sig is None else DraftSignals(sig, 0, drafted))
        self._record(self.result, new, outcome, time_ms)
        self.result.draft_phase_ms.append(draft_phase_ms)
        return outcome

    def _commit(self, new: list[int], in_index: int, r0: float) -> tuple[list[int], int, int, float]:
        """Append a verified round's tokens (accepted drafts, then the target's token) to the sequence and the lookup
        index (whose first ``in_index`` of them are already there), cut after EOS with ``stop_at_eos``, advance
        :attr:`position`; returns ``(new, accepted, produced, measured_ms)``."""
        eng, seq = self.engine, self.seq
        if self.index is not None:
            for t in new[in_index:]:
                self.index.append(t)
            self.index.commit()
        seq.extend(new)
        eng._sync()
        measured_ms = (eng._clock() - r0) * 1000.0
        produced = len(new)
        i_end = self.position + produced
        if self.stop_at_eos and eng.eos_token_id is not None and eng.eos_token_id in new:
            produced = new.index(eng.eos_token_id) + 1  # tokens after EOS are discarded
            new = new[:produced]
            i_end = self.length
        self.position = i_end
        self.done = i_end >= self.length
        return new, produced - 1, produced, measured_ms

    def _record(self, res: Any, new: list[int], outcome: Any, time_ms: float) -> None:
        """Add a round to a result (``tokens``, ``rounds``, ``time_ms``), the completion capped at ``N`` tokens."""
        res.tokens.extend(new)
        if len(res.tokens) > self.length:
            del res.tokens[self.length:]
        res.rounds.append(outcome)
        res.time_ms += time_ms
