"""Batched cost profiles: what one serving step costs with ``b`` sequences in flight.

In a serving engine every active sequence drafts and verifies in the same step, so a step's time depends on the
batch size ``b`` and on the tokens each sequence verifies ``n`` (``K + 1``):

    step time(b, K) = K * draft_ms(b) + verify_ms(b, K + 1) + overhead_ms(b)        (K >= 1)
    step time(b, 0) = verify_ms(b, 1)                                                 (plain decoding)

A :class:`BatchCostProfile` stores these on a grid of batch sizes (``verify_ms[i][n - 1]`` at ``batch_sizes[i]``)
and interpolates linearly in ``b`` between grid points (beyond the largest it extrapolates from the last two).
Three sources, labelled in ``source``: ``measured`` (``specgym profile --batch-sizes``), ``roofline`` (a model a user
parameterises with public numbers, :func:`roofline_profile`) and ``published`` (illustrative published figures).
At ``b = 1`` a batched profile is a plain :class:`CostProfile` (:meth:`BatchCostProfile.at`).

**From a published linear profile** (a single-request profile with a ``forward`` block, e.g. ``h100-llama31-8b``,
:mod:`specgym.envs.core.cost`): :func:`load_batch_profile` also loads such a file, as the batched view of the same
model (:meth:`BatchCostProfile.from_linear`). Its grid is the model at an empty cache on batch sizes 1, 2, 4, ...,
512 (draft per token and fixed draft cost of the default drafter, the forward over ``b * n`` tokens, the per-step
overhead in ``step_overhead_ms``), for the controllers that read a grid; :attr:`BatchCostProfile.linear` keeps the
model itself, and the batch replay prices every step with it exactly (:meth:`BatchCostProfile.step_ms`: whole-batch
KV, the step's tokens, optionally padded to CUDA-graph capture sizes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.errors import SpecgymError
from specgym.io import atomic_write_text

BATCH_SOURCES = ("measured", "roofline", "published", "synthetic")


@dataclass(frozen=True)
class BatchCostProfile:
    """Per-step costs of one draft/target pair on one machine at several batch sizes.

    Attributes:
        name: Short identifier.
        batch_sizes: Increasing batch sizes of the grid (the first is usually 1).
        draft_ms: One draft forward of ``b`` sequences, one new token each, per grid batch size.
        verify_ms: ``verify_ms[i][n - 1]``: one target forward of ``batch_sizes[i]`` sequences, ``n`` new tokens
            each, ``n = 1 .. k_max + 1``.
        overhead_ms: Fixed work of a speculative step per grid batch size.
        source: ``measured``, ``roofline``, ``published`` or ``synthetic``.
        description: Provenance.
        hardware: Hardware or model parameters behind it.
        step_overhead_ms: Fixed work of every step, plain ones included (0 for grid profiles).
        linear: The published linear single-request profile this one is the batched view of (``None``: a grid).
    """

    name: str
    batch_sizes: tuple[int, ...]
    draft_ms: tuple[float, ...]
    verify_ms: tuple[tuple[float, ...], ...]
    overhead_ms: tuple[float, ...]
    source: str = "measured"
    description: str = ""
    hardware: dict[str, Any] = field(default_factory=dict)
    step_overhead_ms: float = 0.0
    linear: CostProfile | None = None

    def __post_init__(self) -> None:
        b = self.batch_sizes
        if not b or any(x < 1 for x in b) or any(y <= x for x, y in zip(b, b[1:])):
            raise SpecgymError(f"batch profile {self.name!r}: batch_sizes must be increasing integers >= 1, got {b}")
        m = len(b)
        if len(self.draft_ms) != m or len(self.verify_ms) != m or len(self.overhead_ms) != m:
            raise SpecgymError(f"batch profile {self.name!r}: draft_ms, verify_ms and overhead_ms need one entry per "
                               f"batch size ({m})")
        widths = {len(v) for v in self.verify_ms}
        if len(widths) != 1 or min(widths) < 2:
            raise SpecgymError(f"batch profile {self.name!r}: every verify_ms row needs the same length >= 2")
        vals = [*self.draft_ms, *self.overhead_ms, *(x for row in self.verify_ms for x in row)]
        if any(not math.isfinite(v) or v < 0 for v in vals) or any(row[0] <= 0 for row in self.verify_ms):
            raise SpecgymError(f"batch profile {self.name!r}: times must be finite, >= 0, and verify_ms > 0")
        if self.source not in BATCH_SOURCES:
            raise SpecgymError(f"batch profile {self.name!r}: source must be one of {BATCH_SOURCES}")
        # the grid as arrays for vectorised lookups
        object.__setattr__(self, "_b", np.asarray(b, dtype=np.float64))
        object.__setattr__(self, "_draft", np.asarray(self.draft_ms, dtype=np.float64))
        object.__setattr__(self, "_verify", np.asarray(self.verify_ms, dtype=np.float64))
        object.__setattr__(self, "_over", np.asarray(self.overhead_ms, dtype=np.float64))
        object.__setattr__(self, "_rows", {})

    def row(self, b: int) -> tuple[float, np.ndarray, float]:
        """``(draft(b), [verify(b, n) for n = 1..], overhead(b))`` at an integer batch size (cached)."""
        rows: dict[int, tuple[float, np.ndarray, float]] = self._rows  # type: ignore[attr-defined]
        r = rows.get(b)
        if r is None:
            n = self.max_k + 1
            r = rows[b] = (self.draft(b), np.array([self.verify(b, i) for i in range(1, n + 1)]), self.overhead(b))
        return r

    @property
    def max_k(self) -> int:
        """Largest draft length the profile prices."""
        return len(self.verify_ms[0]) - 1

    def _weights(self, b: float) -> tuple[int, int, float]:
        grid = self._b  # type: ignore[attr-defined]
        if len(grid) == 1:
            return 0, 0, 0.0
        i = int(np.searchsorted(grid, b, side="right")) - 1
        i = min(max(i, 0), len(grid) - 2)
        return i, i + 1, (b - grid[i]) / (grid[i + 1] - grid[i])

    def _interp(self, table: np.ndarray, b: float) -> Any:
        i, j, w = self._weights(b)
        return table[i] + w * (table[j] - table[i]) if i != j else table[i]

    def draft(self, b: float) -> float:
        """One draft forward of ``b`` sequences."""
        return float(max(self._interp(self._draft, b), 0.0))  # type: ignore[attr-defined]

    def verify(self, b: float, n: int) -> float:
        """One target forward of ``b`` sequences, ``n`` new tokens each."""
        return float(max(self._interp(self._verify[:, n - 1], b), 1e-9))  # type: ignore[attr-defined]

    def overhead(self, b: float) -> float:
        """Fixed work of a speculative step at batch size ``b``."""
        return float(max(self._interp(self._over, b), 0.0))  # type: ignore[attr-defined]

    def step_time(self, b: float, k: int) -> float:
        """Time of a step in which ``b`` sequences each draft ``k`` tokens and verify ``k + 1`` (at an empty cache
        for a linear profile: :meth:`step_ms` prices the cache)."""
        if k == 0:
            return self.verify(b, 1) + self.step_overhead_ms
        return k * self.draft(b) + self.verify(b, k + 1) + self.overhead(b) + self.step_overhead_ms

    def step_ms(self, kv_tokens: Any, batched_tokens: Any, drafted: Any, drafter: str | None = None,
                speculative: bool = True) -> Any:
        """A step priced by the linear model (:meth:`CostProfile.batch_step_ms`); grid profiles refuse."""
        if self.linear is None:
            raise SpecgymError(f"batch profile {self.name!r} is a grid: it prices no KV cache (step_time)")
        return self.linear.batch_step_ms(kv_tokens, batched_tokens, drafted, drafter, speculative)

    def budget_step_ms(self, b: int, kv_tokens: int, verified: np.ndarray, drafted: np.ndarray | int,
                       draft_counts: np.ndarray | None = None, drafter: str | None = None) -> np.ndarray:
        """Step times of candidate allocations of one step of ``b`` sequences (what the budget rules maximise over).

        Args:
            b: Sequences in the step.
            kv_tokens: Tokens in the batch's KV cache (a linear profile prices them; a grid does not).
            verified: ``(m,)`` draft tokens verified over the batch in each candidate.
            drafted: The longest draft of each candidate (``(m,)`` or one int).
            draft_counts: ``(m, d)``: sequences drafting position ``j + 1`` in each candidate (a grid prices one
                draft forward of that many sequences per position); ``None``: all ``b`` draft ``drafted``.
            drafter: The drafter (a linear profile's pricing name; ``None``: its default).
        """
        verified = np.asarray(verified, dtype=np.float64)
        drafted = np.broadcast_to(np.asarray(drafted, dtype=np.float64), verified.shape)
        if self.linear is not None:
            spec = self.linear.batch_step_ms(kv_tokens, b + verified, drafted, drafter, True)
            plain = self.linear.batch_step_ms(kv_tokens, b, 0, drafter, False)
            return np.where(drafted > 0, spec, plain)
        _, row, overhead = self.row(b)
        verify = np.interp(1.0 + verified / b, np.arange(1, len(row) + 1), row)
        if draft_counts is None:
            draft = drafted * self.draft(b)
        else:
            grid = self._b  # type: ignore[attr-defined]
            dr = self._draft  # type: ignore[attr-defined]
            counts = np.asarray(draft_counts, dtype=np.float64)
            per = np.interp(counts, grid, dr) if len(grid) > 1 else np.full(counts.shape, dr[0])
            draft = np.where(counts > 0, per, 0.0).sum(axis=1)
        spec = draft + verify + overhead + self.step_overhead_ms
        return np.where(drafted > 0, spec, row[0] + self.step_overhead_ms)

    @classmethod
    def from_linear(cls, profile: CostProfile, batch_sizes: tuple[int, ...] = tuple(2 ** i for i in range(10)))\
            -> BatchCostProfile:
        """The batched view of a published linear profile (module docstring)."""
        fwd = profile.forward
        if fwd is None:
            raise SpecgymError(f"cost profile {profile.name!r} has no 'forward' block: not a linear profile")
        dc = profile.draft_cost()
        if dc.verify_fraction:
            raise SpecgymError(f"cost profile {profile.name!r}: its default drafter prices a share of the verify, "
                               f"which a grid cannot hold")
        n = profile.max_k + 1
        return cls(profile.name, tuple(batch_sizes), tuple(dc.per_token_ms for _ in batch_sizes),
                   tuple(tuple(float(fwd.base_ms(b * i)) for i in range(1, n + 1)) for b in batch_sizes),
                   tuple(profile.round_overhead_ms + dc.fixed_ms for _ in batch_sizes), profile.source,
                   profile.description, dict(profile.hardware), profile.step_overhead_ms, profile)

    def step_times(self, b: float, k_max: int) -> np.ndarray:
        """``out[k]`` = :meth:`step_time` for k = 0..k_max."""
        self.check_k_max(k_max)
        return np.array([self.step_time(b, k) for k in range(k_max + 1)])

    def at(self, b: float) -> CostProfile:
        """The single-sequence profile this batched profile implies at batch size ``b``."""
        n = self.max_k + 1
        return CostProfile(f"{self.name}@b{b:g}", self.draft(b), tuple(self.verify(b, i) for i in range(1, n + 1)),
                           self.overhead(b), source="measured" if self.source == "measured" else "synthetic",
                           description=f"{self.description} (batch size {b:g})")

    def check_k_max(self, k_max: int) -> None:
        """Raise if the profile cannot price drafts of ``k_max`` tokens."""
        if k_max > self.max_k:
            raise SpecgymError(f"batch profile {self.name!r} prices K up to {self.max_k}, needs k_max={k_max}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the on-disk format; a linear profile's is its single-request file)."""
        if self.linear is not None:
            return self.linear.to_dict()
        return {"name": self.name, "kind": "batched", "source": self.source, "description": self.description,
                "batch_sizes": list(self.batch_sizes), "draft_ms": list(self.draft_ms),
                "verify_ms": [list(r) for r in self.verify_ms], "overhead_ms": list(self.overhead_ms),
                "hardware": self.hardware}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "<batch profile>") -> BatchCostProfile:
        """Build and validate; errors name ``where`` and the field."""
        if not isinstance(d, dict):
            raise SpecgymError(f"{where}: a batch profile must be a JSON object")
        for key in ("name", "batch_sizes", "draft_ms", "verify_ms", "overhead_ms"):
            if key not in d:
                raise SpecgymError(f"{where}: missing field {key!r}")
        try:
            return cls(str(d["name"]), tuple(int(x) for x in d["batch_sizes"]), tuple(float(x) for x in d["draft_ms"]),
                       tuple(tuple(float(x) for x in row) for row in d["verify_ms"]),
                       tuple(float(x) for x in d["overhead_ms"]), str(d.get("source", "measured")),
                       str(d.get("description", "")), dict(d.get("hardware") or {}))
        except (TypeError, ValueError) as exc:
            raise SpecgymError(f"{where}: malformed batch profile ({exc})") from None
        except SpecgymError as exc:
            raise SpecgymError(f"{where}: {exc}") from None


def batch_profile_from_json(data: Any, where: str) -> BatchCostProfile:
    """The reader's rules for a batched profile file: a published linear profile (a ``forward`` block) or a measured
    table (``kind: batched``); both :func:`~specgym.envs.profiles.load_batch_profile` and
    :func:`save_batch_profile` apply them."""
    if isinstance(data, dict) and "forward" in data and "kind" not in data:  # a published linear profile
        return BatchCostProfile.from_linear(CostProfile.from_dict(data, where=where))
    if not isinstance(data, dict) or data.get("kind") != "batched":
        raise SpecgymError(f"{where}: not a batched cost profile (field 'kind' must be 'batched', or a linear "
                           f"profile with a 'forward' block)")
    return BatchCostProfile.from_dict(data, where=where)


def save_batch_profile(profile: BatchCostProfile, path: str | Path, overwrite: bool = False) -> Path:
    """Write a batched profile as JSON atomically, after checking the text with the reader's own rules
    (:func:`batch_profile_from_json`): a profile that could not be loaded back is refused and nothing is written."""
    text = json.dumps(profile.to_dict(), indent=1) + "\n"
    batch_profile_from_json(json.loads(text), f"{path} (not written)")
    return atomic_write_text(Path(path), text, overwrite=overwrite)


@dataclass(frozen=True)
class Roofline:
    """A roofline model of one draft/target pair on one accelerator, from public numbers.

    A forward of ``b`` sequences x ``n`` new tokens reads every weight once and does ``2 * params * b * n`` FLOPs:
    its time is the larger of the two (memory-bound until ``b * n`` reaches ``flops / (2 * bandwidth / bytes)``),
    plus a fixed launch/framework time.

    Attributes:
        target_params, draft_params: Parameters (count).
        bytes_per_param: 2 for bf16/fp16, 4 for fp32, 1 for int8.
        bandwidth_gb_s: Memory bandwidth (GB/s).
        peak_tflops: Dense matrix throughput at that precision (TFLOP/s).
        efficiency: Share of peak compute reached (0-1).
        fixed_ms: Fixed time of every forward (kernel launches, framework).
        overhead_ms: Fixed work of a speculative step (sampling, bookkeeping).
    """

    target_params: float
    draft_params: float
    bytes_per_param: float = 2.0
    bandwidth_gb_s: float = 2000.0
    peak_tflops: float = 300.0
    efficiency: float = 0.6
    fixed_ms: float = 0.2
    overhead_ms: float = 0.1

    def forward_ms(self, params: float, tokens: float) -> float:
        """One forward over ``tokens`` tokens (all sequences together)."""
        memory = params * self.bytes_per_param / (self.bandwidth_gb_s * 1e9) * 1e3
        compute = 2.0 * params * tokens / (self.peak_tflops * 1e12 * self.efficiency) * 1e3
        return max(memory, compute) + self.fixed_ms

    def profile(self, name: str, batch_sizes: tuple[int, ...], k_max: int, description: str = "",
                source: str = "roofline") -> BatchCostProfile:
        """The batched profile this model predicts on a grid of batch sizes."""
        return BatchCostProfile(
            name, tuple(batch_sizes), tuple(self.forward_ms(self.draft_params, b) for b in batch_sizes),
            tuple(tuple(self.forward_ms(self.target_params, b * n) for n in range(1, k_max + 2))
                  for b in batch_sizes),
            tuple(self.overhead_ms for _ in batch_sizes), source=source,
            description=description or "roofline model: max(weights / bandwidth, 2 * params * tokens / compute) "
                                       "+ fixed time per forward",
            hardware={"roofline": self.__dict__.copy()})


def roofline_profile(name: str, model: Roofline, max_batch: int = 512, k_max: int = 8, **kw: Any) -> BatchCostProfile:
    """:meth:`Roofline.profile` on the power-of-two grid 1, 2, 4, ..., ``max_batch``."""
    sizes = tuple(2 ** i for i in range(int(math.log2(max_batch)) + 1))
    return model.profile(name, sizes, k_max, **kw)
