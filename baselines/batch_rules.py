"""Batch controllers of the serving literature: a static K, vLLM's batch-size table, SmartSpec's goodput rule, and
any single-request K-level controller applied per sequence.

* ``static:K`` -- every step drafts K (what most engines ship).
* ``table:[[start, end, K], ...]`` -- vLLM Dynamic Speculative Decoding: ``num_speculative_tokens_per_batch_size``
  maps the step's batch size to K (batch sizes outside every range draft 0). ``specgym tune vllm`` computes one.
* ``goodput`` -- SmartSpec (Liu et al., "Optimizing Speculative Decoding for Serving Large Language Models Using
  Goodput", 2024): each step, the K maximising estimated goodput ``b * E(K) / step_time(b, K)``, with ``E(K)`` the
  geometric expectation under the running acceptance estimate (accepted over judged tokens, EMAs across the batch)
  and ``step_time`` from the batched profile at the current batch size.
* ``per-seq:SPEC`` -- a single-request K-level controller (``assc``, ``speclane``, ``hf-heuristic``...) per
  sequence, each seeing the single-request profile at the batch size its request was admitted at.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specgym.envs.core.batch import BatchController, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.controller import Controller
from specgym.envs.core.economics import best_k_for_costs
from specgym.envs.core.rounds import K_MAX_LIMIT, RequestContext, RoundOutcome
from specgym.errors import SpecgymError
from specgym.io import read_text


class StaticK(BatchController):
    """Every step drafts ``k``."""

    def __init__(self, k: int):
        self.k = int(k)
        self.name = f"static:{self.k}"

    def propose(self, state: BatchState) -> int:
        return self.k


class BatchSizeTable(BatchController):
    """vLLM's ``num_speculative_tokens_per_batch_size``: ``[[start_bs, end_bs, K], ...]`` (inclusive ranges).

    Args:
        table: The ranges; batch sizes in none of them draft 0.
    """

    def __init__(self, table: list[list[int]], name: str | None = None):
        try:
            rows = [tuple(int(v) for v in row) for row in table]
        except (TypeError, ValueError):
            raise SpecgymError(f"batch-size table rows must be [start, end, K] integers, got {table}") from None
        if not rows or any(len(r) != 3 or r[0] < 1 or r[1] < r[0] or r[2] < 0 for r in rows):
            raise SpecgymError(f"batch-size table rows must be [start >= 1, end >= start, K >= 0], got {table}")
        rows.sort()
        if rows[0][0] != 1:
            raise SpecgymError(f"batch-size table starts at batch {rows[0][0]}: cover 1..N without gaps (a row "
                               f"[start, end, 0] drafts nothing there)")
        for (s0, e0, _), (s1, e1, _) in zip(rows, rows[1:]):
            if s1 <= e0:
                raise SpecgymError(f"batch-size table rows [{s0}, {e0}, ...] and [{s1}, {e1}, ...] overlap: each "
                                   f"batch size needs one K")
            if s1 > e0 + 1:
                raise SpecgymError(f"batch-size table has a gap: batch sizes {e0 + 1}..{s1 - 1} are in no row (a row "
                                   f"[start, end, 0] drafts nothing there)")
        if max(r[2] for r in rows) > K_MAX_LIMIT:
            raise SpecgymError(f"batch-size table: K {max(r[2] for r in rows)} is above {K_MAX_LIMIT}, the largest "
                               f"K specgym prices")
        self.table = rows
        self.name = name or "table"
        top = max(r[1] for r in rows)
        self._k = np.zeros(top + 2, dtype=np.int64)
        for start, end, k in rows:
            self._k[start:end + 1] = k

    @property
    def max_batch(self) -> int:
        """The largest batch size the table covers (beyond it, every step drafts 0)."""
        return self.table[-1][1]

    def check_k_max(self, k_max: int) -> None:
        """Refuse a K above the engine's ``k_max`` (it would be capped without a word)."""
        over = [r for r in self.table if r[2] > k_max]
        if over:
            raise SpecgymError(f"{self.name}: row {list(over[0])} drafts K={over[0][2]}, above k_max {k_max}")

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        """Start a run (see :meth:`check_k_max`)."""
        self.check_k_max(k_max)
        super().reset(profile, k_max)

    def propose(self, state: BatchState) -> int:
        return int(self._k[state.batch]) if state.batch < len(self._k) else 0

    @classmethod
    def parse(cls, arg: str) -> BatchSizeTable:
        """``table:[[1,64,3],[65,128,1]]`` or ``table:FILE.json`` (a JSON list, an object holding
        ``num_speculative_tokens_per_batch_size``, or the JSON ``specgym tune vllm --out`` writes)."""
        inline = arg.lstrip().startswith(("[", "{"))
        if not inline and not Path(arg).is_file():
            raise SpecgymError(f"table:{arg}: no such file (give a JSON file, or the table inline: "
                               f"table:[[1,64,3],[65,128,1]])")
        text = arg if inline else read_text(arg, "batch-size table (JSON)")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecgymError(f"table:{'' if inline else arg + ': '}not JSON ({exc.msg})") from None
        if isinstance(data, dict):
            data = data.get("num_speculative_tokens_per_batch_size", data.get("table", data.get(
                "speculative_config", {}).get("num_speculative_tokens_per_batch_size")))
        if not isinstance(data, list):
            raise SpecgymError("table: expected [[start_bs, end_bs, K], ...]")
        return cls(data, name="table" if inline else f"table:{Path(arg).name}")


class GoodputRule(BatchController):
    """SmartSpec-style: each step, the K with the highest estimated goodput at the current batch size.

    Args:
        beta: EMA factor of the acceptance estimate.
        alpha0: Acceptance assumed before any evidence.
    """

    name = "goodput"

    def __init__(self, beta: float = 0.9, alpha0: float = 0.6):
        self.beta, self.alpha0 = beta, alpha0

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        super().reset(profile, k_max)
        self.ema_acc, self.ema_judged = self.alpha0, 1.0
        self._times: dict[int, np.ndarray] = {}

    def propose(self, state: BatchState) -> int:
        alpha = min(self.ema_acc / self.ema_judged, 0.999)
        times = self._times.get(state.batch)
        if times is None:
            times = self._times[state.batch] = self.profile.step_times(state.batch, self.k_max)
        return best_k_for_costs(alpha, times)

    def observe(self, step: BatchStep) -> None:
        drafted = step.planned_k
        if drafted.sum() == 0:
            return
        judged = np.minimum(step.accepted + 1, drafted)
        b = self.beta
        self.ema_acc = b * self.ema_acc + (1 - b) * float(step.accepted.sum()) / step.batch
        self.ema_judged = b * self.ema_judged + (1 - b) * float(judged.sum()) / step.batch


class PerSequence(BatchController):
    """A single-request K-level controller per sequence.

    Args:
        make: Builds a fresh controller (one per slot).
        name: Display name.
    """

    def __init__(self, make, name: str):
        self.make, self.name = make, name

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        super().reset(profile, k_max)
        self.ctrl: dict[int, Controller] = {}
        self.position: dict[int, int] = {}

    def propose(self, state: BatchState) -> np.ndarray:
        for slot in state.new_slots.tolist():
            c = self.make()
            if c.token_level:
                raise SpecgymError(f"per-seq: {c.name} is token-level; batches take K-level controllers")
            c.reset(RequestContext(f"slot{slot}", "batch", 0.0, 0, self.k_max, self.profile.at(state.batch)))
            self.ctrl[slot] = c
            self.position[slot] = 0
        return np.array([self.ctrl[s].propose() for s in state.slots.tolist()], dtype=np.int64)

    def observe(self, step: BatchStep) -> None:
        for slot, k, a in zip(step.slots.tolist(), step.planned_k.tolist(), step.accepted.tolist()):
            i = self.position[slot]
            self.ctrl[slot].observe(RoundOutcome(i, k, k, a, a + 1, step.time_ms))
            self.position[slot] = i + a + 1
