"""The arithmetic of replay shared by the engines and the oracle: each request's common random numbers and the runs
of accepted positions they imply.

A position is accepted when its uniform is below its recorded acceptance probability; every replay (single
request, vectorised, batched) and the clairvoyant oracle read the same runs, so their rows are paired.
"""

from __future__ import annotations

import zlib

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
