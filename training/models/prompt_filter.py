"""Quality filters, de-duplication and source-grouped splits for generated prompts (numpy only, no model).

Three steps turn the target's raw user turns (:mod:`specgym.training.models.magpie`) into a prompts file:

1. :func:`quality_reason`: drop what is not a usable prompt: empty, too short, cut off at the length limit, the
   model refusing, echoing its steering system message or chat-template tokens, looping, or not text.
2. :func:`dedup`: drop exact duplicates (same normalised text) and near-duplicates (word 3-shingle Jaccard similarity
   at or above a threshold, found by MinHash with banded locality-sensitive hashing and then verified exactly). Two
   prompts over one passage are compared on their requests only, so different tasks over one passage both stay.
3. :func:`source_groups` and :func:`split_of`: every prompt gets a ``source``, the canonical id of its group, where a
   group joins prompts that share a passage or are near-duplicates at a lower threshold than step 2's (transitively);
   the split is a hash of the source, so no passage and no near-duplicate pair is ever in two splits.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specgym.errors import SpecgymError

SPLIT_NAMES = ("train", "val", "test")
#: The model declining or speaking as the assistant (a user turn never says this).
REFUSAL = re.compile(r"\b(i'?m sorry|i apologi[sz]e|i (?:can ?not|can't|am unable to) (?:help|assist|provide|answer)|"
                     r"as an ai\b|i am an ai\b|i'm an ai\b|(?:ai|large) language model)", re.IGNORECASE)
#: Chat-template markup leaking into the text (the model writing the next turn's header itself).
TEMPLATE_TOKEN = re.compile(r"<\|[^|>]{1,40}\|>|\[/?INST\]|<s>|</s>")
_WORD = re.compile(r"\w+", re.UNICODE)
#: MinHash: permutations, and bands of ``_PERMS // _BANDS`` rows (a pair at Jaccard 0.5 becomes a candidate with
#: probability 1 - (1 - 0.5**4)**32 = 0.87, at 0.6 0.99, at 0.7 0.9996; candidates are then verified exactly).
_PERMS, _BANDS = 128, 32
_PRIME = np.uint64(4294967291)  # the largest prime below 2**32: (a * x + b) mod p never overflows uint64


@dataclass
class Candidate:
    """One generated prompt, as the filters see it.

    Attributes:
        id: Its id (unique).
        text: The full prompt (request and passage, composed).
        request: The user turn the target wrote (the whole prompt when there is no passage).
        steer: The steering system message, without any passage (what an echo would repeat).
        passage: The id of the passage the prompt quotes, or None.
        terminated: The target ended the user turn itself (not cut at the length limit).
    """

    id: str
    text: str
    request: str
    steer: str = ""
    passage: str | None = None
    terminated: bool = True


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore; any script)."""
    return _WORD.findall(text.lower())


def shingles(text: str, n: int = 3) -> set[str]:
    """The word ``n``-shingles of a text (the whole text as one shingle when it has fewer than ``n`` words)."""
    w = words(text)
    if len(w) < n:
        return {" ".join(w)} if w else set()
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    """``|a & b| / |a | b|`` (0 for two empty sets)."""
    return len(a & b) / len(a | b) if a or b else 0.0


def quality_reason(c: Candidate, min_words: int = 4) -> str | None:
    """Why ``c`` is not a usable prompt (a short reason), or None when it passes every filter."""
    req = c.request.strip()
    if not req:
        return "empty"
    if not c.terminated:
        return "unterminated"
    w = words(req)
    if len(w) < min_words:
        return "too_short"
    if "\ufffd" in req or any(ord(ch) < 32 and ch not in "\n\t\r" for ch in req):
        return "non_text"
    visible = [ch for ch in req if not ch.isspace()]
    if sum(ch.isalpha() for ch in visible) < 0.5 * len(visible):
        return "non_text"
    if TEMPLATE_TOKEN.search(req):
        return "template_token"
    if REFUSAL.search(req):
        return "refusal"
    if c.steer and (req.lower().startswith(("you are", "the user")) or shingles(req, 5) & shingles(c.steer, 5)):
        return "echo"
    lines = [ln.strip() for ln in req.splitlines() if ln.strip()]
    if (len(w) >= 20 and len(set(w)) < 0.3 * len(w)) or (lines and max(map(lines.count, lines)) >= 3):
        return "repetitive"
    return None


def normalise(text: str) -> str:
    """The text as exact de-duplication compares it: its words, lower-cased, single-spaced."""
    return " ".join(words(text))


def _hash32(shingle: str) -> int:
    return int.from_bytes(hashlib.blake2b(shingle.encode("utf-8"), digest_size=4).digest(), "little")


def minhash(sets: Sequence[set[str]], seed: int = 0) -> np.ndarray:
    """``(len(sets), 128)`` MinHash signatures (uint64 values below 2**32) of shingle sets; an empty set's row is all
    ``2**32`` (it matches nothing)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, int(_PRIME), _PERMS, dtype=np.uint64)
    b = rng.integers(0, int(_PRIME), _PERMS, dtype=np.uint64)
    sig = np.full((len(sets), _PERMS), 1 << 32, dtype=np.uint64)
    for i, s in enumerate(sets):
        if s:
            x = np.fromiter((_hash32(t) for t in s), dtype=np.uint64, count=len(s))
            sig[i] = ((x[:, None] * a[None, :] + b[None, :]) % _PRIME).min(axis=0)
    return sig


def near_pairs(sets: Sequence[set[str]], threshold: float, seed: int = 0) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, whose Jaccard similarity is at least ``threshold``: candidates from banded
    MinHash (see :data:`_BANDS`), each verified on the shingle sets themselves (no false positives)."""
    sig = minhash(sets, seed)
    rows = _PERMS // _BANDS
    candidates: set[tuple[int, int]] = set()
    for band in range(_BANDS):
        buckets: dict[bytes, list[int]] = {}
        for i, key in enumerate(sig[:, band * rows:(band + 1) * rows]):
            if sets[i]:
                buckets.setdefault(key.tobytes(), []).append(i)
        for members in buckets.values():
            candidates.update((members[x], members[y]) for x in range(len(members))
                              for y in range(x + 1, len(members)))
    return sorted(p for p in candidates if jaccard(sets[p[0]], sets[p[1]]) >= threshold)


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        ri, rj = self.find(i), self.find(j)
        if ri != rj:
            self.parent[max(ri, rj)] = min(ri, rj)  # the root is the group's first member


def dedup(cands: Sequence[Candidate], threshold: float = 0.7, seed: int = 0) -> dict[int, str]:
    """The candidates to drop, ``{index: reason}``: ``duplicate of <id>`` (exact, normalised text) or ``near-duplicate
    of <id>`` (request Jaccard >= ``threshold``, same passage or none). The first of a group (lowest index) stays."""
    dropped: dict[int, str] = {}
    first: dict[str, int] = {}
    for i, c in enumerate(cands):
        key = normalise(c.text)
        if key in first:
            dropped[i] = f"duplicate of {cands[first[key]].id}"
        else:
            first[key] = i
    left = [i for i in range(len(cands)) if i not in dropped]
    uf = _UnionFind(len(left))
    for x, y in near_pairs([shingles(cands[i].request) for i in left], threshold, seed):
        if cands[left[x]].passage == cands[left[y]].passage:
            uf.union(x, y)
    for x, i in enumerate(left):
        root = uf.find(x)
        if root != x:
            dropped[i] = f"near-duplicate of {cands[left[root]].id}"
    return dropped


def source_groups(cands: Sequence[Candidate], threshold: float = 0.5, seed: int = 0) -> list[str]:
    """Each candidate's ``source``: the smallest member key of its group, where a member's key is its passage id (or
    ``prompt:<id>`` without one) and a group joins, transitively, prompts sharing a passage and prompts whose full
    texts are near-duplicates (Jaccard >= ``threshold``)."""
    uf = _UnionFind(len(cands))
    by_passage: dict[str, int] = {}
    for i, c in enumerate(cands):
        if c.passage is not None:
            uf.union(by_passage.setdefault(c.passage, i), i)
    for i, j in near_pairs([shingles(c.text) for c in cands], threshold, seed):
        uf.union(i, j)
    best: dict[int, str] = {}
    for i, c in enumerate(cands):
        key = c.passage if c.passage is not None else f"prompt:{c.id}"
        root = uf.find(i)
        best[root] = min(best.get(root, key), key)
    return [best[uf.find(i)] for i in range(len(cands))]


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    """``(train, val, test)`` fractions: three finite numbers >= 0 summing to 1."""
    f = tuple(float(v) for v in fractions)
    if len(f) != 3 or any(not np.isfinite(v) or v < 0 for v in f) or abs(sum(f) - 1.0) > 1e-6:
        raise SpecgymError(f"--splits {','.join(map(str, fractions))}: need three fractions >= 0 (train, val, test) "
                           f"summing to 1")
    return f[0], f[1], f[2]


def split_of(source: str, fractions: Sequence[float], seed: int = 0) -> str:
    """The split of every prompt of ``source``: a uniform number in ``[0, 1)`` hashed from ``(seed, source)``, cut at
    the cumulative fractions; a function of the source alone, so a group never straddles two splits."""
    f = check_fractions(fractions)
    u = int.from_bytes(hashlib.sha256(f"{seed}:{source}".encode()).digest()[:8], "big") / 2.0 ** 64
    if u < f[0]:
        return "train"
    return "val" if u < f[0] + f[1] else "test"
