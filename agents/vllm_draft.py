"""The draft model inside specgym's vLLM proposer: the project's own draft proposes for the requests whose controller
picks it (``lookup-rule``, ``drafter-marginal``, ``fixed:K@draft``...), each request's key/value cache kept here.

vLLM's custom proposer (:mod:`specgym.agents.vllm_proposer`) runs in vLLM's worker process, after the target's step,
with the step's token ids and no model of its own: vLLM allocates KV-cache blocks for the target only. So the draft
runs here, in transformers (float32, greedy: the argmax of its logits; on vLLM's device: this CPU here, a GPU server's
GPU there, untested), one request at a time, with one
``DynamicCache`` per request that the proposer keeps with the request (requests are matched across steps by their
fingerprint and length; the proposer drops a finished request's state). A cache holds the token ids it was fed; each
proposal crops it to the longest prefix those share with the request's tokens now (the accepted drafts stay, the
rejected ones go), feeds the rest in one forward (the first proposed token comes from its last position), then
``K - 1`` one-token forwards. A request the draft has not served before is prefilled on its first proposal.

Costs (measured by the proposer's statistics, ``model_ms``): one forward per proposed token plus the catch-up of the
tokens the target produced since the request's last draft round, serially for each request that drafts this step: at
concurrency ``c`` a step that drafts for every request pays ``c`` times a single request's draft phase, where vLLM's
own ``draft_model`` proposer batches its drafts. The draft's logits give its confidence and entropy per token
(``DraftProposal``), which vLLM's proposers compute but pass to no policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.engines.live.model_cache import borrowing, materialized_draft
from specgym.errors import SpecgymError

#: The draft folder (specgym's format; a draft that borrows its target's tensors is completed from the target vLLM
#: serves).
ENV_DRAFT = "SPECGYM_PROPOSER_DRAFT"


@dataclass
class DraftCache:
    """One request's draft state: the model's cache and the token ids it holds."""

    cache: Any
    ids: list[int] = field(default_factory=list)


@dataclass
class DraftProposal:
    """A draft round's tokens with the draft's confidence (its probability of each) and entropy (nats)."""

    tokens: list[int]
    conf: list[float]
    entropy: list[float]


def common_prefix(a: list[int], b: np.ndarray) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


class DraftModel:
    """The draft, loaded once in vLLM's worker (module docstring).

    Args:
        folder: The draft folder.
        target: The target folder vLLM serves (completes a borrowing draft; its tokenizer must be the draft's).
        device: Where the draft runs (vLLM's ``device_config.device``; default CPU).
    """

    def __init__(self, folder: str | Path, target: str | Path | None = None, device: Any = None):
        import torch
        from transformers import AutoModelForCausalLM

        path = Path(folder).expanduser()
        if not (path / "config.json").is_file():
            raise SpecgymError(f"{ENV_DRAFT} {folder}: not a model folder (no config.json)")
        if borrowing(path) is not None:
            if target is None or not (Path(target) / "config.json").is_file():
                raise SpecgymError(f"{ENV_DRAFT} {folder}: borrows tensors from its target, and the target vLLM "
                                   f"serves ({target}) is not a local model folder")
            path = materialized_draft(path, target)
        self.torch = torch
        self.device = torch.device(device if device is not None else "cpu")
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        self.model = model.to(self.device).eval()
        self.folder = str(path)
        self.forwards = 0
        self.fed = 0
        self.ms = 0.0

    def new_cache(self) -> DraftCache:
        """An empty state for a new request."""
        from transformers import DynamicCache

        return DraftCache(DynamicCache())

    def _forward(self, state: DraftCache, ids: list[int]) -> Any:
        torch = self.torch
        out = self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                         past_key_values=state.cache, use_cache=True)
        state.ids += ids
        self.forwards += 1
        self.fed += len(ids)
        return out.logits[0, -1].float()

    def propose(self, state: DraftCache, tokens: np.ndarray, k: int) -> DraftProposal:
        """``k`` greedy draft tokens after ``tokens`` (the request's tokens so far), from its cache ``state``."""
        torch = self.torch
        t0 = time.perf_counter()
        keep = min(common_prefix(state.ids, tokens), len(tokens) - 1)  # at least one token to feed
        if len(state.ids) > keep:
            state.cache.crop(-(len(state.ids) - keep))  # transformers 5: a negative count removes that many
            del state.ids[keep:]
        out = DraftProposal([], [], [])
        with torch.inference_mode():
            logits = self._forward(state, [int(t) for t in tokens[keep:]])
            for j in range(k):
                logp = torch.log_softmax(logits, dim=-1)
                tok = int(torch.argmax(logp))
                out.tokens.append(tok)
                out.conf.append(float(logp[tok].exp()))
                out.entropy.append(float(-(logp.exp() * logp).sum()))
                if j + 1 < k:
                    logits = self._forward(state, [tok])
        self.ms += (time.perf_counter() - t0) * 1000.0
        return out

    def take_stats(self) -> dict[str, float]:
        """Forwards, tokens fed and milliseconds since the last call (then cleared)."""
        out = {"model_forwards": float(self.forwards), "model_tokens_fed": float(self.fed), "model_ms": self.ms}
        self.forwards, self.fed, self.ms = 0, 0, 0.0
        return out
