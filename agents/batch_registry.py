"""Batch controller specs: the strings the CLI and the batch evaluation use to name a batch controller.

The batch counterpart of :mod:`specgym.agents.registry`: the rules of :mod:`specgym.baselines.batch_rules`,
a single-request controller per sequence (``per-seq:SPEC``) or an exported batch policy (``ppo:NAME``).
"""

from __future__ import annotations

from specgym.agents.batch_policy import BatchPolicyController
from specgym.agents.registry import make_controller
from specgym.baselines.batch_rules import BatchSizeTable, GoodputRule, PerSequence, StaticK
from specgym.envs.core.batch import BatchController
from specgym.errors import SpecgymError


def make_batch_controller(spec: str, k_max: int = 8) -> BatchController:
    """A batch controller from a spec: ``static:K``, ``table:JSON|FILE``, ``goodput``, ``per-seq:SPEC``, or a
    single-request spec (``ppo:NAME`` for a batch policy, see :mod:`specgym.agents.batch_policy`)."""
    name, _, arg = spec.partition(":")
    if name == "static":
        if not arg.isdigit() or int(arg) > k_max:
            raise SpecgymError(f"bad batch controller {spec!r}: static needs K in 0..{k_max}")
        return StaticK(int(arg))
    if name == "table":
        return BatchSizeTable.parse(arg)
    if name == "goodput" and not arg:
        return GoodputRule()
    if name == "per-seq" and arg:
        make_controller(arg, k_max)  # validate now
        return PerSequence(lambda: make_controller(arg, k_max), f"per-seq:{arg}")
    if name == "ppo" and arg:
        return BatchPolicyController.from_spec(arg)
    raise SpecgymError(f"bad batch controller {spec!r}; valid: static:K, table:[[start,end,K],...]|FILE, goodput, "
                       f"per-seq:SPEC, ppo:NAME|DIR")
