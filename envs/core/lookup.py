"""The context-lookup signal: has the current suffix occurred earlier in the sequence, and what followed it?

Prompt-lookup decoding drafts by copying: if the last few tokens occurred earlier in the context, the token that
followed them then is a good guess for the next one. specgym records that guess as a signal a controller can read
before verification (:mod:`specgym.envs.workloads.trace_format`, ``docs/reference/trace-format.md``).

**Definition.** For a sequence ``S`` of length ``L`` (prompt + completion so far) and ``n_max = 4``:
``lookup_len`` is the largest ``n <= n_max`` such that the suffix ``S[L-n:L]`` also occurs at an earlier start
``s < L - n`` (so the token after it, ``S[s+n]``, is already in ``S``); ``lookup_token`` is ``S[s+n]`` for the
most recent such ``s`` (the largest one); ``lookup_len = 0`` and ``lookup_token = -1`` when not even the last token
occurred before. :func:`lookup_brute` spells this out; :class:`NGramIndex` computes it in O(1) per appended token
(for each ``n``, a map from an n-gram to the index of the token that followed its latest occurrence), with a
rollback for speculative tokens that verification rejects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

#: Longest suffix the lookup matches.
LOOKUP_MAX_N = 4


def lookup_brute(seq: Sequence[int], n_max: int = LOOKUP_MAX_N) -> tuple[int, int]:
    """``(lookup_len, lookup_token)`` of ``seq`` straight from the definition (O(L * n_max); tests only)."""
    seq = list(seq)
    L = len(seq)
    for n in range(min(n_max, L - 1), 0, -1):
        suffix = seq[L - n:]
        for s in range(L - n - 1, -1, -1):
            if seq[s:s + n] == suffix:
                return n, seq[s + n]
    return 0, -1


class NGramIndex:
    """Incremental lookup over a growing sequence: :meth:`append` and :meth:`lookup` are O(1) (``n_max`` dict
    operations each); :meth:`truncate` undoes appends made since the last :meth:`commit` (rejected drafts).

    Args:
        tokens: Initial tokens (e.g. the prompt); committed.
        n_max: Longest suffix matched.
    """

    __slots__ = ("n_max", "seq", "_maps", "_undo", "_committed")

    def __init__(self, tokens: Iterable[int] = (), n_max: int = LOOKUP_MAX_N):
        self.n_max = int(n_max)
        self.seq: list[int] = []
        # _maps[n - 1][n-gram] = index (in seq) of the token that followed the n-gram's latest occurrence
        self._maps: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.n_max)]
        self._undo: list[list[tuple[int, tuple[int, ...], int | None]]] = []
        self._committed = 0
        for t in tokens:
            self.append(t)
        self.commit()

    def __len__(self) -> int:
        return len(self.seq)

    @property
    def committed(self) -> int:
        """Length of the committed sequence (what :meth:`truncate` can roll back to, at the least)."""
        return self._committed

    def append(self, token: int) -> None:
        """Append one token: every n-gram ending just before it now has a known continuation (this token)."""
        seq = self.seq
        seq.append(int(token))
        c = len(seq) - 1
        log = []
        for n in range(1, min(self.n_max, c) + 1):
            key = tuple(seq[c - n:c])
            m = self._maps[n - 1]
            log.append((n, key, m.get(key)))
            m[key] = c
        self._undo.append(log)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append several tokens."""
        for t in tokens:
            self.append(t)

    def lookup(self) -> tuple[int, int]:
        """``(lookup_len, lookup_token)`` of the current sequence (``(0, -1)`` when nothing matches)."""
        seq = self.seq
        L = len(seq)
        for n in range(min(self.n_max, L - 1), 0, -1):
            c = self._maps[n - 1].get(tuple(seq[L - n:]))
            if c is not None:
                return n, seq[c]
        return 0, -1

    def commit(self) -> None:
        """Make the current sequence permanent (forget the undo records)."""
        self._undo.clear()
        self._committed = len(self.seq)

    def truncate(self, length: int) -> None:
        """Undo appends back to ``length`` tokens (not below the committed length)."""
        if length < self._committed:
            raise ValueError(f"cannot truncate to {length} tokens below the committed {self._committed}")
        while len(self.seq) > length:
            for n, key, old in reversed(self._undo.pop()):
                m = self._maps[n - 1]
                if old is None:
                    del m[key]
                else:
                    m[key] = old
            self.seq.pop()


def lookup_columns(prompt: Sequence[int], completion: Sequence[int], draft_tokens: Sequence[int] | np.ndarray,
                   n_max: int = LOOKUP_MAX_N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lookup trace columns of one request: at each position ``i`` of the completion, on
    ``prompt + completion[:i]``.

    Args:
        prompt: Prompt token ids.
        completion: Completion token ids (the target's).
        draft_tokens: The draft's proposed token at each position (for ``lookup_agree``).

    Returns:
        ``(lookup_len int8, lookup_token int32, lookup_agree bool)``, each ``(len(completion),)``.
    """
    n = len(completion)
    lens = np.zeros(n, dtype=np.int8)
    toks = np.full(n, -1, dtype=np.int32)
    index = NGramIndex(prompt, n_max)
    for i, t in enumerate(completion):
        lens[i], toks[i] = index.lookup()
        index.append(t)
    agree = (lens > 0) & (toks == np.asarray(draft_tokens, dtype=np.int64))
    return lens, toks, agree
