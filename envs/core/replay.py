"""The arithmetic of replay shared by the engines and the oracle: **runs**, the one notion every engine reads.

``run[g]`` = the draft tokens a round starting at completion position ``g`` accepts with a long enough draft (bonus
excluded): a round with cap ``K`` produces ``min(run[g], K) + 1`` tokens, a token-level stop after ``j`` drafts
``min(run[g], j) + 1``. A per-start trace stores them per drafter (format v3, seed-independent); a per-position
trace's runs are those of its accept draws (:func:`per_position_runs`: a position is accepted when its uniform is
below its recorded acceptance probability, the uniforms a function of seed and request id). Every replay (single
request, vectorised, batched) and the oracles read the same runs, so their rows are paired.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np


def request_uniforms(seed: int, request_id: str, n: int) -> np.ndarray:
    """The common random numbers of one request: a function of (seed, request id) only."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(str(request_id).encode())])
    return rng.random(n)


def run_lengths(accepted: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``run[i]`` = consecutive accepted positions starting at ``i``, stopping at each request's end.

    Args:
        accepted: flat bool array of per-position outcomes.
        offsets: ``(R+1,)`` request boundaries in the flat array.
    """
    accepted = np.asarray(accepted, dtype=bool)
    n = len(accepted)
    idx = np.arange(n, dtype=np.int64)
    barrier = np.where(accepted, n, idx)
    next_reject = np.minimum.accumulate(barrier[::-1])[::-1]
    ends = np.repeat(np.asarray(offsets[1:], dtype=np.int64), np.diff(offsets))
    return np.minimum(next_reject, ends) - idx


def per_position_runs(p_accept: np.ndarray, offsets: np.ndarray, request_ids: Sequence[str] | np.ndarray,
                      seed: int) -> np.ndarray:
    """The runs of a per-position trace under ``seed``: ``run[g]`` = consecutive accepted draws from ``g`` within the
    request (accepted iff ``u < p_accept``, ``u`` from :func:`request_uniforms`).

    Args:
        p_accept: Flat acceptance probabilities of the requests, laid out by ``offsets``.
        offsets: ``(R+1,)`` request boundaries in ``p_accept``.
        request_ids: ``(R,)`` the requests' ids (their common random numbers).
        seed: Seed of the common random numbers.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    u = np.empty(int(offsets[-1]) - int(offsets[0]), dtype=np.float64)
    base = int(offsets[0])
    for r, rid in enumerate(request_ids):
        lo, hi = int(offsets[r]) - base, int(offsets[r + 1]) - base
        u[lo:hi] = request_uniforms(seed, rid, hi - lo)
    return run_lengths(u < p_accept, offsets - base)
