"""Distributed recording on Ray (``specgym record --workers N``): N actors, each loading the pair once.

The prompts are cut into consecutive shards (a multiple of the trace batch each, so that every teacher-forced batch
holds the same requests as in a single-process recording). Each Ray actor loads the pair once (one GPU per actor
where CUDA is used, else one CPU and one torch thread) and records whole shards with the single-process recorder
(:func:`~specgym.envs.engines.live.recorder.record_workload`) into a scratch file on its node (with that recorder's
request-level partial file), then returns the shard's Parquet bytes through Ray, and the driver writes the shard
atomically into the work folder ``<out>.shards/``: the nodes of a cluster need no shared file system.

* A crashed or killed actor (the process dies: ``RayActorError``) is replaced by a fresh one and its shard is
  retried (``max_retries`` times); on the same node the retry resumes from the requests the dead actor had finished
  (its partial file in the node's temporary folder), elsewhere it records the shard again.
* An interrupted run (Ctrl-C, a lost driver) resumes by shard: re-running the same command skips the finished shards
  (the work folder's ``plan.json`` holds the settings and the shards' request ids; different settings are refused).
* When every shard is there, the driver assembles the workload exactly as the single-process recorder does
  (:func:`~specgym.envs.engines.live.recorder.assemble_recording`: requests in prompt order, splits drawn over all of
  them) and writes it atomically; the work folder is then removed.

Why the result is identical to a single-process recording: a request's completion length, sampling seed and trace
seed are functions of (seed, request id) only (:func:`~specgym.envs.engines.live.recorder.request_length`,
:meth:`~specgym.envs.engines.live.recorder.Recorder.generate`), never of the worker or of the request's position, and
the
trace batches hold the same requests. Floating point is identical when the workers run the same device, dtype,
thread count and linear kernels as the reference (tested here: CPU, one thread each, ``--no-fast-kernels``: the fast
kernels are picked by timing at load (:mod:`~specgym.envs.engines.live.fast_linear`), so two recordings, even two
single-process ones, may differ by float rounding in the float columns unless the kernels are fixed).

Ray is the optional extra ``specgym[distributed]``; without it :func:`record_distributed` fails with one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specgym.envs.core.kinds import HEAD_DRAFTER, NGRAM_DRAFTER
from specgym.envs.engines.live.model_loading import load_pair
from specgym.envs.engines.live.recorder import RecordingSpec, assemble_recording, record_workload, save_recording
from specgym.envs.workloads.prompts import PromptSpec, splits_named
from specgym.envs.workloads.trace_format import Workload, load_workload
from specgym.errors import SpecgymError
from specgym.io import atomic_write_bytes, check_output, foreign_entry, make_owned_dir, sha256_file
from specgym.paths import portable_name

WORK_SUFFIX = ".shards"
PLAN = "plan.json"
_WORK_FILES = (PLAN, "shard-*.parquet")


def require_ray() -> Any:
    """The ``ray`` module, or a one-line error naming the extra."""
    try:
        import ray
    except ImportError:
        raise SpecgymError("--workers needs Ray: pip install 'specgym[distributed]'") from None
    return ray


#: How long a connection to an existing cluster (``--ray-address``) may take before it is refused.
CONNECT_TIMEOUT_S = float(os.environ.get("SPECGYM_RAY_CONNECT_TIMEOUT_S", "30"))
#: The environment variable that marks every process of a local cluster this process started (inherited by Ray's
#: GCS, raylet, agents and workers), so that the reaper can end them whatever way this process ends.
SESSION_ENV = "SPECGYM_RAY_SESSION"

_PROBE = """
import os, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False, logging_level="ERROR")
print(int(ray.cluster_resources().get("CPU", 0)))
ray.shutdown()
"""

#: The reaper (a separate process, in its own session): it waits until this process closes the pipe — when it
#: exits, is interrupted or is killed outright (SIGKILL) — then ends every process carrying the session's mark
#: (SIGTERM, SIGKILL after 10 s), until none has been seen for 5 s: a raylet being ended can still start an agent.
_REAPER = """
import os, select, signal, sys, time
token = sys.argv[1]
me = os.getpid()
def table():
    # pid -> (parent pid, start time, marked); a Ray agent rewrites its title over its environment, so it is
    # found as a child of a marked process, not by its own mark
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{name}/environ", "rb") as f:
                mark = token.encode() in f.read().split(b"\\0")
        except (OSError, IndexError):
            continue
        out[int(name)] = (int(fields[1]), fields[19], mark)
    return out
known = {}  # pid -> start time of every process of the cluster seen so far
def track():
    procs = table()
    for pid in [pid for pid, t in known.items() if pid not in procs or procs[pid][1] != t]:
        del known[pid]  # gone, or its pid reused
    known.update({pid: p[1] for pid, p in procs.items() if p[2]})
    grew = True
    while grew:  # children of the cluster's processes (agents, workers) belong to it
        grew = False
        for pid, (ppid, t, _) in procs.items():
            if ppid in known and pid not in known:
                known[pid] = t
                grew = True
while True:  # until EOF: the process that started the cluster is gone (or done)
    if select.select([0], [], [], 1.0)[0] and not os.read(0, 65536):
        break
    track()  # while the cluster runs: its agents are known before a dying raylet leaves them orphans
start = time.monotonic()
sig = signal.SIGTERM
quiet_since = None
while time.monotonic() - start < 120.0:
    track()
    now = time.monotonic()
    if not known:  # a dying raylet can still start an agent: done only after 5 s with nothing left
        quiet_since = quiet_since or now
        if now - quiet_since > 5.0:
            break
    else:
        quiet_since = None
    for pid in known:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    time.sleep(0.2)
    if now - start > 10.0:
        sig = signal.SIGKILL
"""

_reaper: dict[str, Any] = {}


def _check_address(address: str) -> None:
    """Refuse an unreachable cluster address within :data:`CONNECT_TIMEOUT_S` (``ray.init`` retries forever)."""

    where = f"the Ray cluster at {address}"
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if address != "auto" and "://" not in address:
        if not host or not port.isdigit():
            raise SpecgymError(f"--ray-address {address!r}: expected HOST:PORT (the head's GCS address), ray://HOST:"
                               f"PORT or auto")
        try:
            socket.create_connection((host, int(port)), timeout=min(5.0, CONNECT_TIMEOUT_S)).close()
        except OSError as exc:
            raise SpecgymError(f"cannot reach {where}: {exc.strerror or exc} (is a Ray head running there? "
                               f"ray start --head)") from None
    try:  # a real connection, in a child process that can be ended (a port that is not Ray's GCS never answers)
        proc = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True, text=True,
                              timeout=CONNECT_TIMEOUT_S, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise SpecgymError(f"{where} did not answer within {CONNECT_TIMEOUT_S:g} s (not a Ray head's GCS port? "
                           f"SPECGYM_RAY_CONNECT_TIMEOUT_S sets the limit)") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or "").splitlines() if ln.strip()]
        raise SpecgymError(f"cannot connect to {where}: {lines[-1] if lines else f'exit {proc.returncode}'}")


def _start_reaper() -> None:
    """Mark this process's environment (inherited by the cluster it starts) and start the reaper (Linux)."""

    if not os.path.isdir("/proc"):
        return
    token = f"{SESSION_ENV}=" + secrets.token_hex(8)
    read, write = os.pipe()  # not inherited by Ray's processes (close-on-exec): only this process holds `write`
    proc = subprocess.Popen([sys.executable, "-c", _REAPER, token], stdin=read, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(read)
    os.environ[SESSION_ENV] = token.split("=", 1)[1]
    _reaper.update(proc=proc, pipe=write)


def stop_ray() -> None:
    """Shut down the local cluster :func:`start_ray` started, then let the reaper end any process it left."""
    ray = require_ray()
    try:
        ray.shutdown()
    finally:
        os.environ.pop(SESSION_ENV, None)
        if "pipe" in _reaper:
            os.close(_reaper.pop("pipe"))
            try:
                _reaper.pop("proc").wait(timeout=15)
            except Exception:  # noqa: BLE001 - the reaper finishes on its own
                pass


def start_ray(workers: int, address: str | None = None, gpus: bool = False) -> bool:
    """Connect to a Ray cluster (``address``, else ``RAY_ADDRESS``), or start a local one sized for ``workers``.

    A local cluster runs on the loopback interface only, without the dashboard or usage reporting (so it works in a
    sandbox without network), and its processes end with this one however it ends (:func:`stop_ray` on every
    normal or interrupted exit; a reaper process when this one is killed outright). Connecting to an existing
    cluster is bounded by :data:`CONNECT_TIMEOUT_S`. Returns True when this call started Ray (the caller stops it
    with :func:`stop_ray`).
    """
    ray = require_ray()
    if ray.is_initialized():
        if address:  # an address the caller named is checked even so (the connection in place is kept)
            _check_address(address)
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _check_address(address)
    else:
        _start_reaper()
    try:
        if address:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(num_cpus=workers, num_gpus=None if gpus else 0, include_dashboard=False,
                     log_to_driver=False, configure_logging=False, _node_ip_address="127.0.0.1",
                     object_store_memory=128 * 1024 * 1024)
    except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError... for a bad cluster
        stop_ray()
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise SpecgymError(f"cannot start {where}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return True


class ShardRecorder:
    """The body of one Ray actor: the pair, loaded once; records whole shards (see the module docstring)."""

    def __init__(self, load_kwargs: dict[str, Any], threads: int = 1):
        import torch

        if not str(load_kwargs.get("device") or "").startswith("cuda"):
            torch.set_num_threads(int(threads))
        self.pair = load_pair(**load_kwargs)

    def ready(self) -> int:
        """The actor's process id (once the pair is loaded)."""
        return os.getpid()

    def record(self, prompts: list[dict[str, Any]], scratch: str, spec: RecordingSpec,
               fault_after: int | None = None) -> tuple[dict[str, Any], bytes]:
        """Record one shard; returns the shard's stats and its Parquet bytes (the driver writes them, so the nodes
        need no shared file system).

        The shard is recorded into ``scratch`` on this node (relative to its temporary folder), resuming from the
        partial file a dead actor on the same node left there.

        Args:
            fault_after: Test hook: the process dies (``os._exit``) once this many of the shard's requests are done,
                as a killed or crashed worker would.
        """
        specs = [PromptSpec(**p) for p in prompts]
        path = Path(tempfile.gettempdir()) / scratch
        path.parent.mkdir(parents=True, exist_ok=True)
        progress = None
        if fault_after is not None:
            def progress(i: int, n: int) -> None:
                if i >= fault_after:
                    os._exit(1)
        _, stats = record_workload(self.pair, specs, path, spec, overwrite=True, progress=progress)
        data = path.read_bytes()
        path.unlink()
        return {k: v for k, v in stats.items() if isinstance(v, (int, float))}, data


def plan_shards(n: int, workers: int, batch: int, shard_requests: int | None = None) -> list[tuple[int, int]]:
    """``(lo, hi)`` prompt ranges of the shards: ``shard_requests`` each (default: about four shards per worker),
    rounded up to a multiple of ``batch`` (the trace batches of a shard are then the single-process ones)."""
    size = shard_requests or max(1, math.ceil(n / (4 * workers)))
    size = max(batch, math.ceil(size / batch) * batch)
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def _shard_file(i: int) -> str:
    return f"shard-{i:05d}.parquet"


def _open_work_dir(work: Path, plan: dict[str, Any], restart: bool) -> None:
    """Create the work folder with its plan, or check that an existing one holds the same plan (resume)."""
    check_output(work, True, "dir", "--out's shard folder")
    if work.exists():
        foreign = foreign_entry(work)
        if foreign is not None:
            raise SpecgymError(f"{work}: holds {foreign}, not written by specgym record; move it away")
        if restart:
            shutil.rmtree(work)
        else:
            try:
                old = json.loads((work / PLAN).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raise SpecgymError(f"{work / PLAN}: unreadable; delete {work} (or pass --restart)") from None
            if old != plan:
                raise SpecgymError(f"{work}: an interrupted distributed recording with different settings exists; "
                                   f"delete it (or pass --restart)")
            return
    make_owned_dir(work, "specgym record --workers", _WORK_FILES)
    (work / PLAN).write_text(json.dumps(plan) + "\n", encoding="utf-8")


def _requests_of(wl: Workload) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """A recorded shard back as the recorder's per-request dicts (without split; with the n-gram drafter's and the
    draft head's runs where the recording has them) and completions."""
    cols = (*wl.position_names, *wl.signal_names)
    reqs, completions = [], []
    for r in range(wl.n_requests):
        sl = wl.span(r)
        d: dict[str, Any] = {"request_id": str(wl.request_id[r]), "category": str(wl.category[r]),
                             "temperature": float(wl.temperature[r]), "prompt_len": int(wl.prompt_len[r]),
                             "prompt_text": None if wl.prompt_text is None else wl.prompt_text[r]}
        d.update({c: getattr(wl, c)[sl] for c in cols})
        for name in (NGRAM_DRAFTER, HEAD_DRAFTER):  # the other drafters, as the recorder hands them
            if name in wl.runs:
                d[f"{name}_runs"] = wl.runs[name][sl].tolist()
        reqs.append(d)
        completions.append(wl.token_id[sl].tolist() if wl.token_id is not None else [])
    return reqs, completions


def _error_line(exc: BaseException) -> str:
    """The first useful line of a Ray error (the remote SpecgymError's message where there is one)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, SpecgymError):
        return str(cause)
    text = str(exc).strip().splitlines()
    lines = [ln.strip() for ln in text if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


def record_distributed(
    load_kwargs: dict[str, Any],
    prompts: Sequence[PromptSpec],
    out: str | Path,
    spec: RecordingSpec,
    workers: int,
    overwrite: bool = False,
    restart: bool = False,
    ray_address: str | None = None,
    shard_requests: int | None = None,
    max_retries: int = 2,
    progress: Callable[[int, int], None] | None = None,
    fault: tuple[int, int] | None = None,
) -> tuple[Workload, dict[str, Any]]:
    """Record every prompt with ``workers`` Ray actors; write the workload atomically (see the module docstring).

    Args:
        load_kwargs: :func:`~specgym.envs.engines.live.model_loading.load_pair` arguments (paths valid on every node).
        prompts: The prompts, in workload order.
        out: A ``.parquet`` file, or a sharded dataset folder.
        spec: What to record (every shard is recorded with it, as one process would).
        workers: Number of actors (each loads the pair once).
        overwrite: Replace an existing ``out``.
        restart: Start over instead of resuming from the finished shards.
        ray_address: An existing cluster (default ``RAY_ADDRESS``, else a local cluster of ``workers`` CPUs).
        shard_requests: Prompts per shard (rounded up to a multiple of ``batch``; default about 4 shards a worker).
        max_retries: Retries of a shard whose actor died.
        progress: ``progress(requests_done, requests_total)`` once the finished shards of an interrupted run are
            counted, then after each shard (e.g. to advance ``specgym record --workers``'s progress bar).
        fault: Test hook ``(shard, after)``: the actor recording ``shard`` dies after ``after`` of its requests, on
            the first attempt only.

    Returns:
        ``(workload, stats)``: as :func:`~specgym.envs.engines.live.recorder.record_workload`, plus ``shards``,
        ``shards_resumed``, ``retries``, ``workers``, ``startup_s`` (cluster start and pair loading) and
        ``record_s`` (recording after every actor was ready).
    """
    out = Path(out)
    if workers < 1:
        raise SpecgymError(f"--workers must be >= 1, got {workers}")
    if out.exists() and not overwrite:
        raise SpecgymError(f"{out}: already exists (pass --force to overwrite)")
    ray = require_ray()
    t_start = time.perf_counter()
    ranges = plan_shards(len(prompts), workers, spec.batch, shard_requests)
    plan = _plan(load_kwargs, prompts, spec, ranges)
    work = out.with_name(out.name + WORK_SUFFIX)
    # the nodes' scratch folder: one per plan and output (two recordings of one plan at once, e.g. parallel test
    # workers, never share partial shards)
    scratch = "specgym-record-" + hashlib.sha256(json.dumps({**plan, "out": str(out.resolve())},
                                                            sort_keys=True).encode()).hexdigest()[:16]
    # what each shard records: the spec without what only the driver writes (name, prompts file, extra metadata)
    shards = _Shards(ray, load_kwargs, prompts, ranges, work, scratch,
                     dataclasses.replace(spec, name=None, prompts_path=None, extra=None), max_retries, progress, fault)
    started = False
    if any(restart or not (work / _shard_file(i)).is_file() for i in range(len(ranges))):
        started = start_ray(workers, ray_address, shards.gpus)  # first: an unreachable cluster leaves nothing behind
    try:
        _open_work_dir(work, plan, restart)
        todo = deque(i for i in range(len(ranges)) if not (work / _shard_file(i)).is_file())
        resumed = len(ranges) - len(todo)
        if todo:
            shards.run(todo, workers)
    finally:  # every exit, Ctrl-C included (a SIGKILL is the reaper's: see start_ray)
        if started:
            stop_ray()
    if shards.error is not None:
        raise SpecgymError(f"{shards.error} (finished shards are kept in {work}; rerun to resume)")
    if shards.failed:
        raise SpecgymError(f"shard(s) {sorted(shards.failed)} failed {max_retries + 1} times (worker died); the "
                           f"finished shards are kept in {work}: rerun the same command to resume")
    wl, summary = _assemble_shards(work, ranges, prompts, spec, load_kwargs, out)
    save_recording(wl, out, overwrite, shard_requests=ranges[0][1] - ranges[0][0])
    shutil.rmtree(work)
    return wl, _stats(shards, prompts, time.perf_counter() - t_start, workers, resumed, summary)


def _plan(load_kwargs: dict[str, Any], prompts: Sequence[PromptSpec], spec: RecordingSpec,
          ranges: list[tuple[int, int]]) -> dict[str, Any]:
    """What the work folder's ``plan.json`` records: the settings and the shards' request ids (a resumed run must
    have the same)."""
    return {"draft": str(load_kwargs.get("draft")), "target": str(load_kwargs.get("target")),
            "temperature": spec.temperature, "max_new_tokens": spec.length_text, "seed": spec.seed,
            "gen_k": spec.gen_k, "batch": spec.batch, "hidden_sketch": spec.hidden_sketch, "format": 2,
            **({"stop_at_eos": True} if spec.stop_at_eos else {}),
            "prompts": sha256_file(spec.prompts_path)[:16] if spec.prompts_path else len(prompts),
            "shards": [[p.request_id for p in prompts[lo:hi]] for lo, hi in ranges]}


@dataclass
class _Shards:
    """The shards of one distributed recording and the loop that hands them to the actors (:meth:`run`): what came
    back, what died and what failed.

    Attributes:
        spec: What every shard records (the driver's spec without what only the driver writes).
        stats: Shard -> the stats its actor returned.
        retries: Shards given to a fresh actor after theirs died.
        failed: Shards whose actors died ``max_retries + 1`` times.
        error: The first error a shard raised (a bad prompt, a full disk: not retried).
        record_s: Seconds from every actor ready to the last shard back.
    """

    ray: Any
    load_kwargs: dict[str, Any]
    prompts: Sequence[PromptSpec]
    ranges: list[tuple[int, int]]
    work: Path
    scratch: str
    spec: RecordingSpec
    max_retries: int
    progress: Callable[[int, int], None] | None
    fault: tuple[int, int] | None
    stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    retries: int = 0
    failed: list[int] = field(default_factory=list)
    error: str | None = None
    record_s: float = 0.0
    attempts: dict[int, int] = field(default_factory=dict)
    inflight: dict[Any, tuple[Any, int]] = field(default_factory=dict)
    done: int = 0

    @property
    def gpus(self) -> bool:
        """One GPU per actor (a CUDA device), else one CPU."""
        return str(self.load_kwargs.get("device") or "").startswith("cuda")

    def run(self, todo: deque[int], workers: int) -> None:
        """Record the shards of ``todo`` on up to ``workers`` actors, each given the next shard as it hands one back;
        a shard whose actor died goes to a fresh actor (``max_retries`` times)."""
        self.done = sum(hi - lo for i, (lo, hi) in enumerate(self.ranges) if i not in todo)
        if self.progress is not None and self.done:
            self.progress(self.done, len(self.prompts))  # the finished shards of an interrupted run
        remote = self.ray.remote(num_cpus=0 if self.gpus else 1, num_gpus=1 if self.gpus else 0)(ShardRecorder)
        actors = [remote.remote(self.load_kwargs, 1) for _ in range(min(workers, len(todo)))]
        try:
            self.ray.get([a.ready.remote() for a in actors])
        except Exception as exc:
            raise SpecgymError(f"a Ray worker could not load the pair: {_error_line(exc)}") from None
        t_rec = time.perf_counter()
        for a in actors:
            if todo:
                self._submit(a, todo)
        while self.inflight:
            ready, _ = self.ray.wait(list(self.inflight), num_returns=1)
            actor = self._collect(ready[0], todo, remote)
            if todo and self.error is None:
                self._submit(actor, todo)
        self.record_s = time.perf_counter() - t_rec

    def _submit(self, actor: Any, todo: deque[int]) -> None:
        i = todo.popleft()
        self.attempts[i] = self.attempts.get(i, 0) + 1
        lo, hi = self.ranges[i]
        hook = self.fault[1] if self.fault is not None and self.fault[0] == i and self.attempts[i] == 1 else None
        fut = actor.record.remote([asdict(p) for p in self.prompts[lo:hi]], f"{self.scratch}/{_shard_file(i)}",
                                  self.spec, hook)
        self.inflight[fut] = (actor, i)

    def _collect(self, fut: Any, todo: deque[int], remote: Any) -> Any:
        """Write a finished shard into the work folder (or requeue it, or keep its error); returns the actor to give
        the next shard (a fresh one where this one died)."""
        actor, i = self.inflight.pop(fut)
        try:
            self.stats[i], data = self.ray.get(fut)
            atomic_write_bytes(self.work / _shard_file(i), data)
            self.done += self.ranges[i][1] - self.ranges[i][0]
            if self.progress is not None:
                self.progress(self.done, len(self.prompts))
        except self.ray.exceptions.RayActorError:  # the process died: a fresh actor, the shard again
            actor = remote.remote(self.load_kwargs, 1)
            if self.attempts[i] <= self.max_retries:
                self.retries += 1
                todo.appendleft(i)
            else:
                self.failed.append(i)
        except self.ray.exceptions.RayTaskError as exc:  # a bad prompt, a full disk: not retried
            self.error = self.error or _error_line(exc)
        return actor


def _assemble_shards(work: Path, ranges: list[tuple[int, int]], prompts: Sequence[PromptSpec], spec: RecordingSpec,
                     load_kwargs: dict[str, Any], out: Path) -> tuple[Workload, dict[str, Any]]:
    """The workload of every finished shard, assembled as the one-process recorder assembles its requests."""
    requests: list[dict[str, Any]] = []
    completions: list[list[int]] = []
    first: Workload | None = None
    by_id = {p.request_id: p.split for p in prompts} if splits_named(list(prompts)) else None
    for i in range(len(ranges)):
        wl = load_workload(work / _shard_file(i))
        first = first or wl
        r, c = _requests_of(wl)
        if by_id is not None:  # the prompts file's splits, as the one-process recorder keeps them
            r = [{**req, "split": by_id[req["request_id"]]} for req in r]
        requests += r
        completions += c
    assert first is not None
    prompts_path = spec.prompts_path
    source = {**first.source, "prompts": portable_name(prompts_path) if prompts_path else None,  # the driver's
              "draft_model": portable_name(load_kwargs["draft"]), "target_model": portable_name(load_kwargs["target"])}
    return assemble_recording(spec.name or out.stem, source, spec.profile, requests, completions, spec.seed,
                              spec.split_fractions, spec.extra, first.signal_meta)


def _stats(shards: _Shards, prompts: Sequence[PromptSpec], wall: float, workers: int, resumed: int,
           summary: dict[str, Any]) -> dict[str, Any]:
    """The recording's stats, summed over the shards recorded now (see :func:`record_distributed`)."""
    def total(key: str) -> float:
        return float(sum(s.get(key, 0.0) for s in shards.stats.values()))

    trace_s, positions = total("trace_s"), total("trace_positions")
    return {"requests": len(prompts), "resumed": int(sum(hi - lo for lo, hi in shards.ranges) - total("requests")
                                                     + total("resumed")),
            "wall_s": wall, "generate_s": total("generate_s"), "trace_s": trace_s,
            "trace_positions_per_s": positions / trace_s if trace_s > 0 else float("nan"),
            "end_to_end_positions_per_s": positions / wall if wall > 0 and positions else float("nan"),
            "shards": len(shards.ranges), "shards_resumed": resumed, "retries": shards.retries, "workers": workers,
            "record_s": shards.record_s, "startup_s": wall - shards.record_s, **summary}
