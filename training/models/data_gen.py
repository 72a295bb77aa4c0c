"""``specgym data generate``: training data the target writes at scale (prompts, then its answers), resumable.

Stages, over one output folder (default ``build/data-smollm2``):

1. **passages**: the long-input prompts' passages: standard-library docstrings (``passages/stdlib.jsonl``) and
   passages the target writes (``passages/NNNNN.jsonl``), :mod:`specgym.training.models.passages`.
2. **prompts**: the target writes user turns, Magpie-style (``raw/NNNNN.jsonl``), :mod:`specgym.training.models.magpie`.
3. **select**: quality filters, exact and near-duplicate removal, sources and splits by source
   (:mod:`specgym.training.models.prompt_filter`), written as a prompts file (``prompts.jsonl``, which ``specgym
   record`` and ``specgym train-draft --prompts`` read) and the rejects with their reasons (``rejected.jsonl``).
4. **answers**: the target's greedy answer and ``samples`` sampled ones (temperature 0.7 by default, seeded) to every
   prompt: token ids and text, ``answers/NNNNN.jsonl``.

Every generating stage works in shards: a shard file appears complete or not at all (written as a temporary and
renamed), so a killed run, started again with ``--resume``, continues at the next unfinished shard. Shards are
spread over ``workers`` processes of one torch thread each (a queue: a free worker takes the next shard). Each
finished shard's tokens and times go to ``log.jsonl``; ``summary.json`` sums up the run.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specgym.console import make_progress
from specgym.envs.engines.live.model_loading import encode_prompt, load_model, load_tokenizer
from specgym.errors import SpecgymError
from specgym.io import TMP_PREFIX, foreign_entry, make_owned_dir, remove_owned
from specgym.training.models.batched import generate_rows
from specgym.training.models.magpie import (
    CATEGORIES,
    Seed,
    assign_passages,
    check_categories,
    compose,
    end_of_turn_ids,
    passage_seeds_needed,
    plan_seeds,
    pre_query,
    system_message,
)
from specgym.training.models.passages import (
    STDLIB_LICENSE,
    TARGET_LICENSE,
    Passage,
    passage_pool,
    stdlib_passages,
    target_requests,
    trim_passage,
)
from specgym.training.models.prompt_filter import (
    Candidate,
    check_fractions,
    dedup,
    quality_reason,
    source_groups,
    split_of,
)

OWNER = "specgym data generate"
OWNED = ["config.json", "summary.json", "prompts.jsonl", "rejected.jsonl", "log.jsonl", "passages/*", "raw/*",
         "answers/*"]


@dataclass
class DataConfig:
    """What one data folder holds; a ``--resume`` continues only the configuration it was started with.

    Attributes:
        target: The target (a folder, a ``.gguf`` file or a shipped pair's target name).
        prompts: Prompts kept after filtering and de-duplication (fewer if too few survive: the summary says so).
        oversample: User turns sampled per prompt kept (``ceil(prompts * oversample)`` in all).
        categories: The categories steered to, in turn.
        splits: Train, val and test fractions of the sources.
        max_new_tokens: Longest answer.
        samples: Sampled answers per prompt (besides the greedy one).
        temperature: The sampled answers' temperature.
        prompt_temperature: The user turns' sampling temperature.
        prompt_top_p: The user turns' nucleus mass.
        prompt_max_tokens: Longest user turn (a longer one is cut and rejected as unterminated).
        passage_max_tokens: Longest target-written passage.
        per_passage: Prompts per passage.
        target_passages: Fraction of passages the target writes (the rest: standard-library docstrings).
        stdlib_subdir: A folder of the standard library to take docstrings from (empty: all of it).
        dedup_threshold: Request Jaccard similarity at which a prompt is a near-duplicate (dropped).
        group_threshold: Prompt Jaccard similarity at which two prompts share a source (one split).
        min_words: Fewest words of a user turn.
        batch: Rows decoded side by side (continuous batching's slots; rows per ``generate`` call for a model it
            does not run).
        shard_size: Items per shard file (the unit of resumption and of work given to a worker).
        seed: The seed of every draw (steering, passages, sampling, splits).
        answer_prompts: Answer only the first this many prompts of ``prompts.jsonl``, rounded up to whole shards
            (:func:`answer_shards`); 0: every prompt. The prompts file is in the seed plan's order, which takes the
            categories in turn and mixes the splits, so any prefix spreads over both. The only option a ``--resume``
            may change: a larger value answers more prompts, keeping every finished shard.
    """

    target: str = "smollm2"
    prompts: int = 6000
    oversample: float = 1.4
    categories: tuple[str, ...] = tuple(CATEGORIES)
    splits: tuple[float, float, float] = (0.8, 0.1, 0.1)
    max_new_tokens: int = 256
    samples: int = 1
    temperature: float = 0.7
    prompt_temperature: float = 0.7
    prompt_top_p: float = 0.9
    prompt_max_tokens: int = 128
    passage_max_tokens: int = 256
    per_passage: int = 2
    target_passages: float = 0.5
    stdlib_subdir: str = ""
    dedup_threshold: float = 0.7
    group_threshold: float = 0.5
    min_words: int = 4
    batch: int = 32
    shard_size: int = 64
    seed: int = 0
    answer_prompts: int = 0

    def check(self) -> DataConfig:
        """Refuse values no run can use (one line naming the field); returns the config."""
        self.categories = check_categories(list(self.categories))
        self.splits = check_fractions(self.splits)
        for name in ("prompts", "max_new_tokens", "prompt_max_tokens", "passage_max_tokens", "per_passage", "batch",
                     "shard_size", "min_words"):
            if getattr(self, name) < 1:
                raise SpecgymError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if self.answer_prompts < 0:
            raise SpecgymError(f"--answer-prompts {self.answer_prompts}: must be >= 0 (0: every prompt)")
        if self.samples < 0 or self.oversample < 1 or not 0 <= self.target_passages <= 1:
            raise SpecgymError(f"--samples {self.samples}, --oversample {self.oversample}, --target-passages "
                               f"{self.target_passages}: need samples >= 0, oversample >= 1, 0 <= target-passages "
                               f"<= 1")
        if self.temperature <= 0 or self.prompt_temperature <= 0 or not 0 < self.prompt_top_p <= 1:
            raise SpecgymError("--temperature and --prompt-temperature must be > 0 and --prompt-top-p in (0, 1]")
        if not 0 < self.group_threshold <= 1 or not 0 < self.dedup_threshold <= 1:
            raise SpecgymError("the de-duplication and grouping thresholds must be in (0, 1]")
        return self


def _doc(cfg: DataConfig) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(cfg)))


#: The configuration fields a ``--resume`` may change (:attr:`DataConfig.answer_prompts`); the others fix the data.
RESUMABLE_CHANGES = ("answer_prompts",)


def answer_shards(n_prompts: int, config: dict[str, Any]) -> int:
    """How many answer shards a data folder of ``n_prompts`` prompts plans (``config``: its ``config.json``): every
    prompt's, or the shards holding its first ``answer_prompts`` (a folder written before the option: every prompt's).
    ``train-draft``/``train-head --data`` and ``data eval-prompts`` wait for exactly these."""
    size = int(config["shard_size"])
    total = math.ceil(n_prompts / size)
    limit = int(config.get("answer_prompts") or 0)
    return min(total, math.ceil(limit / size)) if limit > 0 else total


def check_output_folder(out: Path, cfg: DataConfig, resume: bool, force: bool) -> None:
    """Refuse an output folder a run cannot use, before anything is read or written.

    Raises:
        SpecgymError: Both flags; an existing folder without either; a folder specgym did not write; a resumed folder
            started with another configuration.
    """
    if resume and force:
        raise SpecgymError("--resume and --force: choose one (continue the folder, or start it over)")
    if not out.exists():
        return
    if not (resume or force):
        raise SpecgymError(f"--out {out}: already exists (pass --resume to continue it, or --force to start over)")
    if not out.is_dir() or (foreign := foreign_entry(out)) is not None:
        what = "not a folder" if not out.is_dir() else foreign
        raise SpecgymError(f"--out {out}: not a folder specgym data generate wrote ({what}); name another --out")
    path = out / "config.json"
    if resume and path.is_file():
        try:
            have = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise SpecgymError(f"{path}: unreadable; pass --force to start the folder over") from None
        diff = [f"{k} {have.get(k)!r} there, {v!r} now" for k, v in _doc(cfg).items()
                if have.get(k, 0 if k in RESUMABLE_CHANGES else None) != v and k not in RESUMABLE_CHANGES]
        if diff:
            raise SpecgymError(f"--resume {out}: started with another configuration ({'; '.join(diff)}); give the "
                               f"same options, or --force to start over")


def open_output(out: Path, cfg: DataConfig, resume: bool, force: bool) -> None:
    """Create ``out`` (owned by specgym), reopen it with ``resume`` or replace it with ``force``
    (:func:`check_output_folder` first); ``config.json`` records the configuration."""
    check_output_folder(out, cfg, resume, force)
    if out.exists() and force:
        remove_owned(out)
    if not out.exists():
        make_owned_dir(out, OWNER, OWNED)
    if not (out / "config.json").is_file() or resume:  # a resume may have changed answer_prompts: recorded
        write_atomic(out / "config.json", [_doc(cfg)], as_lines=False)


def write_atomic(path: Path, docs: list[dict[str, Any]], as_lines: bool = True) -> None:
    """Write JSON Lines (or one JSON document) through a temporary sibling renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    with open(tmp, "w", encoding="utf-8") as f:
        if as_lines:
            for d in docs:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        else:
            f.write(json.dumps(docs[0], indent=2) + "\n")
    os.replace(tmp, path)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file this module wrote."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass
class Job:
    """One shard: its stage, index, file and items (plain dicts: a worker process receives it pickled)."""

    stage: str
    index: int
    path: Path
    items: list[dict[str, Any]]
    rows: int


def load_target(cfg: DataConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the target, through specgym's model loading (shipped names, GGUF, folders)."""
    return load_model(cfg.target, "target"), load_tokenizer(cfg.target, "target")


def _pad_id(tok: Any) -> int:
    return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)


def run_job(model: Any, tok: Any, cfg: DataConfig, job: Job, on_batch: Callable[[int, int], None]) -> list[dict]:
    """The records of one shard (:func:`_passages_job`, :func:`_prompts_job` or :func:`_answers_job`)."""
    return {"passages": _passages_job, "prompts": _prompts_job, "answers": _answers_job}[job.stage](
        model, tok, cfg, job, on_batch)


def _passages_job(model: Any, tok: Any, cfg: DataConfig, job: Job, on_batch: Callable[[int, int], None]) -> list[
        dict]:
    rows = [encode_prompt(tok, it["request"]) for it in job.items]
    gens = generate_rows(model, rows, pad_id=_pad_id(tok), stop_ids=[int(tok.eos_token_id)],
                         max_new_tokens=cfg.passage_max_tokens, temperature=cfg.prompt_temperature, top_p=1.0,
                         seed=cfg.seed + 7919 * job.index, batch=cfg.batch, on_batch=on_batch)
    out = []
    for it, g in zip(job.items, gens):
        text = trim_passage(tok.decode(g.ids, skip_special_tokens=True))
        out.append({"id": it["id"], "text": text, "license": TARGET_LICENSE, "origin": it["request"],
                    "tokens": len(g.ids)})
    return out


def _prompts_job(model: Any, tok: Any, cfg: DataConfig, job: Job, on_batch: Callable[[int, int], None]) -> list[
        dict]:
    todo = [it for it in job.items if not it.get("rejected")]
    rows = [[int(t) for t in tok(pre_query(tok, it["system"]), add_special_tokens=False)["input_ids"]]
            for it in todo]
    gens = generate_rows(model, rows, pad_id=_pad_id(tok), stop_ids=end_of_turn_ids(tok),
                         max_new_tokens=cfg.prompt_max_tokens, temperature=cfg.prompt_temperature,
                         top_p=cfg.prompt_top_p, seed=cfg.seed + 104729 + 7919 * job.index, batch=cfg.batch,
                         on_batch=on_batch)
    if len(todo) < len(job.items):
        on_batch(len(job.items) - len(todo), 0)  # the rows of passages too short to use: done, nothing generated
    made = {it["id"]: g for it, g in zip(todo, gens)}
    out = []
    for it in job.items:
        rec = {k: it[k] for k in ("id", "category", "task", "length", "passage", "steer")}
        g = made.get(it["id"])
        if g is None:
            out.append({**rec, "request": "", "terminated": False, "tokens": 0, "rejected": it["rejected"]})
            continue
        ids = g.ids[:-1] if g.stopped else g.ids
        out.append({**rec, "request": tok.decode(ids, skip_special_tokens=True).strip(), "terminated": g.stopped,
                    "tokens": len(g.ids)})
    return out


def _answers_job(model: Any, tok: Any, cfg: DataConfig, job: Job, on_batch: Callable[[int, int], None]) -> list[
        dict]:
    rows = [encode_prompt(tok, it["prompt"]) for it in job.items]
    stop = [int(tok.eos_token_id)]
    out = []
    for s in range(cfg.samples + 1):
        temp = 0.0 if s == 0 else cfg.temperature
        seed = cfg.seed + 7919 * job.index + 104729 * s
        gens = generate_rows(model, rows, pad_id=_pad_id(tok), stop_ids=stop, max_new_tokens=cfg.max_new_tokens,
                             temperature=temp, seed=seed, batch=cfg.batch, on_batch=on_batch)
        for it, ids, g in zip(job.items, rows, gens):
            out.append({"id": it["id"], "split": it["split"], "category": it["category"], "source": it["source"],
                        "mode": "greedy" if s == 0 else "sampled", "temperature": temp, "sample": max(0, s - 1),
                        "seed": None if s == 0 else seed, "prompt_ids": ids, "answer_ids": g.ids,
                        "text": tok.decode(g.ids, skip_special_tokens=True),
                        "stop": "eos" if g.stopped else "length", "tokens": len(g.ids)})
    return out


def _do_job(model: Any, tok: Any, cfg: DataConfig, job: Job, on_batch: Callable[[int, int], None]) -> dict:
    """Run one shard, write it atomically; returns its log record."""
    t0, c0 = time.perf_counter(), time.process_time()
    records = run_job(model, tok, cfg, job, on_batch)
    write_atomic(job.path, records)
    return {"stage": job.stage, "shard": job.index, "rows": job.rows, "tokens": sum(r["tokens"] for r in records),
            "wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(time.process_time() - c0, 3)}


def _set_threads() -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()


def _exit_with_parent(parent: int, every_s: float = 2.0) -> None:
    """End this worker as soon as the run that started it is gone (killed: ``SIGTERM`` or ``SIGKILL`` skip its
    ``close``), instead of finishing a shard nobody collects; its finished shards are kept, and the next run
    overwrites the temporary file of the shard it was writing."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker(cfg_doc: dict, tasks: Any, results: Any, parent: int | None = None) -> None:
    """A worker process: one torch thread, the target loaded once, shards from ``tasks`` until a None (or until the
    run that started it, ``parent``, is gone)."""
    if parent is not None:
        _exit_with_parent(parent)
    try:
        _set_threads()
        cfg = config_from(cfg_doc)
        model, tok = load_target(cfg)
        while (job := tasks.get()) is not None:
            results.put(("done", _do_job(model, tok, cfg, job, lambda r, t: results.put(("batch", r, t)))))
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        results.put(("error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))


def config_from(doc: dict[str, Any]) -> DataConfig:
    """A :class:`DataConfig` from its JSON form (tuples restored)."""
    cfg = DataConfig(**doc)
    cfg.categories, cfg.splits = tuple(cfg.categories), tuple(cfg.splits)  # type: ignore[assignment]
    return cfg


class _Local:
    """The target loaded once in this process (``workers`` 1), on first use."""

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.pair: tuple[Any, Any] | None = None

    def get(self) -> tuple[Any, Any]:
        if self.pair is None:
            _set_threads()
            self.pair = load_target(self.cfg)
        return self.pair


def run_shards(cfg: DataConfig, out: Path, jobs: list[Job], label: str, local: _Local, pool: _Pool,
               quiet: bool = False) -> dict[str, Any]:
    """Run a stage's unfinished shards (finished shard files are kept: the resume); returns this run's
    ``{"shards", "tokens", "wall_s"}``. A progress bar counts rows (prompts or answers) with the ETA."""
    pending = [j for j in jobs if not j.path.exists()]
    stats: dict[str, Any] = {"shards": len(pending), "tokens": 0, "wall_s": 0.0}
    if not pending:
        return stats
    total = sum(j.rows for j in jobs)
    t0 = time.perf_counter()
    with make_progress(disable=quiet) as progress:
        task = progress.add_task(label, total=total, completed=total - sum(j.rows for j in pending))

        def on_batch(rows: int, tokens: int) -> None:
            stats["tokens"] += tokens
            rate = stats["tokens"] / max(time.perf_counter() - t0, 1e-9)
            progress.update(task, advance=rows, description=f"{label} ({rate:.0f} tok/s)")

        def on_done(record: dict[str, Any]) -> None:
            with open(out / "log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({**record, "workers": pool.workers, "time": time.time()}) + "\n")

        if pool.workers == 1:
            model, tok = local.get()
            for job in pending:
                on_done(_do_job(model, tok, cfg, job, on_batch))
        else:
            pool.run(pending, on_batch, on_done)
    stats["wall_s"] = round(time.perf_counter() - t0, 3)
    return stats


class _Pool:
    """``workers`` spawned processes of one torch thread each, started on first use and kept for every stage (the
    target is loaded once per process); a shared queue hands out shards, so a free worker takes the next one."""

    def __init__(self, cfg: DataConfig, workers: int) -> None:
        self.cfg, self.workers = cfg, workers
        self.procs: list[Any] = []
        self.tasks: Any = None
        self.results: Any = None

    def run(self, pending: list[Job], on_batch: Callable[[int, int], None],
            on_done: Callable[[dict[str, Any]], None]) -> None:
        """Run ``pending`` shards; a worker's failure or death stops the stage with one line."""
        if not self.procs:
            ctx = multiprocessing.get_context("spawn")
            self.tasks, self.results = ctx.Queue(), ctx.Queue()
            self.procs = [ctx.Process(target=_worker, args=(_doc(self.cfg), self.tasks, self.results, os.getpid()),
                                      daemon=True) for _ in range(self.workers)]
            for p in self.procs:
                p.start()
        for job in pending:
            self.tasks.put(job)
        left = len(pending)
        while left:
            try:
                msg = self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in self.procs if p.exitcode is not None]
                if dead:
                    raise SpecgymError(f"a worker process ended (exit code {dead[0]}) with shards left; finished "
                                       f"shards are kept: run again with --resume") from None
                continue
            if msg[0] == "batch":
                on_batch(msg[1], msg[2])
            elif msg[0] == "done":
                on_done(msg[1])
                left -= 1
            else:
                raise SpecgymError(f"worker: {msg[1]}; finished shards are kept: run again with --resume")

    def close(self) -> None:
        """Stop the workers (a None each, then terminate any still running)."""
        for _ in self.procs:
            self.tasks.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
        self.procs = []


def _shards(stage: str, folder: Path, items: list[dict[str, Any]], size: int, rows_per_item: int = 1) -> list[Job]:
    return [Job(stage, k, folder / f"{k:05d}.jsonl", items[i:i + size], len(items[i:i + size]) * rows_per_item)
            for k, i in enumerate(range(0, len(items), size))]


def _plan(cfg: DataConfig, stdlib: list[Passage]) -> tuple[list[Seed], list[str]]:
    """The seeds of the prompts stage with their passages, and the passage pool."""
    seeds = plan_seeds(math.ceil(cfg.prompts * cfg.oversample), cfg.categories, cfg.seed)
    need = passage_seeds_needed(seeds, cfg.categories, cfg.per_passage)
    pool = passage_pool(need, stdlib, cfg.target_passages, cfg.seed) if need else []
    assign_passages(seeds, pool, cfg.per_passage)
    return seeds, pool


def _passage_texts(out: Path, stdlib: list[Passage]) -> dict[str, dict[str, Any]]:
    """Passage id -> ``{"text", "license"}`` (text None: a target passage too short to use)."""
    texts = {p.id: {"text": p.text, "license": p.license} for p in stdlib}
    for f in sorted((out / "passages").glob("[0-9]*.jsonl")):
        texts.update({d["id"]: {"text": d["text"], "license": d["license"]} for d in read_lines(f)})
    return texts


def _prompt_jobs(cfg: DataConfig, out: Path, seeds: list[Seed], texts: dict[str, dict[str, Any]]) -> list[Job]:
    items = []
    for s in seeds:
        text = texts[s.passage]["text"] if s.passage is not None else None
        bad = s.passage is not None and text is None
        items.append({"id": s.id, "category": s.category, "task": s.task, "length": s.length, "passage": s.passage,
                      "steer": s.steer(), "system": system_message(s, text), "rejected": "bad_passage" if bad else ""})
    return _shards("prompts", out / "raw", items, cfg.shard_size)


def select(cfg: DataConfig, raw: list[dict[str, Any]], texts: dict[str, dict[str, Any]]) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]]]:
    """``(prompts, rejected)`` from the raw user turns (in plan order): quality filters, de-duplication,
    ``cfg.prompts`` survivors shared evenly over the categories (:func:`balanced`), then sources and splits by source.
    Each rejected record names its ``reason``."""
    cands: list[tuple[Candidate, dict[str, Any]]] = []
    rejected: list[dict[str, Any]] = []
    for r in raw:
        passage = texts[r["passage"]]["text"] if r["passage"] is not None else None
        seed = Seed(r["id"], r["category"], r["task"], r["length"], r["passage"])
        c = Candidate(r["id"], compose(seed, r["request"], passage), r["request"], r["steer"], r["passage"],
                      r["terminated"])
        reason = r.get("rejected") or quality_reason(c, cfg.min_words)
        if reason:
            rejected.append({"id": r["id"], "category": r["category"], "reason": reason, "request": r["request"]})
        else:
            cands.append((c, r))
    drop = dedup([c for c, _ in cands], cfg.dedup_threshold, cfg.seed)
    kept = []
    for i, (c, r) in enumerate(cands):
        if i in drop:
            kind, _, of = drop[i].partition(" of ")
            rejected.append({"id": c.id, "category": r["category"], "reason": kind.replace("-", "_"), "of": of,
                             "request": c.request})
        else:
            kept.append((c, r))
    chosen = balanced([r["category"] for _, r in kept], cfg.prompts, cfg.categories)
    for i, (c, r) in enumerate(kept):
        if i not in chosen:
            rejected.append({"id": c.id, "category": r["category"], "reason": "surplus", "request": c.request})
    kept = [x for i, x in enumerate(kept) if i in chosen]
    sources = source_groups([c for c, _ in kept], cfg.group_threshold, cfg.seed)
    prompts = []
    for (c, r), src in zip(kept, sources):
        lic = {"request": TARGET_LICENSE}
        if c.passage is not None:
            lic["passage"] = texts[c.passage]["license"]
        prompts.append({"id": c.id, "category": r["category"], "split": split_of(src, cfg.splits, cfg.seed),
                        "source": src, "prompt": c.text, "request": c.request, "passage": c.passage,
                        "steer": c.steer, "license": lic})
    return prompts, rejected


def balanced(categories: list[str], n: int, order: tuple[str, ...]) -> set[int]:
    """The indices of ``n`` items (at most) with as even a share of every category of ``order`` as the items allow:
    each category's first ``n / len(order)`` items, then, where a category has too few, the earliest items left."""
    quota = {c: n // len(order) + (1 if i < n % len(order) else 0) for i, c in enumerate(order)}
    chosen: set[int] = set()
    for i, c in enumerate(categories):
        if quota.get(c, 0) > 0:
            chosen.add(i)
            quota[c] -= 1
    for i in range(len(categories)):
        if len(chosen) >= n:
            break
        chosen.add(i)
    return chosen


def _prompts(cfg: DataConfig, out: Path, raw_jobs: list[Job], texts: dict[str, dict[str, Any]]) -> list[dict]:
    """The prompts file: made once from the raw shards (a resume reads it, so answers stay keyed to it)."""
    path = out / "prompts.jsonl"
    if path.is_file():
        return read_lines(path)
    raw = [r for job in raw_jobs for r in read_lines(job.path)]
    prompts, rejected = select(cfg, raw, texts)
    write_atomic(out / "rejected.jsonl", rejected)
    write_atomic(path, prompts)
    return prompts


def _answer_jobs(cfg: DataConfig, out: Path, prompts: list[dict[str, Any]]) -> list[Job]:
    """The answers stage's shards: every prompt's, or those of the first ``answer_prompts`` (:func:`answer_shards`)."""
    items = [{k: p[k] for k in ("id", "split", "category", "source", "prompt")} for p in prompts]
    jobs = _shards("answers", out / "answers", items, cfg.shard_size, 1 + cfg.samples)
    return jobs[:answer_shards(len(prompts), _doc(cfg))]


def generate(cfg: DataConfig, out: Path, workers: int = 2, resume: bool = False, force: bool = False,
             quiet: bool = False) -> dict[str, Any]:
    """Run every stage (resuming a folder with ``resume``); returns the summary (also in ``summary.json``).

    Raises:
        SpecgymError: A bad configuration, an output folder that cannot be used (:func:`open_output`), too few
            passages for the plan, a worker's failure.
    """
    cfg.check()
    if workers < 1:
        raise SpecgymError(f"--workers {workers}: must be >= 1")
    out = Path(out)
    check_output_folder(out, cfg, resume, force)
    cached = out / "passages" / "stdlib.jsonl"
    resumed = resume and cached.is_file()
    stdlib = [Passage(**d) for d in read_lines(cached)] if resumed else stdlib_passages(cfg.stdlib_subdir)
    _plan(cfg, stdlib)  # too few passages for the plan: refused before the folder is touched
    open_output(out, cfg, resume, force)
    t0 = time.perf_counter()
    if not resumed:
        write_atomic(cached, [asdict(p) for p in stdlib])
    seeds, passage_ids = _plan(cfg, stdlib)
    local, pool, stats = _Local(cfg), _Pool(cfg, workers), {}
    try:
        n_target = sum(1 for p in passage_ids if p.startswith("target:"))
        items = [{"id": i, "request": r} for i, r in target_requests(n_target, cfg.seed)]
        stats["passages"] = run_shards(cfg, out, _shards("passages", out / "passages", items, cfg.shard_size),
                                       "passages", local, pool, quiet)
        texts = _passage_texts(out, stdlib)
        raw_jobs = _prompt_jobs(cfg, out, seeds, texts)
        stats["prompts"] = run_shards(cfg, out, raw_jobs, "user turns", local, pool, quiet)
        prompts = _prompts(cfg, out, raw_jobs, texts)
        stats["answers"] = run_shards(cfg, out, _answer_jobs(cfg, out, prompts), "answers", local, pool, quiet)
    finally:
        pool.close()
    summary = summarize(cfg, out, prompts, stats, time.perf_counter() - t0, workers)
    write_atomic(out / "summary.json", [summary], as_lines=False)
    return summary


def summarize(cfg: DataConfig, out: Path, prompts: list[dict[str, Any]], stats: dict[str, dict[str, Any]],
              wall_s: float, workers: int) -> dict[str, Any]:
    """The run in figures: prompts and answer tokens per category and per split, sources, rejects by reason, the
    passages' licenses, and per stage this run's tokens, wall time and tokens/s beside every shard's (``log.jsonl``:
    earlier runs of a resumed folder included) tokens per CPU-second of one worker."""
    cats: dict[str, dict[str, int]] = {c: {"prompts": 0, "answer_tokens": 0} for c in cfg.categories}
    splits: dict[str, dict[str, Any]] = {}
    for p in prompts:
        cats.setdefault(p["category"], {"prompts": 0, "answer_tokens": 0})["prompts"] += 1
        sp = splits.setdefault(p["split"], {"prompts": 0, "answer_tokens": 0, "sources": set()})
        sp["prompts"] += 1
        sp["sources"].add(p["source"])
    modes = {"greedy": 0, "sampled": 0}
    stops = {"eos": 0, "length": 0}
    for f in sorted((out / "answers").glob("*.jsonl")):
        for a in read_lines(f):
            modes[a["mode"]] += a["tokens"]
            stops[a["stop"]] += 1
            cats[a["category"]]["answer_tokens"] += a["tokens"]
            splits[a["split"]]["answer_tokens"] += a["tokens"]
    sizes: dict[str, int] = {}
    for p in prompts:
        sizes[p["source"]] = sizes.get(p["source"], 0) + 1
    rejected = read_lines(out / "rejected.jsonl") if (out / "rejected.jsonl").is_file() else []
    reasons: dict[str, int] = {}
    for r in rejected:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    licenses: dict[str, int] = {}
    for p in prompts:
        if p["passage"] is not None:
            licenses[p["license"]["passage"]] = licenses.get(p["license"]["passage"], 0) + 1
    answered = sum(len(job.items) for job in _answer_jobs(cfg, out, prompts))
    return {"folder": str(out), "target": cfg.target, "prompts": len(prompts), "asked": cfg.prompts,
            "answered_prompts": answered,
            "answer_tokens": {**modes, "total": sum(modes.values())}, "answers_stopped": stops,
            "per_category": cats, "per_split": {k: {**v, "sources": len(v["sources"])} for k, v in splits.items()},
            "sources": len(sizes), "largest_source": max(sizes.values(), default=0), "rejected": reasons,
            "passage_prompts_by_license": licenses, "request_license": TARGET_LICENSE,
            "stdlib_license": f"{STDLIB_LICENSE} (Python {'.'.join(map(str, sys.version_info[:3]))})",
            "stages": _stage_figures(out, stats), "workers": workers, "wall_s": round(wall_s, 1),
            "config": _doc(cfg)}


def _stage_figures(out: Path, stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per stage: this run's shards, tokens, wall time and tokens/s; all shards' tokens and CPU seconds."""
    log = read_lines(out / "log.jsonl") if (out / "log.jsonl").is_file() else []
    figures = {}
    for stage, st in stats.items():
        recs = [r for r in log if r["stage"] == stage]
        cpu = sum(r["cpu_s"] for r in recs)
        tokens, wall = sum(r["tokens"] for r in recs), sum(r["wall_s"] for r in recs)
        figures[stage] = {**st, "tokens_per_s": round(st["tokens"] / st["wall_s"], 1) if st["wall_s"] else None,
                          "all_shards_tokens": tokens, "all_shards_worker_s": round(wall, 1),
                          "all_shards_cpu_s": round(cpu, 1),
                          "tokens_per_worker_s": round(tokens / wall, 1) if wall else None,
                          "tokens_per_cpu_s": round(tokens / cpu, 1) if cpu else None}
    return figures


def format_summary(s: dict[str, Any]) -> str:
    """The summary as a few lines of text (the command prints it; ``summary.json`` holds all of it)."""
    lines = [f"{s['folder']}: {s['prompts']:,} prompts (asked {s['asked']:,}), {s['sources']:,} sources (largest "
             f"{s['largest_source']}), {s.get('answered_prompts', s['prompts']):,} answered: "
             f"{s['answer_tokens']['total']:,} answer tokens (greedy "
             f"{s['answer_tokens']['greedy']:,}, sampled {s['answer_tokens']['sampled']:,}); {s['wall_s']:.0f} s "
             f"with {s['workers']} worker(s)"]
    lines.append("per split: " + ", ".join(f"{k} {v['prompts']} prompts / {v['sources']} sources / "
                                           f"{v['answer_tokens']:,} tokens" for k, v in sorted(s["per_split"].items())))
    lines.append("per category: " + ", ".join(f"{k} {v['prompts']} ({v['answer_tokens']:,} tok)"
                                              for k, v in s["per_category"].items()))
    lines.append("rejected: " + (", ".join(f"{k} {v}" for k, v in sorted(s["rejected"].items())) or "none"))
    for stage, f in s["stages"].items():
        rate = f"{f['tokens_per_s']} tok/s" if f["tokens_per_s"] is not None else "nothing left to do"
        lines.append(f"{stage}: this run {f['shards']} shards, {f['tokens']:,} tokens, {f['wall_s']:.0f} s, {rate}; "
                     f"all shards {f['all_shards_tokens']:,} tokens, {f['tokens_per_worker_s']} tok/s per worker, "
                     f"{f['tokens_per_cpu_s']} tok per CPU-second")
    return "\n".join(lines)
