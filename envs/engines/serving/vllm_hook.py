"""specgym inside a vLLM engine: the per-step draft length, the admission limit, and a log of every step.

Where vLLM 0.32 decides the draft length (read in its sources; CPU and GPU share this path):

* ``Scheduler.schedule()`` (``vllm/v1/core/sched/scheduler.py``) sets ``SchedulerOutput.num_spec_tokens_to_schedule``
  once per step: ``num_speculative_tokens``, or with Dynamic SD (``num_speculative_tokens_per_batch_size``) the dense
  lookup ``self.dynamic_sd_lookup[batch_size]`` built by ``build_dynamic_sd_schedule_lookup``
  (``vllm/v1/spec_decode/dynamic/utils.py``);
* ``GPUModelRunner.propose_draft_token_ids()`` (``vllm/v1/worker/gpu_model_runner.py``, inherited unchanged by the
  CPU runner ``CPUModelRunner`` in ``vllm/v1/worker/cpu_model_runner.py``) passes it to the drafter as
  ``propose(num_speculative_tokens=...)`` (``SpecDecodeBaseProposer.propose`` in
  ``vllm/v1/spec_decode/llm_base_proposer.py``, the base of the ``draft_model`` proposer), which drafts that many
  tokens for every sequence; 0 still runs the drafter's first pass (its KV cache stays in sync) and returns none.

So the CPU path can vary K every step, one K for the whole batch. :class:`SchedulerHook` takes over exactly that
decision: it replaces ``dynamic_sd_lookup`` by an object whose ``[batch_size]`` asks a specgym
:class:`~specgym.envs.core.batch.BatchController` (or a fixed dense table: vLLM's own Dynamic SD, set at run time),
and feeds the controller one :class:`~specgym.envs.core.batch.BatchStep` per verified step. It also sets the
scheduler's admission limit ``max_num_active_reqs`` (a closed loop at a concurrency, or a schedule of concurrencies
over time, as :class:`~specgym.envs.engines.replay.batch_engine.BatchReplay` serves them) and logs every step (batch
size,
K, drafts, accepted, prefill tokens, wall-clock start and end in the engine-core process) and every request
(admission and finish times).

Timing: K decided at step ``t`` is drafted at the end of step ``t`` and verified at step ``t + 1``; the step's
``planned_k`` reported to the controller is what that step verified. A request's first step is its prefill: it
produces one token and verifies nothing.

Nothing here imports vLLM at module level; :func:`install` patches vLLM's classes (in the engine-core process; see
:mod:`specgym.agents.vllm_plugin`, the ``vllm.general_plugins`` entry point that calls it in every vLLM process).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specgym.envs.core.admission import AdmissionSchedule
from specgym.envs.core.batch import BatchController, BatchState, BatchStep
from specgym.errors import SpecgymError

#: What the hook needs to build a controller from a spec (injected by the plugin: the spec table lives above engines).
ControllerFactory = Callable[[str, int, "str | None"], BatchController]


@dataclass
class StepLog:
    """Every step of one run, as columns (what :meth:`SchedulerHook.take_log` returns, JSON-ready)."""

    start_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    k: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    produced: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    new_requests: list[int] = field(default_factory=list)
    decoding: list[int] = field(default_factory=list)
    limit: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    core_cpu_ms: list[float] = field(default_factory=list)
    admit_s: dict[str, float] = field(default_factory=dict)
    finish_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, dict) else list(v)) for k, v in self.__dict__.items()}


class _Lookup:
    """Stands in for the scheduler's ``dynamic_sd_lookup`` list: ``[batch_size]`` -> this step's K."""

    def __init__(self, hook: SchedulerHook, scheduler: Any):
        self.hook, self.scheduler = hook, scheduler

    def __getitem__(self, batch: int) -> int:
        return self.hook.decide(int(batch), len(self.scheduler.waiting))


class SchedulerHook:
    """specgym's state in one vLLM scheduler (one engine-core process).

    Args:
        num_spec_tokens: The engine's ``num_speculative_tokens`` (0: no speculation; K decisions are then ignored).
        factory: Builds a batch controller from ``(spec, k_max, profile)``.
    """

    def __init__(self, num_spec_tokens: int, factory: ControllerFactory | None = None):
        self.num_spec_tokens = int(num_spec_tokens)
        self.factory = factory
        self.controller: BatchController | None = None
        self.table: list[int] | None = None
        self.schedule: AdmissionSchedule | None = None
        self.log = StepLog()
        self._t0: float | None = None
        self._slot: dict[str, int] = {}
        self._free: list[int] = []
        self._new: list[int] = []
        self._pending: tuple[float, int, int, int, int, int, int] | None = None
        self._cpu = 0.0

    # ------------------------------------------------------------------------------------------ configuration
    def configure(self, policy: str | None = None, profile: str | None = None, table: Sequence[int] | None = None,
                  schedule: Sequence[Sequence[float]] | dict[str, Any] | None = None) -> dict[str, Any]:
        """Set the next run's draft-length policy and admission; clears the log.

        Args:
            policy: A batch controller spec (``goodput``, ``static:K``, ``table:[[...]]``, ``ppo:NAME``...), or None.
            profile: The batched cost profile (name or path) the controller prices steps with.
            table: Instead of a controller: a dense ``[K at batch 0, K at batch 1, ...]`` list (vLLM's own lookup).
            schedule: The admission limit over the run: ``[[duration_ms, concurrency], ...]`` (cycled), or the JSON
                form of an :class:`~specgym.envs.core.admission.AdmissionSchedule` (by time or by requests); None =
                no limit beyond the engine's ``max_num_seqs``.
        """
        if policy is not None and table is not None:
            raise ValueError("configure: give a policy or a table, not both")
        self.controller = None
        self.table = None if table is None else [int(k) for k in table]
        if policy is not None:
            if self.factory is None:
                raise ValueError("configure: no controller factory installed")
            self.controller = self.factory(policy, max(self.num_spec_tokens, 1), profile)  # reset by the factory
        try:
            self.schedule = None if schedule is None else AdmissionSchedule.of(schedule)
        except SpecgymError as exc:
            raise ValueError(f"configure: {exc}") from None
        self.log = StepLog()
        self._t0 = None
        self._slot, self._free, self._new = {}, [], []
        return {"policy": policy, "table": table is not None,
                "schedule": None if self.schedule is None else self.schedule.to_spec(),
                "num_spec_tokens": self.num_spec_tokens}

    @property
    def active(self) -> bool:
        """True when the hook decides K (a controller or a table is set, and the engine speculates)."""
        return self.num_spec_tokens > 0 and (self.controller is not None or self.table is not None)

    def limit(self, now: float, default: int, running: int = 0, waiting: int = 0) -> int:
        """The admission limit of the step starting at wall-clock ``now`` (a time schedule cycles from the run's
        first step; a schedule by requests admits each waiting request under its phase's concurrency)."""
        if self.schedule is None:
            return default
        elapsed_ms = (now - (self._t0 if self._t0 is not None else now)) * 1000.0
        if self.schedule.by == "time":
            return min(self.schedule.limit_at(elapsed_ms), default)
        return min(running + self.schedule.admissible(elapsed_ms, len(self.log.admit_s), running, waiting), default)

    # ------------------------------------------------------------------------------------------ one step
    def decide(self, batch: int, queue: int) -> int:
        """This step's K (called by vLLM through the lookup, with the step's batch size)."""
        k: int | np.ndarray
        if self.table is not None:
            k = self.table[min(batch, len(self.table) - 1)]
        elif self.controller is not None:
            slots = np.fromiter(self._slot.values(), dtype=np.int64, count=len(self._slot))
            new = np.asarray(self._new, dtype=np.int64)
            self._new = []
            limit = self._pending[1] if self._pending is not None else batch
            proposed = self.controller.propose(BatchState(batch, queue, limit, slots, new))
            if not isinstance(proposed, (int, np.integer)):
                raise ValueError(f"{self.controller.name}: vLLM drafts one K per step for the whole batch "
                                 "(SchedulerOutput.num_spec_tokens_to_schedule); per-sequence K is not supported")
            k = int(proposed)
        else:
            k = self.num_spec_tokens
        return int(min(max(int(k), 0), self.num_spec_tokens))

    def before_schedule(self, scheduler: Any, default_limit: int) -> None:
        """Stamp the step's start and set the admission limit."""
        now = time.perf_counter()
        if self._t0 is None and (scheduler.waiting or scheduler.running):
            self._t0 = now
        lim = self.limit(now, default_limit, len(scheduler.running), len(scheduler.waiting))
        scheduler.max_num_active_reqs = lim
        self._pending = (now, lim, len(scheduler.waiting), 0, 0, 0, 0)

    def after_schedule(self, output: Any) -> None:
        """Note the step's composition: new requests (prefills) and the K the step will draft."""
        if self._pending is None or not output.num_scheduled_tokens:
            self._pending = None
            return
        start, lim, queue, *_ = self._pending
        prefill = 0
        for req in output.scheduled_new_reqs:
            prefill += int(output.num_scheduled_tokens.get(req.req_id, 0))
            self.log.admit_s[req.req_id] = start
            slot = self._free.pop() if self._free else len(self._slot)  # slots in use or free: 0..M-1
            self._slot[req.req_id] = slot
            self._new.append(slot)
        k = int(getattr(output, "num_spec_tokens_to_schedule", 0) or 0)
        self._pending = (start, lim, queue, prefill, len(output.scheduled_new_reqs), k,
                         len(output.num_scheduled_tokens))

    def verified(self, output: Any, runner_output: Any) -> tuple[list[str], np.ndarray, np.ndarray] | None:
        """Per scheduled request: drafts verified and tokens generated (read before vLLM's ``update_from_output``,
        which trims the generated lists at a stop)."""
        if self._pending is None:
            return None
        sampled = runner_output.sampled_token_ids
        index = runner_output.req_id_to_index
        spec = output.scheduled_spec_decode_tokens
        ids = list(output.num_scheduled_tokens)
        drafts = np.array([len(spec.get(r, ())) for r in ids], dtype=np.int64)
        gen = np.array([len(sampled[index[r]]) if sampled and r in index else 0 for r in ids], dtype=np.int64)
        return ids, drafts, gen

    def add_cpu(self, seconds: float) -> None:
        """CPU time the engine core's thread spent in this step's ``schedule`` and ``update_from_output``."""
        self._cpu += seconds

    def after_update(self, verified: tuple[list[str], np.ndarray, np.ndarray] | None, finished: set[str]) -> None:
        """Log the verified step and show it to the controller."""
        cpu, self._cpu = self._cpu, 0.0
        if self._pending is None or verified is None:
            return
        start, lim, queue, prefill, new, k, batch = self._pending
        self._pending = None
        end = time.perf_counter()
        ids, drafts, gen = verified
        accepted = np.where(drafts > 0, np.maximum(gen - 1, 0), 0)
        done = [r for r in ids if r in finished]
        log = self.log
        log.start_s.append(start)
        log.end_s.append(end)
        log.batch.append(batch)
        log.queue.append(queue)
        log.k.append(k)
        log.drafts.append(int(drafts.sum()))
        log.accepted.append(int(accepted.sum()))
        log.produced.append(int(gen.sum()))
        log.prefill_tokens.append(prefill)
        log.new_requests.append(new)
        log.decoding.append(int((drafts > 0).sum()))
        log.limit.append(lim)
        log.finished.append(len(done))
        log.core_cpu_ms.append(cpu * 1000.0)
        for r in done:
            log.finish_s[r] = end
        if self.controller is not None:
            slots = np.array([self._slot.get(r, -1) for r in ids], dtype=np.int64)
            self.controller.observe(BatchStep(batch, queue, slots, drafts, accepted, int(gen.sum()),
                                              (end - start) * 1000.0, len(done)))
        for r in done:
            slot = self._slot.pop(r, None)
            if slot is not None:
                self._free.append(slot)

    def take_log(self) -> dict[str, Any]:
        """The log since :meth:`configure` (or the last call), JSON-ready; the log restarts empty."""
        out = self.log.to_dict()
        self.log = StepLog()
        return out


# ---------------------------------------------------------------------------------------------- vLLM patching
_INSTALLED: dict[str, Any] = {}


def install(factory: ControllerFactory | None = None) -> bool:
    """Patch vLLM's scheduler and engine core (idempotent); False when vLLM is not importable.

    Adds to ``EngineCore`` the utility methods ``specgym_configure(config)`` and ``specgym_take_log()`` (call them
    with ``LLM.llm_engine.engine_core.call_utility(name, *args)``), and wraps ``Scheduler.__init__``, ``schedule`` and
    ``update_from_output`` so that a :class:`SchedulerHook` sees every step.
    """
    if _INSTALLED:
        _INSTALLED["factory"] = factory or _INSTALLED.get("factory")
        return True
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.engine.core import EngineCore
    except ImportError:
        return False
    _INSTALLED["factory"] = factory
    init, schedule, update = Scheduler.__init__, Scheduler.schedule, Scheduler.update_from_output

    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._specgym = SchedulerHook(self.num_spec_tokens, _INSTALLED.get("factory"))
        self._specgym_lookup = self.dynamic_sd_lookup  # vLLM's own table, if configured
        self._specgym_limit = self.max_num_active_reqs
        startup = _INSTALLED.get("startup")
        if startup:
            self._specgym.configure(**startup)
        _apply(self)

    def patched_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook: SchedulerHook = self._specgym
        cpu = time.thread_time()
        hook.before_schedule(self, self._specgym_limit)
        out = schedule(self, *args, **kwargs)
        hook.after_schedule(out)
        hook.add_cpu(time.thread_time() - cpu)
        return out

    def patched_update(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        cpu = time.thread_time()
        verified = self._specgym.verified(scheduler_output, model_runner_output)
        result = update(self, scheduler_output, model_runner_output)
        self._specgym.add_cpu(time.thread_time() - cpu)
        self._specgym.after_update(verified, self.finished_req_ids)
        return result

    def specgym_configure(self: Any, config: dict) -> dict:
        out = self.scheduler._specgym.configure(**config)
        _apply(self.scheduler)
        return out

    def specgym_take_log(self: Any) -> dict:
        return self.scheduler._specgym.take_log()

    Scheduler.__init__ = patched_init
    Scheduler.schedule = patched_schedule
    Scheduler.update_from_output = patched_update
    EngineCore.specgym_configure = specgym_configure
    EngineCore.specgym_take_log = specgym_take_log
    _time_worker()
    return True


#: Worker process: CPU time of its thread per step that ran a forward (``execute_model`` + ``sample_tokens``).
WORKER_CPU_MS: list[float] = []


def _time_worker() -> None:
    """Time the worker's two calls per step in thread CPU time (one OMP thread: the compute is this thread's), so that
    a step's cost can be read without the time it waited for a CPU on a shared machine."""
    from vllm.v1.worker.gpu_worker import Worker

    execute, sample = Worker.execute_model, Worker.sample_tokens

    def timed_execute(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        out = execute(self, scheduler_output, *args, **kwargs)
        if scheduler_output.total_num_scheduled_tokens > 0:
            WORKER_CPU_MS.append((time.thread_time() - t) * 1000.0)
        return out

    def timed_sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        out = sample(self, *args, **kwargs)
        if WORKER_CPU_MS:
            WORKER_CPU_MS[-1] += (time.thread_time() - t) * 1000.0
        return out

    Worker.execute_model = timed_execute
    Worker.sample_tokens = timed_sample
    Worker.specgym_take_cpu = take_worker_cpu  # LLM.collective_rpc("specgym_take_cpu")
    Worker.specgym_proposer = proposer_rpc  # LLM.collective_rpc("specgym_proposer", args=(config,))


def take_worker_cpu(worker: Any = None) -> list[float]:
    """The worker's per-step CPU times since the last call (a method of the worker: ``LLM.collective_rpc(
    "specgym_take_cpu")``; vLLM sends method names, not functions, without insecure serialization)."""
    out = list(WORKER_CPU_MS)
    WORKER_CPU_MS.clear()
    return out


def proposer_rpc(worker: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The worker's custom proposer (``speculative_config`` method ``custom_class``), reconfigured between runs: its
    ``specgym_configure(config)`` (:class:`specgym.agents.vllm_proposer.SpecgymProposer`), which returns what it did
    since the last call. A method of the worker, as :func:`take_worker_cpu`."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if drafter is None or not callable(getattr(drafter, "specgym_configure", None)):
        raise ValueError(f"specgym_proposer: this engine's drafter ({type(drafter).__name__}) is not specgym's "
                         "proposer (speculative_config method custom_class, model "
                         "specgym.agents.vllm_proposer.SpecgymProposer)")
    return dict(drafter.specgym_configure(config))


def set_startup_config(config: dict[str, Any] | None) -> None:
    """What every scheduler created after this call configures itself with (``vllm serve`` with the plugin)."""
    _INSTALLED["startup"] = config


def _apply(scheduler: Any) -> None:
    """Point the scheduler's Dynamic SD lookup at the hook when the hook decides K, else back at vLLM's own."""
    hook: SchedulerHook = scheduler._specgym
    scheduler.dynamic_sd_lookup = _Lookup(hook, scheduler) if hook.active else scheduler._specgym_lookup
