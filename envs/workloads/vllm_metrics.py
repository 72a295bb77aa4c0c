"""Importer of vLLM's per-request speculative-decoding metrics: a workload from the user's own engine, model,
drafter and GPU (an import of engine metrics, replayed; never a specgym live run).

**Where the file comes from.** vLLM reports per-request acceptance metrics when the server (or ``LLM``) runs with
``--per-request-spec-decode-metrics detailed`` (``ObservabilityConfig.per_request_spec_decode_metrics``, values
``none|summary|detailed``; documented in vllm-project/vllm ``docs/features/speculative_decoding/
acceptance_metrics.md``, stored commit ``cd199986df1171c3255ce2e07e2c63be4385ef9f``; the end-to-end test
``_validate_detailed_metrics`` checks the same identities as :func:`read_records`). Every single-sequence
(``n == 1``) response then carries ``metrics.speculative_decoding``::

    {"id": "cmpl-...", "choices": [...], "usage": {"prompt_tokens": 57, "completion_tokens": 24, ...},
     "metrics": {"speculative_decoding": {
         "mean_acceptance_length": 1.23, "draft_acceptance_rate": 0.08, "acceptance_histogram": [39, 1, 0, 3],
         "num_spec_steps": 43, "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3,
         "per_step_accepted": [0, 3, ...], "per_step_drafted": [3, 3, ...]}}}

(``summary`` lacks the two ``per_step_*`` arrays; they are what this importer needs.) The input is JSON Lines, one
such response object per line, exactly as the server returns it (non-streaming; streaming: the final usage chunk,
which carries ``metrics``), or a folder of such ``.jsonl`` files (one workload; each file's stem is the category of
its requests).

**What a step says.** Step ``s`` of a request drafted ``d_s`` tokens (``per_step_drafted``; drafts invalidated by
structured output already subtracted) and the target accepted the first ``a_s`` of them (``per_step_accepted``,
``0 <= a_s <= d_s <= num_spec_tokens``); the step produced ``a_s + 1`` tokens (the bonus or correction token).

**The imported completion** is the recorded steps in order: ``N = sum_s (a_s + 1)`` positions, step ``s`` starting
at ``g_s = sum_{t<s} (a_t + 1)``. Tokens the steps do not account for are not in it: the prefill's first token
(counted in ``prompt_len = usage.prompt_tokens + 1``, as for every specgym workload) and any plain decode step
that drafted nothing (vLLM records only verification steps; where they fell is unknown). The summary line counts
them (``usage.completion_tokens - 1 - N`` where positive), and apart from them the tokens a stop string, EOS or
``max_tokens`` cut from a last step (where negative: the last step keeps at least one of its ``a_s + 1`` tokens, so a
line whose ``usage.completion_tokens`` falls further below ``1 + N`` is refused: its usage and steps disagree).

**Run semantics (censored).** Each position ``i`` of the completion gets a match flag ``m_i``:

* ``m_i = 1`` for the ``a_s`` accepted positions ``g_s .. g_s + a_s - 1``;
* ``m_i = 0`` at ``g_s + a_s`` when ``a_s < d_s``: the draft's token there was rejected (the target's correction
  token took the position);
* ``m_i = ?`` (censored) at ``g_s + a_s`` when ``a_s == d_s``: everything drafted was accepted and the position
  holds the bonus token; the drafter never proposed for it, so whether it would have matched is unknown. A step
  that drafted nothing (``d_s = 0``) is censored at its one position.

A round's run is known only up to what was drafted: at a recorded step start ``runs[g_s] = a_s`` exactly when
``a_s < d_s`` and ``runs[g_s] >= d_s`` (censored) when ``a_s == d_s``. To replay other draft lengths, whose rounds
start elsewhere, the importer assumes **the per-position model**: the drafter's agreement with the target at a
position does not depend on where the round started (exact for a draft model proposing greedily from the correct
prefix; an approximation for EAGLE-style heads and n-gram lookups, which condition on the round's start: see
SpecDecode-Bench's per-start runs in :mod:`~specgym.envs.workloads.specdecode`). The stored per-start runs
(format v3, ``runs_<drafter>``) are then the **known** runs: ``runs[i]`` = consecutive ``1`` flags from ``i``,
stopping at a ``0`` or a ``?`` (a censored position is never counted as accepted). Replay with them is exact for
the recorded schedule (a round at ``g_s`` with cap ``d_s`` accepts ``a_s``) and, under the model, the least any
other schedule could accept: a longer draft at a censored start gets no credit for what was never drafted.

**What the trace lacks**, absent and never zeros: ``p_accept`` (runs are per start), draft confidence and entropy,
target entropy, token ids and every signal column. Controllers that read them are left out of ``eval
--controllers all`` with a printed note (:mod:`specgym.agents.traits`).

**Censored-data oracle bound** (:func:`optimistic_runs`, :mod:`specgym.eval.censored`): the clairvoyant oracle on
runs where every censored position counts as accepted (runs continue through ``?`` to the next ``0``). Under the
per-position model the true runs lie between the known and the optimistic ones at every position and the oracle's
time falls as runs grow, so its time is a lower bound on the time of every chain controller (any K per round, any
token-level stop, clairvoyant or not) on these completions under the workload's cost profile; the oracle row on the
known runs bounds the true oracle from the other side. The steps themselves are kept in the metadata
(``extra.vllm_metrics.steps``: per request ``[per_step_accepted, per_step_drafted]``) so the bound, and anything
else, can be recomputed from the raw data.

**Cost profile.** The metrics carry no timing: the workload is priced with ``--profile`` (default the published
``h100-llama31-8b``, a Llama-3.1-8B cost model: measure your own GPU with ``specgym profile --engine vllm``).
Splits: seed 0, 0.7 / 0.1 / 0.2 by request. Every defect is a one-line error naming the file, the line and the
field; nothing is written until every input parsed. Every size is bounded before anything is allocated from it:
``num_spec_tokens`` by :data:`MAX_SPEC_TOKENS`, token counts by the int32 range the workload stores them in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.build import workload_from_requests
from specgym.envs.workloads.specdecode import check_name, json_lines, request_id
from specgym.envs.workloads.specdecode import input_files as jsonl_files
from specgym.envs.workloads.workload import RUNS_DTYPE, Workload, drafter_entry
from specgym.errors import SpecgymError
from specgym.io import sha256_file

#: vLLM ``speculative_config`` methods whose proposer is a lookup (no draft model forward); others are models.
LOOKUP_METHODS = ("ngram", "suffix")
#: The shipped cost profile an import is priced with unless ``--profile`` says otherwise.
PROFILE = "h100-llama31-8b"
SPLIT_SEED = 0
SPLIT_FRACTIONS = (0.7, 0.1, 0.2)
#: The response field holding the metrics, as a path (for messages).
FIELD = "metrics.speculative_decoding"
_RUN_MAX = int(np.iinfo(RUNS_DTYPE).max)
#: The largest ``num_spec_tokens`` read: vLLM's proposers are run at a few tokens a step (suffix decoding, the
#: longest, defaults to 24 and vLLM's examples run it at 32), and specgym replays K up to 16. The bound keeps an absurd
#: value from sizing the histogram check and the per-position arrays (a step accepting ``k`` is ``k + 1`` positions).
MAX_SPEC_TOKENS = 128
#: The largest token count read (``usage.*_tokens``, a request's context): the workload stores them as int32.
MAX_TOKENS = int(np.iinfo(np.int32).max)
#: A ``--drafters`` / ``--method`` value: one word, as a drafter name in ``fixed:3@NAME`` and ``runs_NAME``.
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: What ``--drafters`` and ``--method`` expect (for the messages).
_DRAFTER_WORD = ("one drafter name for vllm-metrics (the name its runs get in the workload, e.g. eagle3; a "
                "comma-separated list of drafters is for specdecode-bench)")
_METHOD_WORD = "vLLM's speculative_config method (eagle, eagle3, draft_model, mtp, ngram, suffix...)"
#: How close ``mean_acceptance_length`` / ``draft_acceptance_rate`` must be to what the arrays give (float noise).
_REL_TOL = 1e-6


@dataclass
class VllmRequest:
    """One response line, checked.

    Attributes:
        id: The response's ``id`` (or ``<file>:<line>`` when it has none).
        category: The file's stem.
        prompt_tokens: ``usage.prompt_tokens``.
        completion_tokens: ``usage.completion_tokens`` (None if the line has no ``usage.completion_tokens``).
        accepted, drafted: ``per_step_accepted`` / ``per_step_drafted``.
        num_spec_tokens: The configured ``num_speculative_tokens``.
        line: The line it was read from.
    """

    id: str
    category: str
    prompt_tokens: int
    completion_tokens: int | None
    accepted: list[int]
    drafted: list[int]
    num_spec_tokens: int
    line: int = 0


@dataclass
class ImportedMetrics:
    """An imported set of files: the workload and what the import had to do."""

    workload: Workload
    sources: list[Path]
    skipped: int
    unrecorded_tokens: int
    censored: int
    rounds: int
    cut_tokens: int = 0
    left_out: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: requests, rounds, censored rounds, what was left out (requests, tokens, folder entries)."""
        wl = self.workload
        line = (f"{', '.join(map(str, self.sources))}: {wl.n_requests} requests, {self.rounds:,} verification steps, "
                f"{wl.n_positions:,} positions; {self.censored:,} steps accepted all they drafted (censored runs)")
        if self.skipped:
            line += f"; {self.skipped} requests with no verification step skipped"
        if self.unrecorded_tokens:
            line += (f"; {self.unrecorded_tokens:,} completion tokens outside the recorded steps (plain decode steps "
                     f"that drafted nothing; not in the workload)")
        if self.cut_tokens:
            line += (f"; {self.cut_tokens:,} tokens of last steps cut from the completion by a stop string, EOS or "
                     f"max_tokens (kept in the workload as the steps recorded them)")
        if self.left_out:
            names = ", ".join(self.left_out[:5]) + (f" and {len(self.left_out) - 5} more" if len(self.left_out) > 5
                                                    else "")
            line += f"; {len(self.left_out)} folder entries not imported (only *.jsonl files are read): {names}"
        return line


def _fail(path: Path, line: int, what: str) -> SpecgymError:
    return SpecgymError(f"{path}, line {line}: {what}")


def _count(obj: Any, path: Path, line: int, name: str, lo: int = 0, hi: int = MAX_TOKENS, why: str = "") -> int:
    """An integer field in ``[lo, hi]`` (a JSON ``true`` is not 1), or a one-line error naming file, line, field."""
    if isinstance(obj, bool) or not isinstance(obj, int) or not lo <= obj <= hi:
        why = " (true and false are not counts)" if isinstance(obj, bool) else why
        raise _fail(path, line, f"field {name!r} = {obj!r}: expected an integer in [{lo}, {hi:,}]{why}")
    return obj


def _rate(sd: dict[str, Any], path: Path, line: int, key: str, want: float | None, lo: float, hi: float,
          formula: str) -> None:
    """A summary float of vLLM (``mean_acceptance_length``, ``draft_acceptance_rate``) against the arrays.

    Args:
        sd: The ``speculative_decoding`` object.
        path, line: Where it was read (for the message).
        key: The field.
        want: Its value by vLLM's definition (``formula``); None where undefined (no step, nothing drafted): then
            any value in ``[lo, hi]`` (or null) is taken.
        lo, hi: The range the field is defined on.
        formula: The definition, for the message.
    """
    if key not in sd or (sd[key] is None and want is None):
        return
    v = sd[key]
    name = f"{FIELD}.{key}"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        given = "" if want is None else f"; the per-step arrays give {want:.6g}"
        raise _fail(path, line, f"field {name} = {v!r}: expected a number in [{lo:g}, {hi:g}] ({formula}{given})")
    if want is not None and not math.isclose(v, want, rel_tol=_REL_TOL, abs_tol=1e-9):
        raise _fail(path, line, f"field {name} = {v!r} disagrees with the per-step arrays ({formula} = {want:.6g})")


def check_word(value: str, option: str, what: str) -> str:
    """A ``--drafters`` / ``--method`` value: one word of letters, digits, ``.``, ``_`` and ``-``.

    Args:
        value: The value given.
        option: The option, for the message.
        what: What the option expects, for the message.
    """
    if not isinstance(value, str) or not _WORD.fullmatch(value):
        raise SpecgymError(f"{option} {value!r}: expected {what}, one word of letters, digits, '.', '_' or '-' "
                           f"(at most 64, starting with a letter or digit)")
    return value


def check_temperature(temperature: float) -> float:
    """The ``--temperature`` the requests ran at: a finite number >= 0."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise SpecgymError(f"--temperature must be >= 0 and finite (the sampling temperature the requests ran at), "
                           f"got {temperature!r}")
    return float(temperature)


def _steps(obj: Any, path: Path, line: int, name: str, hi: int) -> list[int]:
    if not isinstance(obj, list):
        if obj is None:
            raise _fail(path, line, f"field {name!r} is missing: record with --per-request-spec-decode-metrics "
                                    f"detailed (summary has no per-step arrays)")
        raise _fail(path, line, f"field {name!r} must be a list of integers, got {type(obj).__name__}")
    for k, v in enumerate(obj):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise _fail(path, line, f"field {name}[{k}] = {v!r}: expected an integer in [0, {hi}] "
                                    f"(num_spec_tokens = {hi})")
    return obj


def parse_line(d: Any, path: Path, line: int) -> VllmRequest:
    """One response object, checked; a one-line error naming file, line and field otherwise.

    Every identity vLLM's own end-to-end test (``_validate_detailed_metrics``) checks is checked where the field is
    present: the lengths of the per-step arrays and ``num_spec_steps``; ``num_accepted_draft_tokens`` and
    ``num_draft_tokens`` against their sums; ``acceptance_histogram`` (so its sum and weighted sum too);
    ``mean_acceptance_length = 1 + accepted / steps`` and ``draft_acceptance_rate = accepted / drafted``. Besides:
    ``0 <= a_s <= d_s <= num_spec_tokens <= MAX_SPEC_TOKENS``, integers that are not booleans, one choice (vLLM
    reports the metrics only for ``n == 1``), token counts in the int32 range, and ``usage.completion_tokens`` no
    further below the steps' tokens than a cut of the last step explains.
    """
    if not isinstance(d, dict):
        raise _fail(path, line, f"expected a JSON object (one response per line), got {type(d).__name__}")
    metrics = d.get("metrics")
    if not isinstance(metrics, dict) or FIELD.split(".")[1] not in metrics:
        raise _fail(path, line, f"field {FIELD!r} is missing: start vLLM with --per-request-spec-decode-metrics "
                                f"detailed and speculative decoding")
    sd = metrics["speculative_decoding"]
    if not isinstance(sd, dict):
        raise _fail(path, line, f"field {FIELD!r} is {json.dumps(sd)} (vLLM reports it only for n == 1 requests "
                                f"with speculative decoding on)")
    choices = d.get("choices")
    if isinstance(choices, list) and len(choices) > 1:
        raise _fail(path, line, f"field 'choices' has {len(choices)} entries, yet {FIELD!r} is set: vLLM reports it "
                                f"only for n == 1 requests, so these metrics are not of one sequence (send n = 1)")
    k = _count(sd.get("num_spec_tokens"), path, line, f"{FIELD}.num_spec_tokens", 1, MAX_SPEC_TOKENS,
               " (vLLM's num_speculative_tokens; its proposers draft a few tokens a step)")
    acc = _steps(sd.get("per_step_accepted"), path, line, f"{FIELD}.per_step_accepted", k)
    dft = _steps(sd.get("per_step_drafted"), path, line, f"{FIELD}.per_step_drafted", k)
    if len(acc) != len(dft):
        raise _fail(path, line, f"fields {FIELD}.per_step_accepted and per_step_drafted differ in length "
                                f"({len(acc)} != {len(dft)})")
    bad = next((s for s, (a, n) in enumerate(zip(acc, dft)) if a > n), None)
    if bad is not None:
        raise _fail(path, line, f"field {FIELD}.per_step_accepted[{bad}] = {acc[bad]} exceeds per_step_drafted"
                                f"[{bad}] = {dft[bad]}")
    steps, n_acc, n_dft = len(acc), sum(acc), sum(dft)
    for name, want in (("num_spec_steps", steps), ("num_accepted_draft_tokens", n_acc),
                       ("num_draft_tokens", n_dft)):
        if name in sd and _count(sd[name], path, line, f"{FIELD}.{name}") != want:
            raise _fail(path, line, f"field {FIELD}.{name} = {sd[name]!r} disagrees with the per-step arrays "
                                    f"({want})")
    hist = sd.get("acceptance_histogram")
    if hist is not None:
        counts = [0] * (k + 1)
        for a in acc:
            counts[a] += 1
        if hist != counts or any(isinstance(v, bool) for v in hist):
            raise _fail(path, line, f"field {FIELD}.acceptance_histogram = {hist!r} disagrees with per_step_accepted "
                                    f"({counts})")
    _rate(sd, path, line, "mean_acceptance_length", 1 + n_acc / steps if steps else None, 0, k + 1,
          "1 + num_accepted_draft_tokens / num_spec_steps")
    _rate(sd, path, line, "draft_acceptance_rate", n_acc / n_dft if n_dft else None, 0, 1,
          "num_accepted_draft_tokens / num_draft_tokens")
    usage = d.get("usage")
    if not isinstance(usage, dict):
        raise _fail(path, line, "field 'usage' is missing (the response's token counts: usage.prompt_tokens)")
    made = n_acc + steps  # the tokens the steps produced: the imported completion's positions
    prompt = _count(usage.get("prompt_tokens"), path, line, "usage.prompt_tokens", 1, MAX_TOKENS - 1 - made,
                    f": the prompt, the prefill's token and the steps' {made:,} tokens must fit the int32 range")
    completion = usage.get("completion_tokens")
    if completion is not None:
        completion = _count(completion, path, line, "usage.completion_tokens")
        if steps and made - (completion - 1) > acc[-1] + 1:
            raise _fail(path, line, f"field 'usage.completion_tokens' = {completion} is below the 1 + {made:,} "
                                    f"tokens of the prefill and the recorded steps by more than a cut explains (a "
                                    f"stop string, EOS or max_tokens removes at most the last step's tokens, "
                                    f"{acc[-1] + 1} here): usage and metrics are not of one response")
    rid = request_id(d.get("id", f"{path.name}:{line}"), path, line)
    return VllmRequest(rid, category_of(path), prompt, completion, acc, dft, k, line)


def category_of(path: Path) -> str:
    """The category of a file's requests: its stem, lower case."""
    return path.stem.lower()


def read_records(path: Path) -> list[VllmRequest]:
    """Every response of one JSON Lines file (blank lines skipped); a one-line error naming file, line, field."""
    out = [parse_line(d, path, line) for line, d in json_lines(path)]
    if not out:
        raise SpecgymError(f"{path}: no responses (an empty file)")
    return out


def match_flags(accepted: Sequence[int], drafted: Sequence[int]) -> np.ndarray:
    """``m_i`` of the completion the steps make (module docstring): 1 accepted, 0 rejected, -1 censored."""
    acc = np.asarray(accepted, dtype=np.int64)
    dft = np.asarray(drafted, dtype=np.int64)
    flags = np.ones(int((acc + 1).sum()), dtype=np.int8)
    ends = np.cumsum(acc + 1) - 1  # the bonus/correction position of each step
    flags[ends] = np.where(acc < dft, 0, -1)
    return flags


def _runs_through(flags: np.ndarray, counted: tuple[int, ...]) -> np.ndarray:
    """Per position: how many consecutive flags from it are in ``counted`` (the distance to the next flag that is
    not, or to the end)."""
    n = len(flags)
    at = np.arange(n, dtype=np.int64)
    stops = np.where(np.isin(flags, counted), n, at)  # a flag not counted stops the runs before it
    return np.minimum.accumulate(stops[::-1])[::-1] - at


def known_runs(flags: np.ndarray) -> np.ndarray:
    """The stored runs: consecutive accepted positions, stopping at a rejection or a censored position."""
    return _runs_through(flags, (1,))


def optimistic_runs(flags: np.ndarray) -> np.ndarray:
    """The censored bound's runs: consecutive positions that are accepted or censored (stop at a rejection)."""
    return _runs_through(flags, (1, -1))


def input_files(src: str | Path) -> list[Path]:
    """The ``.jsonl`` files of ``src`` (a file, or every ``.jsonl`` file of a folder, sorted)."""
    return jsonl_files(src, "vLLM responses, one per line")


def left_out_entries(src: Path, files: Sequence[Path]) -> list[str]:
    """The entries of a source folder that are not imported (not ``*.jsonl``: ``b.json``, ``A.JSONL``...), sorted,
    for the summary; empty for a file source."""
    if not src.is_dir():
        return []
    used = set(files)
    return sorted(p.name if p.name.isprintable() else repr(p.name) for p in src.iterdir() if p not in used)


def import_metrics(src: str | Path, name: str | None = None, drafter: str = "vllm", method: str | None = None,
                   profile: CostProfile | None = None, temperature: float = 0.0) -> ImportedMetrics:
    """vLLM metrics files as one workload (in memory; ``save_workload`` writes it).

    Args:
        src: A ``.jsonl`` file of responses, or a folder of them.
        name: Workload name (default ``vllm-<file or folder stem>``).
        drafter: The drafter's name in the workload (a word).
        method: vLLM's ``speculative_config.method`` the server ran (provenance; ``ngram``/``suffix`` make the
            drafter a lookup, anything else a model).
        profile: Cost profile stored with the workload (default the shipped ``h100-llama31-8b``).
        temperature: The sampling temperature the requests ran at (provenance; at T > 0 a step's acceptance is one
            draw of the rejection sampler).
    """
    drafter = check_word(drafter, "--drafters", _DRAFTER_WORD)  # the options first, before any file is read
    if method is not None:
        check_word(method, "--method", _METHOD_WORD)
    temperature = check_temperature(temperature)
    if name is not None:
        check_name(name)
    src = Path(src)
    files = input_files(src)
    recs: list[VllmRequest] = []
    seen: dict[str, tuple[Path, int]] = {}
    for path in files:
        for rec in read_records(path):
            if rec.id in seen:
                first, at = seen[rec.id]
                raise _fail(path, rec.line, f"field 'id' {rec.id!r} repeats the request of {first}, line {at}")
            seen[rec.id] = (path, rec.line)
            recs.append(rec)
    requests, steps, skipped, unrecorded, cut, censored, rounds = [], [], 0, 0, 0, 0, 0
    for rec in recs:
        if not rec.accepted:
            skipped += 1
            continue
        flags = match_flags(rec.accepted, rec.drafted)
        runs = np.minimum(known_runs(flags), _RUN_MAX)
        requests.append({"request_id": rec.id, "category": rec.category, "temperature": float(temperature),
                         "prompt_len": rec.prompt_tokens + 1, "runs": {drafter: runs.astype(RUNS_DTYPE)}})
        steps.append([rec.accepted, rec.drafted])
        censored += int((flags == -1).sum())
        rounds += len(rec.accepted)
        if rec.completion_tokens is not None:
            gap = rec.completion_tokens - 1 - len(flags)  # > 0: plain decode steps; < 0: a cut last step
            unrecorded += max(gap, 0)
            cut += max(-gap, 0)
    if not requests:
        raise SpecgymError(f"{src}: no request has a verification step (every per_step_accepted is empty)")
    kind = "lookup" if (method or "").lower() in LOOKUP_METHODS else "model"
    spec_tokens = sorted({r.num_spec_tokens for r in recs})
    entry = drafter_entry(drafter, kind, "per-start", source=f"vLLM {FIELD}.per_step_accepted/per_step_drafted "
                          "(known runs: a censored position counts as rejected)", method=method or "unknown")
    source = {"kind": "imported", "format": "vllm-metrics", "engine": "vLLM",
              "what": "the user's own engine metrics (--per-request-spec-decode-metrics detailed), replayed; not a "
                      "specgym live run",
              "files": [{"file": p.name, "sha256": sha256_file(p)} for p in files], "method": method or "unknown",
              "num_spec_tokens": spec_tokens, "temperature": float(temperature)}
    extra = {"vllm_metrics": {
        "convention": "completion = the recorded verification steps in order; runs = known runs under the "
                      "per-position model (censored positions count as rejected); prompt_len = "
                      "usage.prompt_tokens + 1",
        "steps": steps, "skipped_requests": skipped, "unrecorded_tokens": unrecorded, "cut_tokens": cut,
        "split_fractions": list(SPLIT_FRACTIONS)}}
    wl = workload_from_requests(name or f"vllm-{src.stem}", source, profile or load_profile(PROFILE), requests,
                                split_seed=SPLIT_SEED, split_fractions=SPLIT_FRACTIONS, extra=extra,
                                drafters=[entry])
    return ImportedMetrics(wl, files, skipped, unrecorded, censored, rounds, cut, left_out_entries(src, files))


def steps_of(wl: Workload) -> list[tuple[list[int], list[int]]] | None:
    """The recorded steps of an imported vLLM-metrics workload, per request in workload order (None otherwise)."""
    block = (wl.extra or {}).get("vllm_metrics")
    if not block or wl.source.get("format") != "vllm-metrics":
        return None
    steps = block.get("steps")
    if not isinstance(steps, list) or len(steps) != wl.n_requests:
        raise SpecgymError(f"workload {wl.name!r}: metadata field 'extra.vllm_metrics.steps' must hold one entry per "
                           f"request ({wl.n_requests})")
    return [(list(a), list(d)) for a, d in steps]
