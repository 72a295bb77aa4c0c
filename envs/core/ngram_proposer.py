"""The prompt-lookup (n-gram) drafter: vLLM's ``ngram`` proposer semantics, and its per-start runs.

vLLM (``vllm/v1/spec_decode/ngram_proposer.py``, ``speculative_config = {"method": "ngram", "prompt_lookup_min",
"prompt_lookup_max", "num_speculative_tokens"}``): find the **longest** ``n`` in ``[min_n, max_n]`` such that the
context's last ``n`` tokens occur earlier in the context; among the occurrences of that longest n-gram take the
**earliest**; propose the (up to) ``k`` tokens that followed it (fewer when the context ends first; none when nothing
matches). No model runs: the draft phase is a search over token ids.

Greedy decoding with these proposals is exact (verification keeps the leading proposals the target would have
produced and adds the target's own token), so the drafter's **per-start runs** follow from the token ids alone:
``run[g]`` = the leading proposals from ``prompt + completion[:g]`` that equal ``completion[g:]``
(:func:`ngram_runs`; format v3, what ``specgym record`` stores as the drafter ``ngram`` of a greedy recording).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: vLLM's ``prompt_lookup_min`` / ``prompt_lookup_max`` as specgym configures them (n matches the context lookup's
#: range, :data:`~specgym.envs.core.lookup.LOOKUP_MAX_N`).
NGRAM_MIN_N = 1
NGRAM_MAX_N = 4


def ngram_propose(tokens: Sequence[int] | np.ndarray, k: int, min_n: int = NGRAM_MIN_N,
                  max_n: int = NGRAM_MAX_N) -> list[int]:
    """The proposal of ``k`` tokens for ``tokens`` (module docstring); ``[]`` when nothing matches.

    Args:
        tokens: The context (prompt + tokens so far).
        k: Most tokens proposed.
        min_n, max_n: The n-gram lengths matched (vLLM's ``prompt_lookup_min`` / ``prompt_lookup_max``).
    """
    seq = np.asarray(tokens, dtype=np.int64)
    total = len(seq)
    if k <= 0 or total < max(min_n, 1) + 1:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = seq[total - n:]
        # start s of an earlier occurrence: s + n <= total - 1 (the match is not the suffix itself)
        windows = np.lib.stride_tricks.sliding_window_view(seq[:total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[0]) + n  # the earliest occurrence
            return seq[start:start + k].tolist()
    return []


def ngram_runs(prompt: Sequence[int], completion: Sequence[int], k: int, min_n: int = NGRAM_MIN_N,
               max_n: int = NGRAM_MAX_N) -> np.ndarray:
    """Per-start runs of the n-gram drafter on a greedy completion: ``run[g]`` = how many of the ``k`` proposals
    from ``prompt + completion[:g]`` match ``completion[g:]`` before the first difference (int16)."""
    ctx = [int(t) for t in prompt]
    comp = [int(t) for t in completion]
    out = np.zeros(len(comp), dtype=np.int16)
    for g in range(len(comp)):
        prop = ngram_propose(ctx + comp[:g], k, min_n, max_n)
        run = 0
        while run < len(prop) and g + run < len(comp) and prop[run] == comp[g + run]:
            run += 1
        out[g] = run
    return out
