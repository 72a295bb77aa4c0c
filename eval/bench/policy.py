"""``specgym bench`` section ``policy``: decision overhead of the exported PPO controller (numpy only).

Measures, with the same loop as the baselines' section (:func:`specgym.eval.bench.controllers.decision_overhead_us`):
K mode ``propose() + observe()`` per round; token mode the same plus ``keep_drafting()`` per draft token (the
token-level decision). Target: <= 20 us per decision. With ``--policy DIR`` that artifact is timed; without it,
randomly initialised artifacts of the shipped default architecture (``training/configs/MODE.yaml``) are timed
and labelled so -- the cost depends on the architecture, not on the weights.
"""

from __future__ import annotations

from typing import Any

import yaml

from specgym.agents.artifact import PolicyArtifact, load_policy, random_artifact
from specgym.agents.modes import ROUND_POLICY_MODES
from specgym.agents.policy_controller import PolicyController
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.eval.bench.common import TARGETS, print_table
from specgym.eval.bench.controllers import decision_overhead_us, recorded_outcomes
from specgym.paths import TRAINING_CONFIGS_DIR


def _default_arch(mode: str) -> tuple[tuple[int, ...], str]:
    """``net_arch`` and activation of the shipped config's default entry (fallback 64x64 tanh)."""
    try:
        path = TRAINING_CONFIGS_DIR / f"{mode}.yaml"
        cfg = yaml.safe_load(path.read_text())["default"]
        return tuple(int(h) for h in cfg["net_arch"]), str(cfg.get("activation", "tanh"))
    except (OSError, KeyError, TypeError, ValueError):
        return (64, 64), "tanh"


def policy_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """Microseconds per decision of K-mode and token-mode policies (or of ``args.policy``)."""

    ctx, outcomes = recorded_outcomes(workload)
    arts: list[tuple[str, PolicyArtifact]] = []
    if getattr(args, "policy", None):
        art = load_policy(args.policy)
        arts.append((f"{args.policy} ({art.mode} mode)", art))
    else:
        for mode in ROUND_POLICY_MODES:
            arch, act = _default_arch(mode)
            arts.append((f"{mode} mode, random init {'x'.join(map(str, arch))} {act} (timing only)",
                         random_artifact(mode, k_max=DEFAULT_K_MAX, net_arch=arch, activation=act)))
    rows, figures = [], {}
    target = TARGETS["policy_us"]
    for label, art in arts:
        ctrl = PolicyController(art)
        f = decision_overhead_us(ctrl, ctx, outcomes)
        us = f["us_per_decision"]
        rows.append((f"{label}: propose + observe", f"{us:.2f} us",
                     f"<= {target:g} us ({'met' if us <= target else 'MISSED'})"))
        figures[f"policy_us/{art.mode}"] = us
        if "us_per_token_check" in f:
            tok = f["us_per_token_check"]
            rows.append((f"{label}: keep_drafting", f"{tok:.2f} us",
                         f"<= {target:g} us ({'met' if tok <= target else 'MISSED'})"))
            figures[f"policy_us/{art.mode}_token_check"] = tok
    print_table(console, "exported PPO policy overhead (numpy, per decision)", rows)
    return figures
