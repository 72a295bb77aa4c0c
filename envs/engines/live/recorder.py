"""Record workload traces from a real draft/target pair (``specgym record``).

For each prompt the target generates the completion (with the live engine at a fixed K: speculative decoding is
exact, so the completion is distributed as the target's own; greedy completions are the target's greedy ones),
then ONE teacher-forced forward of each model over ``prompt + completion`` yields every trace column at once
(the columns of :mod:`specgym.envs.workloads.trace_format`; every value at position ``i`` uses the correct prefix):

* greedy (T = 0): ``p_accept[i] = 1`` if the draft's argmax equals the target's token ``i``, else 0;
* sampling (T > 0): with ``p = softmax(target/T)`` and ``q = softmax(draft/T)``: ``p_accept = sum_x min(p, q)``;
* ``draft_conf`` and ``draft_entropy`` by :func:`~specgym.envs.engines.live.draft_stats.draft_stats`, the live engine's
  definition (sampling draws the proposed token from ``q``, seeded), so replayed and live features have the same
  distribution; ``target_entropy = H(p)``;
* the format v2 signal columns: ``token_id`` (the completion), ``draft_token`` (the proposed token above),
  ``target_rank`` (:func:`~specgym.envs.engines.live.draft_stats.token_rank` of the target's token in the draft's raw
  logits), ``draft_topk`` (:func:`~specgym.envs.engines.live.draft_stats.top_probs` of ``q``), the context lookup
  (``lookup_len``, ``lookup_token``, ``lookup_agree``; :func:`~specgym.envs.core.lookup.lookup_columns`) and, with
  ``hidden_sketch=D``, the draft's last hidden state (after the final layer norm) times a fixed projection
  (:func:`~specgym.envs.core.signals.sketch_projection`, stored in the metadata).

A **greedy** recording (every request at T = 0) also holds the per-start runs of the prompt-lookup drafter
(``runs_ngram``, format v3, drafters ``draft`` (per-position, the default) then ``ngram``): from the token ids alone,
exactly (:func:`~specgym.envs.core.ngram_proposer.ngram_runs`, vLLM's ``ngram`` proposals of up to 16 tokens with
the live engine's ``prompt_lookup_min/max``), so the drafter-choice controllers replay on it what the live engine's
n-gram drafter does.

A pair with a **draft head** adds its per-start runs (``runs_head``) and, for the tree replay of head trees, its
per-start ranks and top-8 probabilities (``ranks_head``, ``topk_head``, depth :data:`HEAD_RANKS_DEPTH`;
:func:`head_rank_columns`; every request, sampled ones too, the ranks being those of its tokens), a greedy
request's both from one teacher-forced target forward; :func:`with_head_ranks` adds the ranks to an older recording.

Prompts: a prompts file (:mod:`specgym.envs.workloads.prompts`).

Trace extraction is batched: the teacher-forced forwards of ``batch`` requests run together (right-padded).

Resuming: finished requests are appended to ``<out>.partial.jsonl`` as they complete (one JSON line each, after a
header line with the recording settings). Re-running the same command skips them; the final Parquet file is
written atomically and the partial file removed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.acceptance_predictor import model_signature
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER, NGRAM_DRAFTER
from specgym.envs.core.lookup import LOOKUP_MAX_N, lookup_columns
from specgym.envs.core.ngram_proposer import ngram_runs
from specgym.envs.core.rounds import DEFAULT_K_MAX, K_MAX_LIMIT
from specgym.envs.core.signals import TOPK, projection_to_meta, sketch_projection
from specgym.envs.engines.live.clock import host_generator
from specgym.envs.engines.live.draft_head import head_runs, target_features
from specgym.envs.engines.live.draft_stats import draft_stats, token_rank, top_probs
from specgym.envs.engines.live.engine import LiveEngine
from specgym.envs.engines.live.head_tree import NO_RANK, head_rank_table
from specgym.envs.engines.live.model_loading import LivePair, encode_prompt
from specgym.envs.engines.live.sampled_runs import SAMPLED_RUNS_SOURCE, request_sampled_runs
from specgym.envs.workloads.dataset import DEFAULT_SHARD_REQUESTS, chunks, write_dataset
from specgym.envs.workloads.loops import loop_summary
from specgym.envs.workloads.prompts import PromptSpec, splits_named
from specgym.envs.workloads.trace_format import (
    Workload,
    assign_splits,
    drafter_entry,
    save_workload,
    workload_from_requests,
)
from specgym.envs.workloads.workload import HEAD_RANK_CAP, HEAD_RANKS_META, HEAD_TOPK_SCALE, head_ranks_meta
from specgym.errors import SpecgymError
from specgym.io import check_output, sha256_file
from specgym.paths import portable_name

PARTIAL_SUFFIX = ".partial.jsonl"
#: How a greedy recording's whole-proposal drafters' runs are made (the ``drafters`` metadata's source).
GREEDY_RUNS_SOURCE = ("the leading matches of each start's proposal with the greedy completion (recomputed from its "
                      "token ids; the draft head's from one teacher-forced target forward)")
#: The train/val/test fractions of a recording without ``--splits``.
DEFAULT_SPLITS = (0.8, 0.1, 0.1)
#: Depth ``J`` of the draft head's per-start ranks a recording stores (``ranks_head``, ``topk_head``): the tree
#: replay's default deepest tree (``DEFAULT_K_MAX``); head trees deeper than it are refused in replay.
HEAD_RANKS_DEPTH = DEFAULT_K_MAX


@dataclass(frozen=True)
class RecordingSpec:
    """What a recording is, apart from its pair, prompts and output: how completions are drawn and priced and which
    columns are written. A resumed recording must have the same spec (its resume file's header says so).

    Attributes:
        max_new_tokens: Completion length ``N``, or a range ``(LO, HI)`` each request draws its length from
            (:func:`request_length`); a prompt's own ``max_new_tokens`` wins.
        temperature: Sampling temperature (0 = greedy); a prompt's own temperature wins.
        profile: The cost profile stored with the workload.
        name: Workload name (default: the output's stem).
        seed: Seed of lengths, sampling and splits.
        gen_k: Fixed draft cap the completions are generated with (exact speculative decoding: only speed depends
            on it).
        split_fractions: Train/val/test fractions honoured exactly (``None``: :data:`DEFAULT_SPLITS`, at least one
            val and one test request from 3 requests on).
        batch: Requests per batched teacher-forced forward.
        hidden_sketch: Dimension of the optional ``hidden_sketch`` column (0 = not recorded).
        stop_at_eos: End a completion at the target's EOS token (a chat model's answer ends there, as served);
            completions then have their own lengths up to ``max_new_tokens``.
        prompts_path: The prompts file (its checksum identifies the prompts of a resumed recording).
        extra: More metadata for the workload.
    """

    max_new_tokens: int | tuple[int, int]
    temperature: float
    profile: CostProfile
    name: str | None = None
    seed: int = 0
    gen_k: int = 4
    split_fractions: tuple[float, float, float] | None = None
    batch: int = 8
    hidden_sketch: int = 0
    stop_at_eos: bool = False
    prompts_path: str | Path | None = None
    extra: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        lo, hi = self.lengths
        if lo < 1 or hi < lo:
            raise SpecgymError(f"--max-new-tokens: need 1 <= LO <= HI, got {self.length_text!r}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise SpecgymError(f"--temperature must be >= 0, got {self.temperature}")
        if self.batch < 1:
            raise SpecgymError(f"batch must be >= 1, got {self.batch}")

    @property
    def lengths(self) -> tuple[int, int]:
        """The completion-length range ``(LO, HI)``."""
        n = self.max_new_tokens
        return (int(n), int(n)) if isinstance(n, int) else (int(n[0]), int(n[1]))

    @property
    def length_text(self) -> str:
        """``N`` or ``LO-HI``, as ``--max-new-tokens`` takes it (stored in the trace's source)."""
        lo, hi = self.lengths
        return str(lo) if lo == hi else f"{lo}-{hi}"


def request_length(request_id: str, lo: int, hi: int, seed: int) -> int:
    """Completion length of a request: a deterministic draw in [lo, hi] from (seed, request id)."""
    if lo == hi:
        return lo
    rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(request_id.encode()), 17])
    return int(rng.integers(lo, hi + 1))


def trace_columns(draft: Any, target: Any, prompt_ids: Sequence[int], completion: Sequence[int],
                  temperature: float, seed: int = 0, vocab: int | None = None,
                  sketch: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every per-position trace column of one request from one teacher-forced forward of each model."""
    return trace_columns_batch(draft, target, [(prompt_ids, completion, temperature, seed)], vocab, sketch)[0]


def trace_columns_batch(draft: Any, target: Any, items: Sequence[tuple[Sequence[int], Sequence[int], float, int]],
                        vocab: int | None = None, sketch: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """Trace columns of several requests, ``(prompt_ids, completion, temperature, seed)`` each, with one batched
    teacher-forced forward of each model (right-padded: a causal model's logits at a position never see padding).

    Args:
        sketch: The hidden sketch's projection ``(hidden, D)``; ``None`` = no ``hidden_sketch`` column.
    """
    import torch

    seqs = [list(p) + list(c[:-1]) for p, c, _, _ in items]
    width = max(len(x) for x in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long, device=target.device)
    mask = torch.zeros_like(ids)
    for row, x in enumerate(seqs):
        ids[row, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[row, : len(x)] = 1
    with torch.inference_mode():
        t_all = target(input_ids=ids, attention_mask=mask).logits
        d_out = draft(input_ids=ids.to(draft.device), attention_mask=mask.to(draft.device),
                      output_hidden_states=sketch is not None)
        d_all = d_out.logits
    out = []
    for row, (prompt_ids, completion, temperature, seed) in enumerate(items):
        p_len, n = len(prompt_ids), len(completion)
        t_logits = t_all[row, p_len - 1 : p_len - 1 + n].float()
        d_logits = d_all[row, p_len - 1 : p_len - 1 + n].float().to(t_logits.device)
        if vocab is not None:
            t_logits, d_logits = t_logits[:, :vocab], d_logits[:, :vocab]
        tokens = torch.tensor(list(completion), dtype=torch.long, device=t_logits.device)
        gen = None
        if temperature > 0:
            gen = host_generator(seed)  # on the host: the trace does not depend on the device
        d = draft_stats(d_logits, temperature, generator=gen)
        lp = torch.log_softmax(t_logits / temperature if temperature > 0 else t_logits, -1)
        p = lp.exp()
        p_accept = (d.tokens == tokens).float() if temperature == 0 else \
            torch.minimum(p, d.probs).sum(-1).clamp(0.0, 1.0)
        cols = {"p_accept": p_accept, "draft_conf": d.conf, "draft_entropy": d.entropy,
                "target_entropy": (-(p * lp).sum(-1)).clamp_min(0.0), "draft_topk": top_probs(d.probs)}
        res = {k: v.cpu().numpy().astype(np.float32) for k, v in cols.items()}
        res["token_id"] = np.asarray(completion, dtype=np.int32)
        res["draft_token"] = d.tokens.cpu().numpy().astype(np.int32)
        res["target_rank"] = token_rank(d_logits, tokens).cpu().numpy().astype(np.int32)
        res["lookup_len"], res["lookup_token"], res["lookup_agree"] = lookup_columns(prompt_ids, completion,
                                                                                     res["draft_token"])
        if sketch is not None:
            hidden = d_out.hidden_states[-1][row, p_len - 1 : p_len - 1 + n].float().cpu().numpy()
            res["hidden_sketch"] = (hidden @ sketch).astype(np.float32)
        out.append(res)
    return out


def check_sketch_dim(dim: int, hidden: int) -> None:
    """``--hidden-sketch D``: 0 (off) up to the draft's hidden size (a projection to more dimensions than the hidden
    state has carries no more information, only more bytes: 4 * D per position)."""
    if not 0 <= dim <= hidden:
        raise SpecgymError(f"--hidden-sketch {dim}: must be 0..{hidden}, the draft's hidden size (a wider sketch "
                           f"adds bytes, not information: {4 * dim:,} bytes per token)")


class Recorder:
    """Generates completions and extracts traces for one pair.

    Args:
        pair: The loaded pair (:func:`specgym.envs.engines.live.model_loading.load_pair`).
        gen_k: Fixed draft cap used to generate completions (exact speculative decoding; only speed depends on it).
        k_max: Engine k_max (>= gen_k).
        hidden_sketch: Dimension D of the hidden sketch column (0 = none).
        sketch_seed: Seed of the sketch's projection.
    """

    def __init__(self, pair: LivePair, gen_k: int = 4, k_max: int = 8, hidden_sketch: int = 0,
                 sketch_seed: int = 0, stop_at_eos: bool = False):
        self.pair = pair
        self.stop_at_eos = stop_at_eos
        self.engine = LiveEngine.from_pair(pair, k_max=max(k_max, gen_k), signals=False)
        self.gen_k = gen_k
        hidden = int(pair.draft.get_output_embeddings().weight.shape[1])
        check_sketch_dim(hidden_sketch, hidden)
        self.sketch = sketch_projection(hidden, hidden_sketch, sketch_seed) if hidden_sketch else None
        self.sketch_seed = sketch_seed
        self.trace_s = 0.0
        self.gen_s = 0.0
        self.positions = 0

    def generate(self, spec: PromptSpec, n: int, temperature: float, seed: int) -> dict[str, Any]:
        """One request's completion (exact speculative decoding at the fixed ``gen_k``), without trace columns."""
        tok = self.pair.tokenizer
        prompt_ids = encode_prompt(tok, spec.text)
        if not prompt_ids:
            raise SpecgymError(f"prompt {spec.request_id!r}: encodes to zero tokens")
        rseed = (seed * 1_000_003 + zlib.crc32(spec.request_id.encode())) & 0x7FFFFFFF
        t0 = time.perf_counter()
        res = self.engine.run_request(prompt_ids, self.gen_k, n, temperature, seed=rseed,
                                      request_id=spec.request_id, category=spec.category,
                                      stop_at_eos=self.stop_at_eos)
        self.gen_s += time.perf_counter() - t0
        return {"request_id": spec.request_id, "category": spec.category, "temperature": float(temperature),
                **({"split": spec.split} if spec.split else {}),
                "prompt_len": len(prompt_ids), "prompt_text": spec.text, "completion": res.tokens,
                "_prompt_ids": prompt_ids, "_seed": rseed + 1}

    def extract(self, pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Add the trace columns to generated requests (one batched teacher-forced forward per model)."""
        t0 = time.perf_counter()
        cols = trace_columns_batch(self.pair.draft, self.pair.target,
                                   [(r["_prompt_ids"], r["completion"], r["temperature"], r["_seed"]) for r in pending],
                                   vocab=self.engine.vocab, sketch=self.sketch)
        self.trace_s += time.perf_counter() - t0
        self.positions += sum(len(r["completion"]) for r in pending)
        return [{**{k: v for k, v in r.items() if not k.startswith("_")}, **c, **self._runs(r)}
                for r, c in zip(pending, cols)]

    def _runs(self, r: dict[str, Any]) -> dict[str, Any]:
        """A request's per-start runs of the whole-proposal drafters, proposals of up to ``K_MAX_LIMIT`` tokens: of
        prompt lookup and, for a pair with one, the draft head (:func:`request_drafter_runs`); with a head also its
        per-start ranks (:func:`head_rank_columns`), the head's runs and ranks from one target forward."""
        head, features, cols = self.pair.head, None, {}
        if head is not None:
            ids = [int(t) for t in r["_prompt_ids"]] + [int(t) for t in r["completion"]]
            features = target_features(self.engine.target, ids)
            cols = head_rank_columns(head, features, ids, len(r["_prompt_ids"]))
        runs = request_drafter_runs(self.engine, head, r["_prompt_ids"], r["completion"], r["temperature"],
                                    r["request_id"], features=features)
        return {**{f"{name}_runs": arr.tolist() for name, arr in runs.items()},
                **{name: arr.tolist() for name, arr in cols.items()}}

    def signal_meta(self) -> dict[str, Any]:
        """The ``signals`` metadata block of the traces this recorder writes."""
        meta: dict[str, Any] = {"topk": TOPK, "lookup_max_n": LOOKUP_MAX_N, "vocab_size": int(self.engine.vocab),
                                "rank": "true rank of the target's token in the draft's raw logits, 0 = top-1, "
                                        "ties by token id"}
        if self.sketch is not None:
            meta["hidden_sketch"] = projection_to_meta(self.sketch, self.sketch_seed)
        if self.pair.head is not None:
            meta[HEAD_RANKS_META] = head_ranks_meta(HEAD_RANKS_DEPTH)
        return meta

    def record(self, spec: PromptSpec, n: int, temperature: float, seed: int) -> dict[str, Any]:
        """One request dict (``workload_from_requests`` format) plus its completion tokens."""
        return self.extract([self.generate(spec, n, temperature, seed)])[0]


class PartialFile:
    """A recording's resume file (``<out>.partial.jsonl``): a header line with the settings, then one line per
    finished request. It only ever holds whole lines (a write the disk refuses is cut back to the last whole line)
    and it is removed when a failure leaves it without a finished request, so a full disk never leaves a 0-byte or
    half-written file behind; the error names the file.

    Args:
        path: The file.
        header: The recording settings (the first line).
        fresh: Start the file (else append to the one a previous run left).
        requests: Finished requests it already holds.
    """

    def __init__(self, path: Path, header: dict[str, Any], fresh: bool, requests: int = 0):
        self.path, self.requests, self.failed = path, requests, False
        self.fd = -1
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh else os.O_APPEND), 0o666)
            self.good = os.lseek(self.fd, 0, os.SEEK_END)
            if fresh:
                self._write((json.dumps({"header": header}) + "\n").encode())
        except OSError as exc:
            raise self._fail(exc) from None

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        os.fsync(self.fd)
        self.good = os.lseek(self.fd, 0, os.SEEK_CUR)

    def append(self, lines: list[str]) -> None:
        """Append finished requests (one JSON line each), durably."""
        if not lines:
            return
        try:
            self._write("".join(line + "\n" for line in lines).encode())
        except OSError as exc:
            raise self._fail(exc) from None
        self.requests += len(lines)

    def _fail(self, exc: OSError) -> SpecgymError:
        """Cut the file back to its last whole line (or remove it when it holds no request); the one-line error."""
        self.failed = True
        try:
            if self.requests == 0:
                self.close()
                self.path.unlink(missing_ok=True)
            elif self.fd >= 0:
                os.ftruncate(self.fd, self.good)
        except OSError:
            pass
        kept = (f"its {self.requests} finished request(s) are kept there: rerun the same command to resume"
                if self.requests else "nothing was kept")
        return SpecgymError(f"{self.path}: cannot write ({exc.strerror or exc}); {kept}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _load_partial(path: Path, header: dict) -> dict[str, dict]:
    """Finished requests of an interrupted recording with the same settings (a truncated last line is ignored)."""
    if not path.exists():
        return {}
    done: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if not lines or not lines[0].strip():
        return {}
    try:
        old = json.loads(lines[0])
    except json.JSONDecodeError:
        raise SpecgymError(f"{path}: unreadable partial recording header; delete the file to start over") from None
    if old.get("header") != header:
        raise SpecgymError(
            f"{path}: an interrupted recording with different settings exists; delete it (or pass --restart)"
        )
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break  # interrupted mid-write
        done[rec["request_id"]] = rec
    return done


def record_workload(pair: LivePair, prompts: Sequence[PromptSpec], out: str | Path, spec: RecordingSpec,
                    overwrite: bool = False, restart: bool = False,
                    progress: Callable[[int, int], None] | None = None) -> tuple[Workload, dict[str, Any]]:
    """Record every prompt, resumably, and write the workload atomically.

    Args:
        pair: The loaded pair.
        prompts: The prompts, in workload order.
        out: A ``.parquet`` file, or a sharded dataset folder.
        spec: What to record.
        overwrite: Replace an existing ``out``.
        restart: Start over instead of resuming from ``<out>.partial.jsonl``.
        progress: ``progress(prompts_done, prompts_total)`` after each prompt (a resumed one included), e.g. to
            advance a progress bar (``specgym record``'s).

    Returns:
        ``(workload, stats)``; stats holds counts, timings, trace positions/s and the greedy loop share.
    """
    out = check_output(out, overwrite, "file", hint="pass --force to overwrite")
    rec = Recorder(pair, gen_k=spec.gen_k, hidden_sketch=spec.hidden_sketch, stop_at_eos=spec.stop_at_eos)
    _check_context(rec, prompts, spec)
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    if restart and partial.exists():
        partial.unlink()
    header = _partial_header(pair, prompts, spec)
    done = _load_partial(partial, header)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecgymError(f"{out.parent}: cannot create ({exc.strerror or exc})") from None
    part = PartialFile(partial, header, fresh=not partial.exists() or not done, requests=len(done))
    t0 = time.perf_counter()
    resumed = sum(1 for p in prompts if p.request_id in done)
    try:
        _record_missing(rec, prompts, spec, done, part, progress)
    finally:
        part.close()
    wall = time.perf_counter() - t0
    wl, summary = _assemble(rec, prompts, spec, done, out)
    stats = {
        "requests": len(prompts),
        "resumed": resumed,
        "wall_s": wall,
        "generate_s": rec.gen_s,
        "trace_s": rec.trace_s,
        "trace_positions": rec.positions,
        "trace_positions_per_s": rec.positions / rec.trace_s if rec.trace_s > 0 else float("nan"),
        "end_to_end_positions_per_s": rec.positions / wall if wall > 0 and rec.positions else float("nan"),
        **summary,
    }
    try:
        save_recording(wl, out, overwrite)
    except SpecgymError as exc:  # a full disk: the output is absent, the finished requests are kept
        raise SpecgymError(f"{exc}; the {len(done)} finished requests are kept in {partial}: rerun the same command "
                           f"to resume") from None
    partial.unlink()
    return wl, stats


def _check_context(rec: Recorder, prompts: Sequence[PromptSpec], spec: RecordingSpec) -> None:
    """Refuse, before anything is generated, a prompt whose tokens and longest completion exceed the models'
    context."""
    hi = spec.lengths[1]
    for prompt in prompts:
        n = prompt.max_new_tokens or hi
        plen = len(encode_prompt(rec.pair.tokenizer, prompt.text))
        if plen + n > rec.engine.context:
            raise SpecgymError(
                f"prompt {prompt.request_id!r}: {plen} prompt tokens + {n} new tokens exceed the models' context of "
                f"{rec.engine.context}"
            )


def _partial_header(pair: LivePair, prompts: Sequence[PromptSpec], spec: RecordingSpec) -> dict[str, Any]:
    """The settings a resume file's header records: a resumed recording must have the same."""
    return {"draft": pair.draft_name, "target": pair.target_name, "temperature": spec.temperature,
            "max_new_tokens": spec.length_text, "seed": spec.seed, "gen_k": spec.gen_k,
            "prompts": sha256_file(spec.prompts_path)[:16] if spec.prompts_path else len(prompts),
            "format": 2, "hidden_sketch": spec.hidden_sketch, **({"stop_at_eos": True} if spec.stop_at_eos else {}),
            **({HEAD_RANKS_META: HEAD_RANKS_DEPTH} if pair.head is not None else {})}


def _record_missing(rec: Recorder, prompts: Sequence[PromptSpec], spec: RecordingSpec, done: dict[str, dict],
                    part: PartialFile, progress: Callable[[int, int], None] | None) -> None:
    """Generate every prompt not in ``done`` and extract its trace ``spec.batch`` requests at a time, each batch
    appended to the resume file as it finishes; on any exit (Ctrl-C included) the completions generated so far are
    kept for the resume."""
    lo, hi = spec.lengths
    pending: list[dict[str, Any]] = []
    try:
        for idx, prompt in enumerate(prompts):
            if prompt.request_id not in done:
                temp = spec.temperature if prompt.temperature is None else prompt.temperature
                n = prompt.max_new_tokens or request_length(prompt.request_id, lo, hi, spec.seed)
                pending.append(rec.generate(prompt, n, temp, spec.seed))
                if len(pending) >= spec.batch:
                    _flush(rec, pending, part, done)
            if progress is not None:
                progress(idx + 1, len(prompts))
        if pending:
            _flush(rec, pending, part, done)
    except BaseException:
        if pending and not part.failed:
            try:
                _flush(rec, pending, part, done)
            except SpecgymError:
                pass  # the first error is the one to report
        raise


def _flush(rec: Recorder, pending: list[dict[str, Any]], part: PartialFile, done: dict[str, dict]) -> None:
    """Extract the pending requests' traces, append them to the resume file, and count them done."""
    lines = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()} for r in rec.extract(pending)]
    pending.clear()
    part.append([json.dumps(line) for line in lines])
    for line in lines:
        done[line["request_id"]] = line


def _assemble(rec: Recorder, prompts: Sequence[PromptSpec], spec: RecordingSpec, done: dict[str, dict],
              out: Path) -> tuple[Workload, dict[str, Any]]:
    """The workload of the finished requests, in prompt order, with its source metadata
    (:func:`assemble_recording`)."""
    pair, prompts_path = rec.pair, spec.prompts_path
    requests = []
    completions = []
    for prompt in prompts:
        d = dict(done[prompt.request_id])
        completions.append(d.pop("completion"))
        requests.append(d)
    source = {"kind": "recorded", "draft_model": portable_name(pair.draft_name),
              "target_model": portable_name(pair.target_name),
              "draft_signature": model_signature(pair.draft.config),
              "target_signature": model_signature(pair.target.config),
              "temperature": spec.temperature,
              "max_new_tokens": spec.length_text, "seed": spec.seed, "generator": f"live engine, fixed K={spec.gen_k}",
              "device": pair.device, "dtype": pair.dtypes,
              **({"splits": "the prompts file's"} if spec.split_fractions is None and splits_named(list(prompts))
                 else {"split_fractions": list(spec.split_fractions or DEFAULT_SPLITS)}),
              **({"stop_at_eos": True} if spec.stop_at_eos else {}),
              "prompts": portable_name(prompts_path) if prompts_path else None}
    extra = {**draft_fit_split(pair.draft_name, portable_name(prompts_path) if prompts_path else None),
             **(spec.extra or {})}
    return assemble_recording(spec.name or out.stem, source, spec.profile, requests, completions, spec.seed,
                              spec.split_fractions, extra, rec.signal_meta())


def request_drafter_runs(engine: LiveEngine, head: Any, prompt_ids: Sequence[int], completion: Sequence[int],
                         temperature: float, request_id: str, features: Any = None) -> dict[str, np.ndarray]:
    """One request's per-start runs of prompt lookup and, given a ``head``, the draft head, proposals of up to
    ``K_MAX_LIMIT`` tokens: greedy, the leading matches with the completion
    (:func:`~specgym.envs.core.ngram_proposer.ngram_runs`, :func:`~specgym.envs.engines.live.draft_head.head_runs`
    over the target's teacher-forced ``features`` of ``prompt + completion``, computed here when not given);
    sampled, one seeded draw of exact speculative sampling per start
    (:func:`~specgym.envs.engines.live.sampled_runs.request_sampled_runs`), which needs the target's lean forward (none
    without it: such a recording offers the draft model only)."""
    if temperature == 0:
        out: dict[str, np.ndarray] = {NGRAM_DRAFTER: ngram_runs(prompt_ids, completion, K_MAX_LIMIT, *engine.ngram_n)}
        if head is not None:
            ids = [int(t) for t in prompt_ids] + [int(t) for t in completion]
            feats = target_features(engine.target, ids) if features is None else features
            out[HEAD_DRAFTER] = head_runs(head, feats, ids, len(prompt_ids), K_MAX_LIMIT)
        return out
    runner = engine.runner_of(engine.target)
    if runner is None:
        return {}
    return request_sampled_runs(runner, prompt_ids, completion, temperature, request_id, K_MAX_LIMIT, engine.vocab,
                                engine.ngram_n, head)


def head_rank_columns(head: Any, features: Any, ids: Sequence[int], prompt_len: int,
                      depth: int = HEAD_RANKS_DEPTH) -> dict[str, np.ndarray]:
    """One request's ``ranks_head`` ``(n, depth)`` int8 and ``topk_head`` ``(n, depth * 8)`` uint16: the draft
    head's per-start ranks and top-8 probabilities along the completion
    (:func:`~specgym.envs.engines.live.head_tree.head_rank_table`, the live head tree's steps), ranks capped at
    :data:`~specgym.envs.workloads.workload.HEAD_RANK_CAP` (where the head cannot propose the token and past the
    completion too), probabilities times :data:`~specgym.envs.workloads.workload.HEAD_TOPK_SCALE`.

    Args:
        head: The pair's draft head.
        features: The target's teacher-forced last hidden states over ``ids``.
        ids: Prompt then completion token ids.
        prompt_len: Prompt length (at least 2).
        depth: Columns ``J``.
    """
    ranks, probs = head_rank_table(head, features, list(ids), prompt_len, depth, topk=TOPK)
    capped = np.where(ranks == NO_RANK, HEAD_RANK_CAP, np.minimum(ranks, HEAD_RANK_CAP)).astype(np.int8)
    scaled = np.rint(np.clip(probs, 0.0, 1.0) * HEAD_TOPK_SCALE).astype(np.uint16)
    return {"ranks_head": capped, "topk_head": scaled.reshape(len(ranks), depth * TOPK)}


def drafter_entries(names: Sequence[str], temperatures: np.ndarray) -> list[dict[str, Any]]:
    """The ``drafters`` metadata of a recording whose requests (at ``temperatures``) carry the per-start runs of
    ``names`` beside the draft model's per-position trace: each drafter's proposer and how its runs were made."""
    greedy, sampled = bool(np.any(temperatures == 0)), bool(np.any(temperatures > 0))
    source = "; ".join(
        ([f"greedy requests: {GREEDY_RUNS_SOURCE}"] if greedy and sampled else [GREEDY_RUNS_SOURCE] if greedy else [])
        + ([f"sampled requests: {SAMPLED_RUNS_SOURCE}"] if greedy and sampled else
           [SAMPLED_RUNS_SOURCE] if sampled else []))
    lo, hi = LiveEngine.ngram_n
    proposer: dict[str, tuple[str, str]] = {
        NGRAM_DRAFTER: ("lookup", f"vLLM ngram semantics, prompt_lookup_min {lo}, prompt_lookup_max {hi}"),
        HEAD_DRAFTER: ("model", "the pair's draft head (specgym.envs.engines.live.draft_head), greedy or sampled at "
                                "the request's temperature")}
    return [drafter_entry(IMPLICIT_DRAFTER, "model", "per-position")] + [
        drafter_entry(n, proposer[n][0], "per-start", proposer=proposer[n][1], source=source) for n in names]


def with_drafter_runs(wl: Workload, pair: LivePair, engine: LiveEngine | None = None) -> Workload:
    """A recorded workload with the per-start runs of the whole-proposal drafters the pair serves added (prompt
    lookup; the draft head for a pair with one), recomputed per request from its prompt text and token ids as the
    recorder stores them (:func:`request_drafter_runs`); a workload that holds them all is returned as is."""
    names = [NGRAM_DRAFTER] + ([HEAD_DRAFTER] if pair.head is not None else [])
    if all(n in wl.drafter_names for n in names):
        return wl
    if wl.token_id is None or not wl.prompt_text:
        raise SpecgymError(f"workload {wl.name!r}: the {' and '.join(names)} drafters' runs need a recording with "
                           f"prompt texts and token ids")
    engine = engine or LiveEngine.from_pair(pair, signals=False)
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for r in range(wl.n_requests):
        runs = request_drafter_runs(engine, pair.head, encode_prompt(pair.tokenizer, wl.prompt_text[r]),
                                    wl.token_id[wl.span(r)].tolist(), float(wl.temperature[r]),
                                    str(wl.request_id[r]))
        missing = [n for n in names if n not in runs]
        if missing:
            raise SpecgymError(f"workload {wl.name!r}: the {' and '.join(missing)} drafters' runs of sampled "
                               f"requests need the target's lean forward (Llama-family or GPT-2)")
        for n in names:
            parts[n].append(runs[n])
    cols = {**wl.flat_columns(), **{f"runs_{n}": np.concatenate(parts[n]) for n in names}}
    return wl.with_columns(cols, drafters=drafter_entries(names, wl.temperature))


def with_head_ranks(wl: Workload, pair: LivePair, depth: int = HEAD_RANKS_DEPTH) -> Workload:
    """A recorded workload with the draft head's per-start ranks added (``ranks_head``, ``topk_head`` and the
    ``signals.head_ranks`` block: :func:`head_rank_columns`), recomputed per request from its prompt text and token
    ids as the recorder stores them, one teacher-forced target forward each; a workload that holds them is returned
    as is. How an older recording of a pair with a head gains what the tree replay of head trees reads."""
    if wl.ranks_head is not None:
        return wl
    if pair.head is None:
        raise SpecgymError(f"workload {wl.name!r}: the pair has no draft head, so there are no head ranks to add")
    if wl.token_id is None or not wl.prompt_text:
        raise SpecgymError(f"workload {wl.name!r}: the draft head's ranks need a recording with prompt texts and "
                           f"token ids")
    parts: dict[str, list[np.ndarray]] = {"ranks_head": [], "topk_head": []}
    for r in range(wl.n_requests):
        prompt = encode_prompt(pair.tokenizer, wl.prompt_text[r])
        ids = prompt + wl.token_id[wl.span(r)].tolist()
        cols = head_rank_columns(pair.head, target_features(pair.target, ids), ids, len(prompt), depth)
        for name in parts:
            parts[name].append(cols[name])
    flat = {**wl.flat_columns(), **{name: np.concatenate(arrs) for name, arrs in parts.items()}}
    return wl.with_columns(flat, signal_meta={**wl.signal_meta, HEAD_RANKS_META: head_ranks_meta(depth)})


def draft_fit_split(draft: str, prompts: str | None) -> dict[str, str]:
    """``{"fit_split": "val", "fit_split_reason": ...}`` when the draft model was trained on the train split of the
    prompts being recorded (its ``training_state.json``, written by ``specgym train-draft``), else nothing: there its
    acceptance on the train prompts is its training set's, so learners fit on val
    (:attr:`~specgym.envs.workloads.workload.Workload.fit_split`)."""
    state = Path(draft) / "training_state.json"
    if prompts is None or not state.is_file():
        return {}
    try:
        trained = json.loads(state.read_text()).get("trained_on") or {}
    except (OSError, ValueError) as e:
        raise SpecgymError(f"{state}: unreadable ({e})") from None
    if trained.get("prompts") != prompts or trained.get("split") != "train":
        return {}
    return {"fit_split": "val", "fit_split_reason": f"the draft model was trained on the train split of {prompts} "
                                                    f"({state.parent.name}/training_state.json): learners fit on val"}


def assemble_recording(name: str, source: dict[str, Any], profile: CostProfile, requests: list[dict[str, Any]],
                       completions: list[Any], seed: int, split_fractions: tuple[float, float, float] | None,
                       extra: dict[str, Any] | None, signal_meta: dict[str, Any]) -> tuple[Workload, dict[str, Any]]:
    """The workload of a finished recording (requests in prompt order; splits drawn from ``seed`` over all of them)
    and its summary figures; shared by the single-process and the distributed recorder, so that both write the same
    workload from the same requests.

    Splits: ``split_fractions`` given (``--splits``) are honoured exactly
    (:func:`~specgym.envs.workloads.trace_format.split_counts`; a fraction of 0 is an empty split); ``None`` keeps
    the prompts file's splits when every request carries one (``split`` in the prompts file), else is
    :data:`DEFAULT_SPLITS` with at least one val and one test request from 3 requests on."""
    if split_fractions is not None:
        splits = assign_splits(len(requests), seed, split_fractions, exact=True)
        requests = [{**r, "split": str(s)} for r, s in zip(requests, splits)]
    summary = {
        "positions": int(sum(len(c) for c in completions)),
        **loop_summary(completions, [r["category"] for r in requests]),
        "mean_p_accept": float(np.mean(np.concatenate([np.asarray(r["p_accept"]) for r in requests]))),
        "lookup_agree_share": float(np.mean(np.concatenate([np.asarray(r["lookup_agree"]) for r in requests]))),
    }
    drafters = None
    run_keys = tuple(f"{n}_runs" for n in (NGRAM_DRAFTER, HEAD_DRAFTER))
    names = [n for n in (NGRAM_DRAFTER, HEAD_DRAFTER) if requests and all(r.get(f"{n}_runs") is not None
                                                                            for r in requests)]
    if names:  # more drafters' runs (greedy; sampled where the target has the lean forward)
        drafters = drafter_entries(names, np.asarray([r["temperature"] for r in requests]))
    requests = [{**{k: v for k, v in r.items() if k not in run_keys},
                 **({"runs": {n: np.asarray(r[f"{n}_runs"], dtype=np.int16) for n in names}} if names else {})}
                for r in requests]
    wl = workload_from_requests(name, source, profile, requests, split_seed=seed,
                                split_fractions=split_fractions or DEFAULT_SPLITS,
                                extra={"loop_share": summary["loop_share"],
                                       "loop_share_by_category": summary["loop_share_by_category"], **(extra or {})},
                                signal_meta=signal_meta, drafters=drafters)
    if "fit_split" not in wl.extra and not (wl.split == "train").any() and (wl.split == "val").any():
        # an evaluation set (val and test prompts only, `specgym data eval-prompts`): learners fit on val
        wl = dataclasses.replace(wl, extra={**wl.extra, "fit_split": "val", "fit_split_reason": (
            "the prompts file holds no train prompts (an evaluation set): learners fit on val")})
    return wl, summary


def save_recording(wl: Workload, out: Path, overwrite: bool, shard_requests: int | None = None) -> None:
    """Write a recorded workload: one ``.parquet`` file, or (``out`` without that suffix) a sharded dataset folder
    (:mod:`specgym.envs.workloads.dataset`) of ``shard_requests``-request shards."""
    if out.suffix == ".parquet":
        save_workload(wl, out, overwrite=overwrite)
        return
    write_dataset(chunks(wl, shard_requests or DEFAULT_SHARD_REQUESTS), out, overwrite=overwrite)
