"""Speed benchmarks that print figures against the project's targets (``specgym bench``).

Every section is a function ``section(args, workload, console) -> figures`` in the module next to this one that
measures that part of the project; :data:`SECTIONS` names them. A missed target is reported, never hidden.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: section name -> "module:function" (imported only when the section runs: some need torch).
SECTIONS: dict[str, str] = {
    "load": "specgym.eval.bench.replay:load_section",
    "env": "specgym.eval.bench.replay:env_section",
    "vector": "specgym.eval.bench.replay:vector_section",
    "controllers": "specgym.eval.bench.controllers:controllers_section",
    "eval": "specgym.eval.bench.controllers:eval_section",
    "policy": "specgym.eval.bench.policy:policy_section",
    "live": "specgym.eval.bench.live:live_section",
    "batch": "specgym.eval.bench.batch:batch_section",
    "serving": "specgym.eval.bench.serving:serving_section",
    "predictor": "specgym.eval.bench.predictor:predictor_section",
    "tree": "specgym.eval.bench.tree:tree_section",
    "scale": "specgym.eval.bench.scale:scale_section",
    "specdecode-bench": "specgym.eval.bench.specdecode:specdecode_bench_section",
    "specdecode-eval": "specgym.eval.bench.specdecode:specdecode_eval_section",
    "vllm": "specgym.eval.bench.vllm:vllm_section",
    "guard": "specgym.eval.bench.guard:guard_section",
    "families": "specgym.eval.bench.families:families_section",
    "draft-vocab": "specgym.eval.bench.draft_vocab:draft_vocab_section",
}
DEFAULT_SECTIONS = ("load", "env", "vector", "controllers", "eval", "policy", "batch", "predictor", "tree")


def section(name: str) -> Callable[[Any, str, Any], dict[str, Any]]:
    """The function of one section."""
    module, func = SECTIONS[name].split(":")
    return getattr(importlib.import_module(module), func)
