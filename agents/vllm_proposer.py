"""A vLLM custom proposer: prompt lookup whose draft length a specgym controller chooses for each request, each step.

vLLM takes a proposer class by its import path (``vllm/v1/spec_decode/custom_class_proposer.py``)::

    LLM(model, speculative_config={"method": "custom_class", "model": "specgym.agents.vllm_proposer.SpecgymProposer",
                                   "num_speculative_tokens": 8})

and calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)`` once per engine
step, with one row per running request: the tokens the step sampled (the accepted drafts and the target's own), the
request's tokens so far and its token buffer. It returns one draft list per row, of any length up to
``num_speculative_tokens``; an empty list is a plain step for that request. vLLM's own ``ngram`` proposer drafts the
same K for every request; here each request's K comes from a specgym drafter-choice controller over the one drafter
``ngram`` (K = 0: no speculation for it this step), which sees what a drafter-choice controller sees everywhere else
(the position, the KV cache, the context lookup) and observes each step's outcome: the drafts it proposed and how
many the step accepted (``len(sampled) - 1``).

**Matching requests across steps.** ``propose`` receives no request ids, and a request's row moves when others
finish. A request is known by its fingerprint, its first :data:`FINGERPRINT_TOKENS` tokens (all the tokens it had when
first seen, if fewer: a prefix that later steps keep), and its length: a row continues the request
of the same fingerprint whose last length it extends by one step's tokens (1 to K + 1); anything else starts a new
request. Requests not seen in a step have finished (or were preempted: they start afresh). Two running requests with
the same first tokens share a fingerprint; each row then continues the one whose length it extends, and where both
fit, the controller states may be swapped: a K choice, never the output (verification is vLLM's).

**The draft model** (``SPECGYM_PROPOSER_DRAFT``, a draft folder in specgym's format): the proposer then holds two
drafters, ``draft`` (the model, :mod:`specgym.agents.vllm_draft`: run here, greedy, one key/value cache per request
kept with the request) and ``ngram``, and the controller picks the drafter and K of each request every step:
``lookup-rule:N`` (prompt lookup where the last N tokens occurred earlier, else the draft model),
``drafter-marginal:FILE`` (most predicted tokens per ms over both drafters and every K, on a run predictor from
``specgym predictor train-runs``), ``fixed:K@draft``... Without it, the one drafter is ``ngram``.

**The batch rule** (``batch-marginal[:FILE]``, :mod:`specgym.baselines.batch_lookup`): the controllers above decide
each request alone, priced by a single-request profile; in a vLLM step every request's drafts are verified in one
forward, so at high concurrency a draft token costs the whole batch. Under ``batch-marginal`` the proposer runs the
lookup of every row first, then chooses all the rows' K together: the K vector of most expected tokens per ms of
the step, priced with vLLM's own step time at the step's batch size (the rows of the ``propose`` call) and drafts
per row (FILE, or ``SPECGYM_PROPOSER_STEPS``: a batched cost profile measured in vLLM, the same format as
``specgym profile --batch-sizes`` writes and ``specgym tune`` reads;
``specgym bench vllm --proposer specgym`` measures one with ``fill:K``, every row drafting exactly K copies of its last
token), with acceptance counted per draft position and lookup match length. K = 0 for a row, or for every row, is
chosen where its drafts do not pay for what they cost the step.

**Configuration** (read when vLLM builds the proposer): ``SPECGYM_PROPOSER_CONTROLLER`` names the controller
(a :mod:`specgym.agents.specs` drafter spec: ``marginal@ngram``, the default, ``fixed:K@ngram``, or over both drafters
with a draft model; or ``batch-marginal[:FILE]``), ``SPECGYM_PROPOSER_PROFILE`` the single-request cost profile the
drafter specs price rounds with (name or path; default: a profile measured where vLLM runs, required by cost-aware
controllers). Decisions are numpy-only.

**Between runs** (``specgym bench vllm --proposer specgym``): :meth:`SpecgymProposer.specgym_configure` switches the
controller for the requests that start afterwards and returns what the proposer did since the last call
(:class:`ProposerStats`: rows, the K chosen, lookups that found nothing, time spent in ``propose``); vLLM's worker
reaches it through ``LLM.collective_rpc("specgym_proposer", args=(config,))`` (the specgym plugin adds that method,
:mod:`specgym.envs.engines.serving.vllm_hook`).
"""

from __future__ import annotations

import copy
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specgym.agents.specs import build
from specgym.agents.vllm_draft import ENV_DRAFT, DraftCache, DraftModel
from specgym.baselines.batch_lookup import FILL, BatchLookupK, RequestCounts
from specgym.baselines.batch_lookup import NAME as BATCH_RULE
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterController, check_decision
from specgym.envs.core.kinds import IMPLICIT_DRAFTER, NGRAM_DRAFTER
from specgym.envs.core.lookup import NGramIndex
from specgym.envs.core.ngram_proposer import ngram_propose
from specgym.envs.core.rounds import RequestContext, RoundOutcome, RoundStart
from specgym.envs.profiles import load_batch_profile, load_profile
from specgym.errors import SpecgymError

#: The controller spec (default :data:`DEFAULT_CONTROLLER`).
ENV_CONTROLLER = "SPECGYM_PROPOSER_CONTROLLER"
#: The cost profile (name or path).
ENV_PROFILE = "SPECGYM_PROPOSER_PROFILE"
#: The batched cost profile ``batch-marginal`` prices with when its spec names no file (a path or a shipped name).
ENV_STEPS = "SPECGYM_PROPOSER_STEPS"
DEFAULT_CONTROLLER = "marginal@ngram"
#: How many leading tokens identify a request across steps.
FINGERPRINT_TOKENS = 64


@dataclass
class ProposerStats:
    """What the proposer did over a run (:meth:`SpecgymProposer.specgym_configure` returns and clears it).

    Attributes:
        steps: ``propose`` calls (engine steps that drafted).
        rows: Request rows over those calls.
        k_chosen: Rows per chosen K (index ``K``, 0..``num_speculative_tokens``; 0: plain for that request).
        no_match: Rows given to prompt lookup with K above 0 whose lookup found nothing (drafted nothing).
        declined: ``batch-marginal``: rows whose lookup found drafts that the rule chose K = 0 for.
        draft_tokens: Tokens proposed.
        model_rows: Rows the draft model proposed for.
        model_tokens: Tokens the draft model proposed.
        propose_ms: Wall time inside ``propose`` (the proposer's share of each step; the draft model's included).
    """

    steps: int = 0
    rows: int = 0
    k_chosen: list[int] = field(default_factory=list)
    no_match: int = 0
    declined: int = 0
    draft_tokens: int = 0
    model_rows: int = 0
    model_tokens: int = 0
    propose_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what crosses vLLM's RPC)."""
        return dict(self.__dict__)


@dataclass
class _Request:
    """One running request as the proposer knows it."""

    controller: DrafterController | None  # None under a batch rule (batch-marginal, fill:K)
    index: NGramIndex  # its tokens, for the context lookup (appended step by step)
    start: int  # its length when first seen (prompt + first token): completion positions count from here
    length: int  # its length at the last step
    key: tuple[int, str] = (0, "")  # its fingerprint: (size, hash of its first `size` tokens)
    drafted: int = 0  # what the last step proposed for it
    drafter: str = NO_DRAFTER  # and which drafter proposed it
    last: RoundStart | None = None
    draft: DraftCache | None = None  # the draft model's cache of this request (created when the model first drafts)
    counts: RequestCounts | None = None  # batch-marginal: its acceptance counts per draft position
    match_n: int = 0  # the match length of its last lookup


class SpecgymProposer:
    """Prompt lookup (and the draft model, when given) with each request's drafter and K chosen by a specgym
    controller (module docstring).

    Args:
        vllm_config: vLLM's config (``speculative_config``: ``num_speculative_tokens``, ``prompt_lookup_min/max``;
            ``model_config.max_model_len``).
        controller: A drafter spec over the proposer's drafters (default: ``$SPECGYM_PROPOSER_CONTROLLER`` or
            :data:`DEFAULT_CONTROLLER`).
        profile: The cost profile (default: ``$SPECGYM_PROPOSER_PROFILE``).
        draft: The draft model's folder (default: ``$SPECGYM_PROPOSER_DRAFT``; none: prompt lookup alone).
    """

    def __init__(self, vllm_config: Any, controller: str | None = None, profile: CostProfile | str | None = None,
                 draft: str | None = None):
        spec = vllm_config.speculative_config
        self.k_max = int(spec.num_speculative_tokens)
        self.min_n = int(getattr(spec, "prompt_lookup_min", None) or 1)
        self.max_n = int(getattr(spec, "prompt_lookup_max", None) or 4)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.spec = controller or os.environ.get(ENV_CONTROLLER) or DEFAULT_CONTROLLER
        source = profile if profile is not None else os.environ.get(ENV_PROFILE)
        if source is None:
            raise SpecgymError(f"{ENV_PROFILE} is not set: the proposer's controller prices rounds with a "
                               f"single-request cost profile (specgym profile, or a shipped one such as cpu-smollm2)")
        prof = source if isinstance(source, CostProfile) else load_profile(source)
        self.profile = prof.with_drafter(NGRAM_DRAFTER, "lookup")  # a model-drafter profile prices lookup at no draft
        folder = draft if draft is not None else os.environ.get(ENV_DRAFT)
        device = getattr(getattr(vllm_config, "device_config", None), "device", None)
        self.draft = DraftModel(folder, getattr(vllm_config.model_config, "model", None), device) if folder else None
        self.drafters = (IMPLICIT_DRAFTER, NGRAM_DRAFTER) if self.draft is not None else (NGRAM_DRAFTER,)
        self._protos: dict[str, DrafterController] = {}
        self.rule: BatchLookupK | None = None
        self.fill: int | None = None
        self._use(self.spec)  # a bad spec: one line now, not at the first step
        self.requests: dict[tuple[int, str], list[_Request]] = {}  # by fingerprint
        self._sizes: list[int] = []  # the fingerprint sizes of the tracked requests
        self.stats = ProposerStats(k_chosen=[0] * (self.k_max + 1))

    def specgym_configure(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """The statistics since the last call (then cleared); with ``{"controller": SPEC}``, that controller decides
        for every request seen afterwards (the requests tracked so far are dropped: call it between runs).

        Args:
            config: ``None`` (statistics only) or ``{"controller": SPEC}`` (a drafter spec, checked here).
        """
        out = {"controller": self.spec, **self.stats.to_dict(),
               **(self.draft.take_stats() if self.draft is not None else {})}
        if config and config.get("controller"):
            self._use(str(config["controller"]))  # a bad spec raises before anything changes
            self.requests, self._sizes = {}, []
        self.stats = ProposerStats(k_chosen=[0] * (self.k_max + 1))
        return out

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load here: prompt lookup reads the token ids, and the draft model was loaded with the proposer."""

    def _use(self, spec: str) -> None:
        """Decide with ``spec`` from now on: a batch rule the proposer runs itself (``batch-marginal[:FILE]``,
        ``fill:K``), or a drafter spec (checked by building it)."""
        name, _, arg = spec.partition(":")
        rule, fill = None, None
        if name == FILL:
            try:
                fill = int(arg)
            except ValueError:
                fill = -1
            if not 0 <= fill <= self.k_max:
                raise SpecgymError(f"proposer controller {spec!r}: fill:K needs K in 0..{self.k_max}")
        elif name == BATCH_RULE:
            path = arg or os.environ.get(ENV_STEPS)
            if not path:
                raise SpecgymError(f"proposer controller {spec!r}: name the engine's step costs (batch-marginal:FILE "
                                   f"or {ENV_STEPS}), measured by `specgym bench vllm --proposer specgym`")
            rule = BatchLookupK(load_batch_profile(path), self.k_max, self.max_n)
        else:
            self._controller(spec, "vllm-check", 1)
        self.spec, self.rule, self.fill = spec, rule, fill

    def _controller(self, spec: str, key: str, n: int) -> DrafterController:
        """A fresh controller of ``spec`` for a request of ``n`` tokens, reset on the proposer's drafters (a spec that
        needs a drafter the proposer lacks, or a predictor it was not given, is one line)."""
        proto = self._protos.get(spec)
        if proto is None:  # built once per spec (a predictor file is read once), copied for every request
            proto = self._protos[spec] = build(spec, self.k_max, kinds=("drafter",)).controller
        ctrl = copy.deepcopy(proto)
        ctrl.reset(RequestContext(f"vllm-{key}", "vllm", 0.0, n, self.k_max, self.profile), self.drafters)
        return ctrl

    @staticmethod
    def _key(tokens: np.ndarray, size: int) -> tuple[int, str]:
        return size, hashlib.blake2b(np.ascontiguousarray(tokens[:size], np.int64).tobytes(),
                                     digest_size=12).hexdigest()

    def tracked(self, tokens: np.ndarray) -> list[_Request]:
        """The tracked requests whose fingerprint ``tokens`` carries (any length): the ones a row may continue."""
        n = len(tokens)
        return [req for size in self._sizes if size <= n for req in self.requests.get(self._key(tokens, size), [])]

    def _match(self, tokens: np.ndarray, sampled: int, taken: set[int]) -> _Request:
        """The running request this row continues (module docstring), its tokens appended; or a new one."""
        n = len(tokens)
        for req in self.tracked(tokens):
            if id(req) not in taken and n == req.length + sampled:
                for t in tokens[req.length:].tolist():
                    req.index.append(t)
                req.index.commit()
                return req
        key = self._key(tokens, min(FINGERPRINT_TOKENS, n))
        if self.rule is not None or self.fill is not None:
            return _Request(None, NGramIndex(tokens.tolist()), n, n, key,
                            counts=self.rule.new_request() if self.rule is not None else None)
        return _Request(self._controller(self.spec, key[1], n), NGramIndex(tokens.tolist()), n, n, key)

    def _draft(self, req: _Request, drafter: str, tokens: np.ndarray, k: int) -> list[int]:
        """The proposal of ``drafter`` at ``k`` (none at ``k = 0``)."""
        if k <= 0 or drafter == NO_DRAFTER:
            return []
        if drafter == NGRAM_DRAFTER:
            drafts = ngram_propose(tokens, k, self.min_n, self.max_n)
            self.stats.no_match += int(not drafts)
            return drafts
        if drafter == IMPLICIT_DRAFTER and self.draft is not None:
            req.draft = req.draft or self.draft.new_cache()
            drafts = self.draft.propose(req.draft, tokens, k).tokens
            self.stats.model_rows += 1
            self.stats.model_tokens += len(drafts)
            return drafts
        raise SpecgymError(f"proposer controller {self.spec}: chose drafter {drafter!r}, which the proposer does not "
                           f"hold ({', '.join(self.drafters)})")

    def _observe(self, req: _Request, accepted: int) -> None:
        """The step verified what this request proposed last time: ``accepted`` of its ``req.drafted`` drafts."""
        if req.last is None:
            return
        if req.controller is not None:
            drafter = req.drafter if req.drafted else None
            req.controller.observe(RoundOutcome(
                req.last.position, req.drafted, req.drafted, accepted, accepted + 1,
                self.profile.round_time(req.drafted, req.last.kv, drafter), drafter=drafter))
        elif self.rule is not None and req.counts is not None:
            self.rule.observe(req.counts, req.match_n, req.drafted, accepted)

    def _decide_each(self, req: _Request, tokens: np.ndarray) -> list[int]:
        """A row's drafts under its own drafter controller (the drafter and K it chose)."""
        assert req.controller is not None
        n = len(tokens)
        start = RoundStart(n - req.start, n, int(req.index.lookup()[0]))
        dec = check_decision(req.controller.propose(start), req.controller.name)
        k = min(dec.k, self.k_max, self.max_model_len - n - 1) if not dec.plain else 0
        drafts = self._draft(req, dec.drafter, tokens, k)
        req.drafted, req.drafter, req.last = len(drafts), dec.drafter, start
        self.stats.k_chosen[k] += 1
        return drafts

    def _decide_batch(self, live: list[tuple[_Request, np.ndarray]], batch: int) -> list[list[int]]:
        """Every live row's drafts under the batch rule: the lookup at the largest K first, then the K of each row
        (``batch-marginal``: :meth:`BatchLookupK.choose` at the step's batch size; ``fill:K``: K copies of the last
        token for every row, to measure what a step verifying K drafts per row costs)."""
        room = [max(min(self.k_max, self.max_model_len - len(t) - 1), 0) for _, t in live]
        if self.fill is not None:
            cands = [[int(t[-1])] * min(self.fill, r) for (_, t), r in zip(live, room)]
            matches = [0] * len(live)
        else:
            cands = [ngram_propose(t, r, self.min_n, self.max_n) if r else [] for (_, t), r in zip(live, room)]
            matches = [int(req.index.lookup()[0]) for req, _ in live]
        if self.rule is not None:
            ks = self.rule.choose([(req.counts or self.rule.new_request(), m, len(c))
                                   for (req, _), m, c in zip(live, matches, cands)], batch).tolist()
        else:
            ks = [len(c) for c in cands]
        out = []
        for (req, t), m, c, k, r in zip(live, matches, cands, ks, room):
            drafts = c[:k]
            self.stats.no_match += int(self.fill is None and r > 0 and not c)
            self.stats.declined += int(bool(c) and k == 0)
            self.stats.k_chosen[len(drafts)] += 1
            req.drafted, req.drafter, req.match_n = len(drafts), NGRAM_DRAFTER, m
            req.last = RoundStart(len(t) - req.start, len(t), m)
            out.append(drafts)
        return out

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """One draft list per row: the proposal of the drafter and K its request's controller chose (under a batch
        rule: the K the rule chose for the row, all rows of the step together)."""
        t0 = time.perf_counter()
        seen: dict[tuple[int, str], list[_Request]] = {}
        taken: set[int] = set()
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        live: list[tuple[int, _Request, np.ndarray]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not sampled or n >= self.max_model_len:  # vLLM's own skips: no step sampled, or no room left
                continue
            tokens = np.asarray(token_ids_cpu[i, :n])
            req = self._match(tokens, len(sampled), taken)
            taken.add(id(req))
            self._observe(req, len(sampled) - 1)
            req.length = n
            live.append((i, req, tokens))
            seen.setdefault(req.key, []).append(req)
        if self.rule is not None or self.fill is not None:
            drafts = self._decide_batch([(req, t) for _, req, t in live], len(sampled_token_ids))
        else:
            drafts = [self._decide_each(req, t) for _, req, t in live]
        for (i, _, _), d in zip(live, drafts):
            out[i] = d
            self.stats.draft_tokens += len(d)
        self.requests = seen  # a request not seen this step has finished
        self._sizes = sorted({size for size, _ in seen})
        self.stats.steps += 1
        self.stats.rows += len(out)
        self.stats.propose_ms += (time.perf_counter() - t0) * 1000.0
        return out
