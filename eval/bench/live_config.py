"""What one live bench is asked to do (:class:`LiveBenchConfig`), checked in one place before anything loads, and the
controller rows it runs by default (:func:`controller_specs`).

The bench itself runs in phases over this config (:mod:`specgym.eval.bench.live`): measure
(:mod:`~specgym.eval.bench.live_measure`), predict (:mod:`~specgym.eval.bench.live_predict`) and report
(:mod:`~specgym.eval.bench.live_report`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgym.agents.artifact import list_policies
from specgym.agents.specs import EVAL_KINDS, Traits, all_specs, build, expand, row_of, usage_line
from specgym.envs.core.kinds import kind_row
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.live.pairs import PairFlags, check_pair_choice
from specgym.envs.profiles import load_profile
from specgym.errors import SpecgymError

#: Defaults sized for about +-2% intervals in ~15 minutes on a 2-core CI-class machine
#: (see docs/results/live-midpair.md).
DEFAULT_PER_CATEGORY = 10
DEFAULT_REPEATS = 3
DEFAULT_CALIBRATION_PROMPTS = 3  # per category, from the train split
#: How the bench's messages name the pair's options (``pair_name`` is an argument of the API only).
BENCH_FLAGS = PairFlags(pair="pair_name")
#: The counts that must be at least 1: field -> how a message names it (its flag, where ``bench live`` has one).
_COUNTS = {"per_category": "per_category (--prompts)", "repeats": "repeats (--repeats)", "threads": "threads",
           "calibration_prompts": "calibration_prompts", "micro_repeats": "micro_repeats"}


def _policies() -> list[str]:
    return [f"ppo:{p}" for p in list_policies(kind="chain")]


def controller_specs(traits: Traits, k_fixed: int = 6) -> list[str]:
    """What the default live bench runs: plain decoding, fixed K = 1..``k_fixed``, the live-capable rows of
    ``all`` for the workload (every baseline, its pair's predictor rows, the tree rows on a greedy trace with ranks)
    and every shipped chain policy."""
    chain, _ = all_specs(traits, DEFAULT_K_MAX, ("chain",), live=True)
    trees, _ = all_specs(traits, DEFAULT_K_MAX, ("tree",), live=True)
    fixed = [f"fixed:{k}" for k in range(1, k_fixed + 1)]
    return ["fixed:0", *fixed, *(s for s in chain if row_of(s, ("chain",)).family != "fixed"),
            *_policies(), *trees]


def fixed_draft_cap(spec: str) -> bool:
    """A fixed draft cap (``fixed:K`` of one drafter or of the default one): a fixed row that is not a tree shape."""
    row = row_of(spec)
    return row.family == "fixed" and not kind_row(row.kind).drafts_trees


def check_live_specs(specs: str) -> list[str]:
    """Validate a comma-separated ``bench live --controllers`` list (chain and tree specs): each must name a row a live
    engine can run, and build; returns the specs."""
    items, _ = expand(specs, DEFAULT_K_MAX, Traits.anything(), EVAL_KINDS, live=True)
    for x in items:
        row = build(x)
        if kind_row(row.kind).drafts_trees and row.controller is not None:
            row.controller.check_live()  # a controller's own reason first
        if not row.entry.live:
            raise SpecgymError(f"{x}: replay only ({row.entry.usage}); the live bench runs: "
                               f"{usage_line(EVAL_KINDS, live=True).removeprefix('valid: ')}")
    return items


@dataclass(frozen=True)
class LiveBenchConfig:
    """One live bench's options, checked once when made (:meth:`__post_init__`: one line naming the field).

    Attributes:
        pair_name: Shipped pair (default: the pair ``workload`` was recorded from, else the default pair).
        workload: Workload recorded from the pair (default ``PAIR-greedy``).
        per_category: Test prompts per category (``--prompts``).
        repeats: Times each (prompt, controller) runs; a prompt's time is the median.
        specs: Controller specs (default: plain, fixed K = 1..6, every baseline and shipped policy); a list or a
            comma-separated string, kept expanded (``all``) and checked: every row must run live.
        threads: torch threads.
        max_new_tokens: Completion length (default: each request's recorded length).
        profile: Cost profile name or path; ``None`` = fit one to the engine's rounds on this machine now.
        calibration_prompts: Train-split prompts per category for the fit.
        resamples: Bootstrap resamples of the paired intervals.
        hf_generate: Also time transformers' ``generate()`` plain and assisted.
        micro_repeats: Timed calls per figure of the micro-benchmarked profile.
        draft: A user's draft (model folder or hub name), with ``target``, instead of the pair the workload names.
        target: A user's target, with ``draft``.
        device: Where the pair runs (``cpu``, ``cuda``, ``cuda:1`` ...; rounds are timed device-synchronised).
    """

    pair_name: str | None = None
    workload: str | None = None
    per_category: int = DEFAULT_PER_CATEGORY
    repeats: int = DEFAULT_REPEATS
    specs: tuple[str, ...] | None = None
    threads: int = 1
    max_new_tokens: int | None = None
    profile: str | None = None
    calibration_prompts: int = DEFAULT_CALIBRATION_PROMPTS
    resamples: int = 2000
    hf_generate: bool = True
    micro_repeats: int = 40
    draft: str | None = None
    target: str | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        """Check every field before anything loads or calibrates (a replay-only controller first)."""
        if self.specs is not None:
            given = self.specs if isinstance(self.specs, str) else ",".join(self.specs)
            object.__setattr__(self, "specs", tuple(check_live_specs(given)))
        for field, label in _COUNTS.items():
            _count(getattr(self, field), label)
        if self.max_new_tokens is not None:
            _count(self.max_new_tokens, "max_new_tokens")
        _count(self.resamples, "resamples", least=0)  # 0: no intervals
        if not isinstance(self.device, str) or not self.device.startswith(("cpu", "cuda")):
            raise SpecgymError(f"--device {self.device!r}: expected cpu, cuda or cuda:N")
        check_pair_choice(self.pair_name, self.draft, self.target, BENCH_FLAGS)
        if self.profile is not None:
            load_profile(self.profile)  # a bad name or file fails before anything runs


def _count(value: Any, label: str, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SpecgymError(f"live bench: {label} must be an integer >= {least}, got {value!r}")


def live_config(args: Any, workload: str) -> LiveBenchConfig:
    """The config of ``specgym bench live`` (its ``--prompts``, ``--repeats``, ``--controllers``, ``--profile``,
    ``--draft``/``--target`` and ``--device``) on ``workload``."""
    return LiveBenchConfig(workload=workload, repeats=getattr(args, "live_repeats", DEFAULT_REPEATS),
                           per_category=getattr(args, "live_prompts", DEFAULT_PER_CATEGORY),
                           profile=getattr(args, "live_profile", None),
                           specs=getattr(args, "live_controllers", None) or None,
                           draft=getattr(args, "live_draft", None), target=getattr(args, "live_target", None),
                           device=getattr(args, "live_device", None) or "cpu")
