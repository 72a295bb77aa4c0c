"""Importer of SpecDecode-Bench's published traces (Llama-3.1-8B-Instruct on vLLM, one H100; EAGLE and n-gram).

The traces behind "Speculative Decoding: Performance or Illusion?" (arXiv:2601.11580) are JSON Lines files in the
public repository ``SpecDecode-Bench/simulator`` (``data/llama3.1-8B/combined_<dataset>.jsonl``; GSM8K,
InstructCoder, ShareGPT, CNN/DailyMail). They carry no license: specgym ships this importer and documentation of
where to get them, never the files or anything derived from them. One object per line:

* ``id`` (string), ``prompt_token_ids`` and ``generated_token_ids`` (Llama-3 token ids);
* ``acc_eagle.acc_len`` and ``acc_ngram.acc_len``: per output position, the tokens a verification round that
  *starts* there produces when the drafter proposes enough (accepted drafts + the bonus token, >= 1). The n-gram
  list matches ``generated_token_ids``; the EAGLE list was recorded in a separate run and its length differs in
  some requests.

**Convention** (specgym's requests start after the prefill, :mod:`specgym.envs.workloads.trace_format`): the
reference simulator starts a request with one token generated (``g = 1``) and reads ``acc_len[g - 1]`` for a round
at ``g``. An imported request's completion is the decode positions after that first token: ``N = len(acc_len) - 1``
positions, ``runs[i] = acc_len[i] - 1`` (the bonus excluded) for ``i = 0..N-1``, and ``prompt_len =
len(prompt_token_ids) + 1`` (the prompt plus the first token, which the prefill produced), so the KV cache at
completion position ``i`` holds ``prompt_len + i`` tokens, as for every workload.

**Drafters.** By default both are kept, cut to the shorter list: ``N + 1 = min(len(acc_eagle), len(acc_ngram))``;
the positions cut from a longer list are recorded per request in the metadata (``extra.specdecode.cut``) and
summarised in one line. ``drafters=("eagle",)`` imports one drafter at its own length (what the reference
simulator's EAGLE experiment reads). Format v3 (per-start runs, ``runs_eagle`` / ``runs_ngram``); the
per-position columns the data lacks (``p_accept``, draft confidence and entropy) are absent, never zeros.

**Signals from token ids** are stored only where the ids are the real tokens of the completion (the n-gram run's
``generated_token_ids``, when every request's kept length fits them): ``token_id`` (``t_i`` =
``generated_token_ids[i + 1]``) and the context lookup ``lookup_len`` / ``lookup_token`` on
``prompt + t_0..t_{i-1}`` (:mod:`specgym.envs.core.lookup`; no ``lookup_agree``: there is no draft token). Position
and prompt length are the trace's own.

Splits: the shipped split seed (:data:`SPLIT_SEED`) and fractions 0.7 / 0.1 / 0.2 by request; category = the
dataset's name from the file name (``combined_gsm8k.jsonl`` -> ``gsm8k``). Every defect is a one-line error naming
the file, the line and the field; nothing is written until every input parsed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.lookup import LOOKUP_MAX_N, lookup_columns
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.build import workload_from_requests
from specgym.envs.workloads.workload import RUNS_DTYPE, Workload, drafter_entry
from specgym.errors import SpecgymError
from specgym.io import sha256_file

#: drafter name -> (JSON field holding its ``acc_len``, kind, what it is)
DRAFTERS: dict[str, tuple[str, str, str]] = {
    "eagle": ("acc_eagle", "model", "EAGLE draft head of Llama-3.1-8B-Instruct (vLLM)"),
    "ngram": ("acc_ngram", "lookup", "vLLM's n-gram (prompt-lookup) proposer"),
}
DATASETS = ("gsm8k", "instructcoder", "sharegpt", "cnn")
#: The split seed every import uses (so every user's import has the same test split), and the fractions.
SPLIT_SEED = 0
SPLIT_FRACTIONS = (0.7, 0.1, 0.2)
#: How far a run may reach past the request's last position: the published files overrun by up to 19 near request
#: ends (a drafter accepting tokens the recorded completion no longer has); a larger overrun is not a trace.
MAX_OVERRUN = 64
#: Llama-3's vocabulary (token ids are checked against it).
VOCAB_SIZE = 128256
PROFILE = "h100-llama31-8b"
SOURCE = {
    "kind": "published",
    "dataset": "SpecDecode-Bench",
    "paper": "Liu, Yu, Park, Stoica, Cheung: Speculative Decoding: Performance or Illusion? (arXiv:2601.11580)",
    "repository": "https://github.com/SpecDecode-Bench/simulator (data/llama3.1-8B)",
    "target_model": "meta-llama/Llama-3.1-8B-Instruct",
    "serving": "vLLM on one NVIDIA H100, greedy",
}


@dataclass
class Imported:
    """One imported file: the workload and what the import had to do."""

    workload: Workload
    path: Path
    cut_requests: int = 0
    cut_positions: int = 0
    token_ids: bool = True
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: requests, positions, drafters, cuts."""
        wl = self.workload
        line = (f"{self.path}: {wl.n_requests} requests, {wl.n_positions:,} positions, drafters "
                f"{','.join(wl.drafter_names)}")
        if len(wl.drafter_names) > 1:
            line += (f"; list lengths differ in {self.cut_requests} requests: {self.cut_positions:,} positions cut to "
                     f"the shorter list (extra.specdecode.cut)")
        if not self.token_ids:
            line += "; no token ids (they are not this completion's tokens in some requests)"
        return "; ".join([line, *self.notes])


def dataset_name(path: Path) -> str:
    """The category of a file: ``combined_gsm8k.jsonl`` -> ``gsm8k`` (else the file's stem)."""
    stem = path.stem
    m = re.fullmatch(r"combined_(.+)", stem)
    return (m.group(1) if m else stem).lower()


def _fail(path: Path, line: int, what: str) -> SpecgymError:
    return SpecgymError(f"{path}, line {line}: {what}")


def _int_list(obj: Any, path: Path, line: int, name: str, lo: int, hi: int, min_len: int) -> list[int]:
    """A JSON list of ints in [lo, hi] with at least ``min_len`` items, or a one-line error naming the field."""
    if obj is None:
        raise _fail(path, line, f"field {name!r} missing")
    if not isinstance(obj, list) or len(obj) < min_len:
        raise _fail(path, line, f"field {name!r} must be a list of " + (f"at least {min_len} integers" if min_len
                                                                        else "integers"))
    for k, v in enumerate(obj):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _fail(path, line, f"field {name!r}[{k}] = {v!r}: expected an integer in [{lo}, {hi}]")
    return obj


def _acc_len(d: dict[str, Any], key: str, path: Path, line: int) -> list[int]:
    block = d.get(key)
    if not isinstance(block, dict) or "acc_len" not in block:
        raise _fail(path, line, f"field '{key}.acc_len' missing")
    return _int_list(block["acc_len"], path, line, f"{key}.acc_len", 1, int(np.iinfo(RUNS_DTYPE).max) + 1, 2)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct (``json`` would keep the last of two silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def check_name(name: str) -> str:
    """A workload name given by the user: it names files (``<out>/<name>.parquet``, report folders), so it is
    letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", name):
        raise SpecgymError(f"--name {name!r}: a workload name is 1-128 letters, digits, '.', '_' or '-', starting "
                           f"with a letter or digit (it names files)")
    return name


def request_id(rid: Any, path: Path, line: int) -> str:
    """A request's ``id`` field as a string: a non-empty string (or integer) without control characters.

    Args:
        rid: The field's value.
        path, line: Where it was read (for the message).

    Raises:
        SpecgymError: One line naming the file, the line and the field.
    """
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or str(rid) == "":
        raise _fail(path, line, f"field 'id' must be a non-empty string, got {rid!r}")
    rid = str(rid)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in rid):
        raise _fail(path, line, f"field 'id' {rid!r} holds a control character (a newline breaks reports)")
    return rid


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` of every non-blank line of a JSON Lines file; a one-line error naming the file
    (and the line) for unreadable text, invalid JSON or a key given twice in one object."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecgymError(f"{path}: not UTF-8 text (expected JSON Lines)") from None
    except OSError as exc:
        raise SpecgymError(f"{path}: cannot read ({exc.strerror})") from None
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield line, json.loads(raw, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise _fail(path, line, f"not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})") from None
        except _DuplicateKey as exc:
            raise _fail(path, line, f"field {exc.args[0]!r} appears twice in one object (which is meant?)") from None


def read_records(path: Path, drafters: Sequence[str]) -> list[dict[str, Any]]:
    """Parse and check every line of one file (the fields the import reads)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for line, d in json_lines(path):
        if not isinstance(d, dict):
            raise _fail(path, line, "expected a JSON object")
        rid = request_id(d.get("id"), path, line)
        if rid in seen:
            raise _fail(path, line, f"field 'id' {rid!r} repeats an earlier request")
        seen.add(rid)
        rec = {"id": rid, "line": line,
               "prompt": _int_list(d.get("prompt_token_ids"), path, line, "prompt_token_ids", 0, VOCAB_SIZE - 1, 1),
               "generated": _int_list(d.get("generated_token_ids"), path, line, "generated_token_ids", 0,
                                      VOCAB_SIZE - 1, 0),
               "acc": {name: _acc_len(d, DRAFTERS[name][0], path, line) for name in drafters}}
        out.append(rec)
    if not out:
        raise SpecgymError(f"{path}: no requests (an empty file)")
    return out


def import_file(path: str | Path, drafters: Sequence[str] = ("eagle", "ngram"), name: str | None = None,
                profile: CostProfile | None = None) -> Imported:
    """One SpecDecode-Bench file as a workload (in memory; :func:`save_workload` writes it).

    Args:
        path: A ``combined_<dataset>.jsonl`` file.
        drafters: The drafters to keep, the default first (``eagle``, ``ngram``).
        name: Workload name (default ``specdecode-<dataset>``).
        profile: Cost profile stored with the workload (default the shipped ``h100-llama31-8b``).
    """
    path = Path(path)
    drafters = check_drafters(drafters)
    if name is not None:
        check_name(name)
    recs = read_records(path, drafters)
    category = dataset_name(path)
    requests, cuts = [], {}
    token_ids = all(min(len(r["acc"][d]) for d in drafters) <= len(r["generated"]) and
                    ("ngram" in drafters or all(len(r["acc"][d]) == len(r["generated"]) for d in drafters))
                    for r in recs)
    short = next((r for r in recs if min(len(r["acc"][d]) for d in drafters) > len(r["generated"])), None)
    if "ngram" in drafters and short is not None:  # the lookup signals of every request hang on these ids
        n = min(len(short["acc"][d]) for d in drafters)
        raise _fail(path, short["line"], f"field 'generated_token_ids' has {len(short['generated'])} tokens, fewer "
                                         f"than the {n} positions of the acc_len lists: without this completion's "
                                         f"tokens no request of the file gets lookup signals (fix or drop the "
                                         f"request; --drafters eagle imports without token ids)")
    left_out = 0  # requests whose acc_len lists stop short of their generated tokens
    for r in recs:
        lengths = {d: len(r["acc"][d]) for d in drafters}
        keep = min(lengths.values())  # N + 1: the first token (the prefill's) and N decode positions
        cut = sum(n - keep for n in lengths.values())
        if cut:
            cuts[r["id"]] = cut
        n = keep - 1
        left_out += token_ids and max(lengths.values()) < len(r["generated"])
        for d in drafters:
            over = [k for k in range(n) if r["acc"][d][k] - 1 - (n - k) > MAX_OVERRUN]
            if over:
                k = over[0]
                raise _fail(path, r["line"], f"field '{DRAFTERS[d][0]}.acc_len'[{k}] = {r['acc'][d][k]}: a run of "
                                             f"{r['acc'][d][k] - 1} tokens from position {k} of {n} reaches "
                                             f"{r['acc'][d][k] - 1 - (n - k)} past the request's end (at most "
                                             f"{MAX_OVERRUN})")
        req: dict[str, Any] = {
            "request_id": r["id"], "category": category, "temperature": 0.0, "prompt_len": len(r["prompt"]) + 1,
            "runs": {d: np.asarray(r["acc"][d][:n], dtype=np.int64) - 1 for d in drafters},
        }
        if token_ids:
            prompt = r["prompt"] + r["generated"][:1]
            completion = r["generated"][1:keep]
            lens, toks, _ = lookup_columns(prompt, completion, np.full(n, -2), LOOKUP_MAX_N)
            req.update(token_id=np.asarray(completion, dtype=np.int32), lookup_len=lens, lookup_token=toks)
        requests.append(req)
    entries = [drafter_entry(d, DRAFTERS[d][1], "per-start", source=f"{DRAFTERS[d][0]}.acc_len minus the bonus token",
                             proposer=DRAFTERS[d][2]) for d in drafters]
    source = dict(SOURCE, file=path.name, sha256=sha256_file(path), drafters=list(drafters))
    extra = {"specdecode": {"convention": "completion = decode positions after the prefill's first token; runs[i] = "
                                          "acc_len[i] - 1; prompt_len = len(prompt_token_ids) + 1",
                            "cut": cuts, "split_fractions": list(SPLIT_FRACTIONS)}}
    signal_meta = {"lookup_max_n": LOOKUP_MAX_N, "vocab_size": VOCAB_SIZE} if token_ids else {}
    wl = workload_from_requests(name or f"specdecode-{category}", source, profile or load_profile(PROFILE), requests,
                                split_seed=SPLIT_SEED, split_fractions=SPLIT_FRACTIONS, extra=extra,
                                signal_meta=signal_meta, drafters=entries)
    notes = [f"acc_len lists shorter than generated_token_ids in {left_out} requests: their last tokens are not "
             f"replayed"] if left_out else []
    return Imported(wl, path, len(cuts), sum(cuts.values()), token_ids, notes)


def check_drafters(drafters: Sequence[str]) -> tuple[str, ...]:
    """The drafter list, checked (known names, no repeats, at least one)."""
    if isinstance(drafters, str):  # one name, or the CLI's comma-separated text: not a list of letters
        drafters = drafters.split(",")
    out = tuple(d.strip().lower() for d in drafters if d.strip())
    bad = [d for d in out if d not in DRAFTERS]
    if bad or not out or len(set(out)) != len(out):
        raise SpecgymError(f"--drafters: expected a comma-separated subset of {', '.join(DRAFTERS)} without repeats, "
                           f"got {','.join(drafters)!r}")
    return out


def input_files(src: str | Path, expected: str = "the combined_<dataset>.jsonl files") -> list[Path]:
    """The ``.jsonl`` files of ``src`` (a file, or every ``.jsonl`` file of a folder, sorted); ``expected`` says
    what an empty folder should have held."""
    if str(src).strip() == "":
        raise SpecgymError(f"source '': name a .jsonl file or a folder of them ({expected})")
    src = Path(src)
    if src.is_dir():
        found = sorted(src.glob("*.jsonl"))
        broken = [p for p in found if not p.is_file()]
        if broken:  # a dangling link or a folder named *.jsonl: said, never skipped without a word
            raise SpecgymError(f"{broken[0]}: not a readable file (a broken link, or a folder); fix or move it away")
        if not found:
            raise SpecgymError(f"{src}: no .jsonl file in this folder (expected {expected})")
        return found
    if src.exists() and not src.is_file():
        raise SpecgymError(f"{src}: not a regular file or folder (a device, pipe or socket)")
    if not src.is_file():
        raise SpecgymError(f"{src}: no such file or folder")
    return [src]
