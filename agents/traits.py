"""What a workload offers the controllers that read more than round outcomes: the ``needs`` of the spec table.

:class:`Traits` answers, cheaply (no column is copied, every predictor file is read once per process), whether a
workload carries per-position draft confidence, whether it can be tree-replayed, and which shipped acceptance
predictors fit it. :func:`specgym.agents.specs.all_specs` reads them to decide what ``all`` means for the workload
and to say which rows were left out and why.

The predictor index (:func:`predictor_cards`) is built from the shipped predictor files, each loaded once
(:func:`~specgym.envs.core.acceptance_predictor.load_predictor` caches by path, modification time and size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import specgym.catalogue as catalogue
from specgym.envs.core.acceptance_predictor import load_predictor
from specgym.envs.engines.replay.tree_engine import check_tree_workload
from specgym.errors import SpecgymError


@dataclass(frozen=True)
class PredictorCard:
    """What the index knows of one shipped acceptance predictor.

    Attributes:
        name: Its catalogue name.
        workloads: The workloads it was trained on.
        pair_target: The target model of the pair it was trained on (None if unknown).
        groups: The signal groups it reads; ``fallback_groups`` those of its fallback (empty without one).
        continuation: It carries the continuation models ``planned:`` plans with.
    """

    name: str
    workloads: tuple[str, ...]
    pair_target: str | None
    groups: frozenset[str]
    fallback_groups: frozenset[str]
    continuation: bool

    def fits(self, groups: frozenset[str]) -> bool:
        """The predictor (or its fallback) has every signal it reads in ``groups``."""
        return self.groups <= groups or bool(self.fallback_groups) and self.fallback_groups <= groups


def predictor_cards() -> list[PredictorCard]:
    """Every shipped predictor's card, in catalogue order (unreadable files are skipped)."""
    cards = []
    for name in catalogue.names("predictor"):
        try:
            pred = load_predictor(catalogue.resolve("predictor", name))
        except SpecgymError:
            continue
        meta = pred.meta or {}
        workloads = meta.get("workloads") or [meta.get("workload")]
        cards.append(PredictorCard(name, tuple(str(w) for w in workloads if w), meta.get("pair_target"),
                                   frozenset(pred.groups),
                                   frozenset(pred.fallback.groups) if pred.fallback is not None else frozenset(),
                                   bool(pred.continuation)))
    return cards


def signal_groups(workload: Any) -> frozenset[str]:
    """The predictor signal groups a workload carries (``position`` always; ``conf`` with draft confidence)."""
    groups = {"position"}
    if getattr(workload, "draft_conf", None) is not None:
        groups.add("conf")
    if getattr(workload, "draft_topk", None) is not None:
        groups.add("shape")
    if getattr(workload, "lookup_len", None) is not None and getattr(workload, "lookup_agree", None) is not None:
        groups.add("lookup")
    if getattr(workload, "hidden_sketch", None) is not None:
        groups.add("hidden")
    return frozenset(groups)


@dataclass(frozen=True)
class Traits:
    """What a workload offers, as the table's ``needs`` flags (:data:`FLAGS`).

    Attributes:
        name: The workload's name (None: no workload, see :meth:`anything`).
        conf: Per-position draft confidence and entropy (the token-level stops read them).
        tree: Tree-replayable: greedy, with the target's rank in the draft's order.
        groups: The predictor signal groups it carries.
        predictors: Shipped predictors that fit it: trained on it by name, else on the same pair, and whose
            signals (or fallback's) it carries. ``planned``: those of them ``planned:`` can run.
        recorded: A recorded trace (a predictor of its pair could exist).
        greedy: Every request is greedy.
        known: False for :meth:`anything` (no workload: nothing is noted as missing).
        drafters: The drafters the trace holds runs of, the default first (the ``drafters`` flag: two or more).
    """

    name: str | None
    conf: bool
    tree: bool
    groups: frozenset[str]
    predictors: tuple[str, ...]
    planned: tuple[str, ...]
    recorded: bool = False
    greedy: bool = False
    known: bool = True
    drafters: tuple[str, ...] = ()

    FLAGS: ClassVar[tuple[str, ...]] = ("conf", "tree", "predictor", "drafters")

    @classmethod
    def anything(cls) -> Traits:
        """No workload given: every workload-independent row joins ``all`` (no predictor, no tree row)."""
        return cls(None, True, False, frozenset(), (), (), known=False)

    @classmethod
    def of(cls, workload: Any) -> Traits:
        """The traits of a loaded workload."""
        try:
            check_tree_workload(workload)
            tree = True
        except SpecgymError:
            tree = False
        groups = signal_groups(workload)
        source = workload.source if isinstance(workload.source, dict) else {}
        target = source.get("target_model")
        fitting = [c for c in predictor_cards() if c.fits(groups)] if groups - {"position", "conf"} else []
        same_workload = [c for c in fitting if workload.name in c.workloads]
        chosen = same_workload or [c for c in fitting if target is not None and c.pair_target == target]
        temps = getattr(workload, "temperature", None)
        return cls(workload.name, getattr(workload, "draft_conf", None) is not None, tree, groups,
                   tuple(c.name for c in chosen), tuple(c.name for c in chosen if c.continuation),
                   recorded=source.get("kind") == "recorded",
                   greedy=temps is not None and bool((temps == 0).all()),
                   drafters=tuple(getattr(workload, "drafter_names", ())))

    def has(self, flag: str) -> bool:
        """Whether the workload offers ``flag`` (one of :data:`FLAGS`)."""
        return {"conf": self.conf, "tree": self.tree, "predictor": bool(self.predictors),
                "drafters": len(self.drafters) >= 2}[flag]

    def say_missing(self, missing: list[str]) -> bool:
        """Whether leaving a row out for ``missing`` deserves a note (only where the user could have expected it:
        no draft confidence; a greedy trace without ranks; a recorded trace no shipped predictor fits)."""
        if not self.known:
            return False
        return any(m == "conf" or (m == "tree" and self.greedy) or (m == "predictor" and self.recorded)
                   for m in missing)

    def describe_missing(self, missing: list[str]) -> str:
        """Why a row was left out, in words."""
        words = {"conf": "the trace carries no draft confidence or entropy",
                 "tree": "tree replay needs a greedy trace with ranks (trace format v2)",
                 "predictor": f"no shipped acceptance predictor fits workload {self.name!r} (its pair and signals)",
                 "drafters": "drafter choice needs a trace with two or more drafters"}
        return "; ".join(words[m] for m in missing)
