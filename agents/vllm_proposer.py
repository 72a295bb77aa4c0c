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
finish. A request is known by its first :data:`FINGERPRINT_TOKENS` tokens and its length: a row continues the request
of the same fingerprint whose last length it extends by one step's tokens (1 to K + 1); anything else starts a new
request. Requests not seen in a step have finished (or were preempted: they start afresh). Two running requests with
the same first tokens share a fingerprint; each row then continues the one whose length it extends, and where both
fit, the controller states may be swapped: a K choice, never the output (verification is vLLM's).

**Configuration** (read when vLLM builds the proposer): ``SPECGYM_PROPOSER_CONTROLLER`` names the controller
(a :mod:`specgym.agents.specs` drafter spec over ``ngram``: ``marginal@ngram``, the default, or ``fixed:K@ngram``),
``SPECGYM_PROPOSER_PROFILE`` the single-request cost profile it prices rounds with (name or path; default: a profile
measured where vLLM runs, required by cost-aware controllers). Decisions are numpy-only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.agents.specs import build
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.drafter_choice import DrafterController, check_decision
from specgym.envs.core.lookup import NGramIndex
from specgym.envs.core.ngram_proposer import NGRAM_DRAFTER, ngram_propose
from specgym.envs.core.rounds import RequestContext, RoundOutcome, RoundStart
from specgym.envs.profiles import load_profile
from specgym.errors import SpecgymError

#: The controller spec (default :data:`DEFAULT_CONTROLLER`).
ENV_CONTROLLER = "SPECGYM_PROPOSER_CONTROLLER"
#: The cost profile (name or path).
ENV_PROFILE = "SPECGYM_PROPOSER_PROFILE"
DEFAULT_CONTROLLER = "marginal@ngram"
#: How many leading tokens identify a request across steps.
FINGERPRINT_TOKENS = 64


@dataclass
class _Request:
    """One running request as the proposer knows it."""

    controller: DrafterController
    index: NGramIndex  # its tokens, for the context lookup (appended step by step)
    start: int  # its length when first seen (prompt + first token): completion positions count from here
    length: int  # its length at the last step
    drafted: int = 0  # what the last step proposed for it
    last: RoundStart | None = None


class SpecgymProposer:
    """Prompt lookup with a per-request K chosen by a specgym controller (module docstring).

    Args:
        vllm_config: vLLM's config (``speculative_config``: ``num_speculative_tokens``, ``prompt_lookup_min/max``;
            ``model_config.max_model_len``).
        controller: A drafter spec over ``ngram`` (default: ``$SPECGYM_PROPOSER_CONTROLLER`` or
            :data:`DEFAULT_CONTROLLER`).
        profile: The cost profile (default: ``$SPECGYM_PROPOSER_PROFILE``).
    """

    def __init__(self, vllm_config: Any, controller: str | None = None, profile: CostProfile | str | None = None):
        spec = vllm_config.speculative_config
        self.k_max = int(spec.num_speculative_tokens)
        self.min_n = int(getattr(spec, "prompt_lookup_min", None) or 1)
        self.max_n = int(getattr(spec, "prompt_lookup_max", None) or 4)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.spec = controller or os.environ.get(ENV_CONTROLLER) or DEFAULT_CONTROLLER
        build(self.spec, self.k_max, kinds=("drafter",))  # a bad spec: one line now, not at the first step
        source = profile if profile is not None else os.environ.get(ENV_PROFILE)
        if source is None:
            raise SpecgymError(f"{ENV_PROFILE} is not set: the proposer's controller prices rounds with a "
                               f"single-request cost profile (specgym profile, or a shipped one such as cpu-smollm2)")
        prof = source if isinstance(source, CostProfile) else load_profile(source)
        self.profile = prof.with_drafter(NGRAM_DRAFTER, "lookup")  # a model-drafter profile prices lookup at no draft
        self.requests: dict[str, list[_Request]] = {}

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: prompt lookup reads the token ids."""

    def _fingerprint(self, tokens: np.ndarray) -> str:
        return hashlib.blake2b(np.ascontiguousarray(tokens[:FINGERPRINT_TOKENS], np.int64).tobytes(),
                               digest_size=12).hexdigest()

    def _match(self, key: str, tokens: np.ndarray, sampled: int, taken: set[int]) -> _Request:
        """The running request this row continues (module docstring), its tokens appended; or a new one."""
        n = len(tokens)
        for req in self.requests.get(key, []):
            if id(req) not in taken and n == req.length + sampled:
                for t in tokens[req.length:].tolist():
                    req.index.append(t)
                req.index.commit()
                return req
        ctrl = build(self.spec, self.k_max, kinds=("drafter",)).controller
        ctrl.reset(RequestContext(f"vllm-{key}", "vllm", 0.0, n, self.k_max, self.profile), (NGRAM_DRAFTER,))
        return _Request(ctrl, NGramIndex(tokens.tolist()), n, n)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """One draft list per row: prompt lookup's proposal at the K its request's controller chose."""
        seen: dict[str, list[_Request]] = {}
        taken: set[int] = set()
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not sampled or n >= self.max_model_len:  # vLLM's own skips: no step sampled, or no room left
                out.append([])
                continue
            tokens = np.asarray(token_ids_cpu[i, :n])
            key = self._fingerprint(tokens)
            req = self._match(key, tokens, len(sampled), taken)
            taken.add(id(req))
            if req.last is not None:  # the step verified what this request proposed last time
                accepted = len(sampled) - 1
                req.controller.observe(RoundOutcome(
                    req.last.position, req.drafted, req.drafted, accepted, accepted + 1,
                    self.profile.round_time(req.drafted, req.last.kv, NGRAM_DRAFTER if req.drafted else None),
                    drafter=NGRAM_DRAFTER if req.drafted else None))
            req.length = n
            start = RoundStart(n - req.start, n, int(req.index.lookup()[0]))
            dec = check_decision(req.controller.propose(start), req.controller.name)
            k = min(dec.k, self.k_max, self.max_model_len - n - 1) if not dec.plain else 0
            drafts = ngram_propose(tokens, k, self.min_n, self.max_n) if k > 0 else []
            req.drafted, req.last = len(drafts), start
            seen.setdefault(key, []).append(req)
            out.append(drafts)
        self.requests = seen  # a request not seen this step has finished
        return out
