"""The workload trace format: one self-describing Parquet file per workload.

Layout: one row per request. Request columns are scalars (``request_id``, ``category``, ``temperature``,
``prompt_len``, ``prompt_text``, ``split``); per-position columns (``p_accept``, ``draft_conf``, ``draft_entropy``,
``target_entropy``) are ``list<float32>``, which Arrow stores flat with per-request offsets, so loading is a
zero-copy view of one contiguous float array plus an offsets array. Workload metadata (name, source, generator
parameters or model names, format version, cost profile, split seed) is JSON under the schema metadata key
``specgym``.

Every value at position ``i`` is computed with the correct prefix (prompt + the target's first ``i`` tokens):

* ``p_accept[i]``: probability that a draft token proposed for position ``i`` is accepted. Greedy traces
  (temperature 0): 1 if the draft's argmax equals the target's token, else 0. Sampled traces: the speculative
  sampling acceptance ``sum_x min(p(x), q(x))`` of target distribution ``p`` and draft distribution ``q``.
* ``draft_conf[i]``: the draft's probability of the token it proposes (greedy: its max probability; sampled: the
  probability of a token drawn from ``q``).
* ``draft_entropy[i]``: entropy of the draft distribution (nats); ``target_entropy[i]``: the target's, NaN if
  unknown (synthetic traces).

**Format v2** adds optional per-position signal columns, for the acceptance predictor (what a controller can know
before verification) and exact greedy tree replay (the rank of the target's token). Each is present in every
request or absent; an absent column loads as ``None``, never as zeros (v1 files and synthetic workloads have none).
With ``d_i`` the draft's logits at position ``i`` (correct prefix), ``q_i`` its distribution at the recording
temperature (greedy: ``softmax(d_i)``; sampled: ``softmax(d_i / T)``) and ``t_i`` the target's token:

* ``token_id`` (``list<int32>``): ``t_i``, the completion itself (lookups and tree tests recompute from it);
* ``draft_token`` (``list<int32>``): the token the draft proposes (greedy: ``argmax d_i``, so
  ``p_accept = [draft_token == token_id]``; sampled: the recorder's seeded draw from ``q_i``);
* ``target_rank`` (``list<int32>``): the TRUE rank of ``t_i`` in the draft's order, 0 = the draft's top-1:
  ``#{v: d_i[v] > d_i[t_i]} + #{v < t_i: d_i[v] == d_i[t_i]}`` (ties broken by token id, as ``argmax`` does; raw
  logits, so the rank does not depend on the temperature). Not capped: a tree of width ``w`` at that depth holds
  the target's token iff ``target_rank < w``. Greedy: ``p_accept = [target_rank == 0]``;
* ``draft_topk`` (``list<fixed_size_list<float32>[8]>``): the 8 largest probabilities of ``q_i``, descending (0-padded
  when the vocabulary is smaller);
* ``lookup_len`` (``list<int8>``), ``lookup_token`` (``list<int32>``), ``lookup_agree`` (``list<bool>``): the
  context lookup on ``prompt + t_0..t_{i-1}`` (:mod:`specgym.envs.core.lookup`): the longest ``n <= 4`` whose
  suffix occurred earlier (0 if none), the token that followed its latest earlier occurrence (-1 if none), and
  whether that token equals ``draft_token``;
* ``hidden_sketch`` (``list<fixed_size_list<float32>[D]>``, optional even in recorded v2 traces): the draft's last
  hidden state (after the final layer norm) times a fixed seeded random projection ``(hidden, D)``, stored exactly
  in the metadata (``signals.hidden_sketch``, :func:`~specgym.envs.core.signals.projection_to_meta`).

* ``ranks_head`` (``list<fixed_size_list<int8>[J]>``) and ``topk_head`` (``list<fixed_size_list<uint16>[8 J]>``),
  recorded for a pair with a draft head (:mod:`specgym.envs.engines.live.draft_head`): per START ``g`` (the round
  that produces completion token ``g`` first), ``ranks_head[g, j]`` = the rank of ``t_{g+j}`` among the head's scores
  after ``j + 1`` head steps from that start along the completion (the first from the target's hidden state before
  the last accepted token with that token, each next from the previous step's feature with the true token: the live
  head tree's steps, :mod:`specgym.envs.engines.live.head_tree`), ``j = 0..J-1``; 0 = top-1, ties by the head's
  column; stored as ``min(rank, 64)`` (a node has at most 64 children, so the cap loses nothing a tree reads), and 64
  where the head cannot propose the token or ``g + j`` is past the completion. Unlike ``target_rank`` it depends on
  the start (the head's feature there is its own prediction), hence one row per start. ``topk_head[g, 8j : 8j+8]`` =
  the head's 8 largest probabilities at the same step, descending, times 65535 (0 past the completion). The tree
  replay of head trees (``TREE_SPEC@head``) reads them; a greedy round of a rank-defined tree at ``g`` accepts
  ``TreeShape.accepted(ranks_head[g], room)``.

The metadata block ``signals`` describes them (``topk``, ``lookup_max_n``, ``vocab_size``, ``rank``,
``hidden_sketch``; ``head_ranks`` = ``{"version": 1, "depth": J, "cap": 64, "topk": 8, "topk_scale": 65535, ...}``,
present exactly when ``ranks_head`` is, and a version other than 1 is refused in one line; ``topk_head``, which only
EAGLE-2's modelled replay on the head reads and which takes most of the bytes (about 130 per position compressed,
``ranks_head`` about 4), needs ``ranks_head`` and may be left out). The loader checks every present column (list
type, per-request lengths equal to ``p_accept``'s, value type, ranges, and the identities above) and names the file
and the field in a one-line error.

**Sharded workloads.** A workload too large for memory (millions of requests) is stored as a *dataset folder*
(written by :mod:`specgym.envs.workloads.dataset`):

* ``workload.json``: the metadata record: ``{"format": "specgym-sharded-workload", "version": 1, "metadata": {...},
  "shards": [{"file": "shard-00000.parquet", "requests": R, "positions": P}, ...], "requests": R_total,
  "positions": P_total}``, where ``metadata`` is the workload's metadata block
  (:meth:`Workload.metadata`: name, source, profile, split seed, extra, signals, format version);
* the shards, in order: each an ordinary single-file workload (the format above) whose embedded metadata is exactly
  the record's ``metadata`` (so every shard is self-describing and loadable alone).

The workload is the concatenation of the shards in the listed order: request order, splits and columns are the
shards' own. Request ids are unique over the whole dataset.

Reading is lazy: :func:`open_dataset` checks only the record; :meth:`ShardedWorkload.iter_shards` loads and
validates one shard at a time (its columns, its request count against the record, its metadata against the
record's), so replay, evaluation and the oracles (:mod:`specgym.eval.streaming`) hold one shard in memory.
:func:`load_dataset` concatenates every shard into one in-memory :class:`Workload` (what ``load_workload`` returns
for a folder, for the tools that need the whole workload at once).

**Format v3: per-start runs** (SpecDecode-Bench's published traces, :mod:`specgym.envs.workloads.specdecode`; a
recorded second drafter). A drafter's acceptance may be stored as its *runs*: ``runs_<drafter>``
(``list<int16>``), ``runs[g]`` = the draft tokens a verification round that *starts* at completion position ``g``
accepts when the drafter proposes enough of them (the bonus token excluded). A round at ``g`` with cap ``K``
produces ``min(runs[g], K) + 1`` tokens, and a token-level stop after ``j`` drafts ``min(runs[g], j) + 1``: replay is
exact for any chain controller, and seed-independent. The value at ``g + 1`` is not ``runs[g] - 1`` in general (a
drafter conditions on where the round starts), which is why per-position acceptance cannot express them. The
metadata block ``drafters`` lists every drafter, the default first: ``{"name", "kind": "model"|"lookup", "runs":
"per-start"|"per-position", ...provenance}``; at most one drafter is ``per-position`` (its runs are those of
``p_accept``'s draws). A v1/v2 trace has one implicit per-position drafter, ``draft``.

In v3 the per-position columns ``p_accept``, ``draft_conf``, ``draft_entropy`` and ``target_entropy`` are optional:
a per-start trace lacks what its source did not record, and an absent column loads as ``None`` (never zeros or NaN).
Every consumer either works without it (replay, the oracles: the informed oracle on a per-start trace, which is
deterministic, is the clairvoyant one) or refuses in one line naming the workload and the column
(:meth:`Workload.require`). A workload is written as v3 only when it uses a v3 feature (runs, drafters, an absent
column), else as v2, so older readers keep reading what they wrote.

**Requests start after the prefill.** Position 0 is the first token a decoding round produces; ``prompt_len``
counts every token in the KV cache before it, so the cache holds ``prompt_len + i`` tokens when the round at
position ``i`` starts (context-aware cost profiles price it, :mod:`specgym.envs.core.cost`). An imported request
whose first output token came from the prefill counts it in ``prompt_len``.

Replay draws ``u[i]`` uniformly per position and accepts iff ``u[i] < p_accept[i]``, or reads a drafter's runs
(:mod:`specgym.envs.engines.replay.trace_engine`); the engine hands the signal columns to controllers as
:class:`~specgym.envs.core.signals.DraftSignals`.

**Modules.** This module is the public face: the record is :mod:`~specgym.envs.workloads.workload`, assembly
:mod:`~specgym.envs.workloads.build`, validation :mod:`~specgym.envs.workloads.validation`, Parquet I/O
:mod:`~specgym.envs.workloads.parquet_io`, the sharded reader :mod:`~specgym.envs.workloads.sharded`; everything
is importable from here.
"""

from __future__ import annotations

from pathlib import Path

import specgym.catalogue as catalogue
from specgym.envs.workloads.build import workload_from_requests
from specgym.envs.workloads.parquet_io import read_workload_file, save_workload, save_workloads, workload_to_table
from specgym.envs.workloads.sharded import (
    RECORD,
    RECORD_FORMAT,
    RECORD_VERSION,
    ShardedWorkload,
    ShardInfo,
    concat_workloads,
    load_dataset,
    metadata_difference,
    open_dataset,
)
from specgym.envs.workloads.validation import validate_workload
from specgym.envs.workloads.workload import (
    FORMAT_VERSION,
    META_KEY,
    POSITION_COLUMNS,
    REQUEST_COLUMNS,
    RUNS_PREFIX,
    SIGNAL_COLUMNS,
    SOURCE_KINDS,
    SPLITS,
    SUPPORTED_VERSIONS,
    Workload,
    assign_splits,
    drafter_entry,
    split_counts,
)

__all__ = [
    "FORMAT_VERSION", "META_KEY", "POSITION_COLUMNS", "RECORD", "RECORD_FORMAT", "RECORD_VERSION", "REQUEST_COLUMNS",
    "RUNS_PREFIX", "SIGNAL_COLUMNS", "SOURCE_KINDS", "SPLITS", "SUPPORTED_VERSIONS", "ShardInfo", "ShardedWorkload",
    "Workload", "assign_splits", "cached_workload", "concat_workloads", "drafter_entry", "load_dataset",
    "load_workload", "metadata_difference", "open_dataset", "read_workload_file", "save_workload", "save_workloads",
    "split_counts", "validate_workload", "workload_from_requests", "workload_to_table",
]


def load_workload(name_or_path: str | Path) -> Workload:
    """Load and validate a workload; any defect raises a one-line :class:`SpecgymError` naming file and field.

    A folder is a sharded workload: every shard is read, validated and concatenated (to stream it shard by shard
    instead, :func:`open_dataset`)."""
    path = catalogue.resolve("workload", name_or_path)
    return load_dataset(path) if path.is_dir() else read_workload_file(path)


_CACHE: dict[tuple[str, float], Workload] = {}


def cached_workload(name_or_path: str | Path) -> Workload:
    """:func:`load_workload` once per process (keyed by resolved path and modification time)."""
    path = catalogue.resolve("workload", name_or_path).resolve()
    key = (str(path), path.stat().st_mtime)
    wl = _CACHE.get(key)
    if wl is None:
        wl = _CACHE[key] = load_workload(path)
    return wl
