"""Hardware cost profiles: what a round of speculative decoding costs, in milliseconds.

A profile gives ``draft_ms`` (one draft forward producing one token), ``verify(n)`` for n = 1..n_max (one target
forward over ``n`` new tokens; ``verify(1)`` is the plain autoregressive step ``t_AR``) and
``round_overhead_ms`` (sampling, cache bookkeeping and other fixed work of a speculative round). The cost model:

    round time(drafted) = drafted * draft_ms + verify(drafted + 1) + round_overhead_ms     (drafted >= 1)
    round time(0)       = verify(1) = t_AR                                                  (plain step)

On disk a profile is a JSON object whose ``verify_ms`` list holds ``verify(1), verify(2), ...`` in order; in code
always call :meth:`CostProfile.verify` with the number of tokens, never index the list. Profiles are measured by
``specgym profile`` or taken from published figures (``source`` says which).

**Tree rounds** (:mod:`specgym.envs.core.tree`) verify ``nodes + 1`` tokens in one forward with tree attention and
run one draft forward per depth (the whole frontier of a depth is one batched forward, priced as ``draft_ms``, the
cost of one single-token draft forward: batching a few frontier rows is assumed free, as on a memory-bound
accelerator; on a CPU it is optimistic):

    tree round time(depth, nodes) = depth * draft_ms + verify_nodes(nodes + 1) + round_overhead_ms   (depth >= 1)

:meth:`CostProfile.verify_nodes` prices ``n`` up to :data:`TREE_NODE_LIMIT` + 1: inside the measured list it is
:meth:`verify`; beyond it, a **linear extrapolation** from the last measured entry with the list's mean slope
``(verify_ms[-1] - verify_ms[0]) / (len - 1)`` per token (:meth:`CostProfile.verify_extrapolated` says when; no
shipped profile is re-measured: a profile whose ``verify_ms`` list runs to 65 entries is priced as measured
throughout). Above the limit it refuses. A width-1 tree of depth K is the chain round: same time.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.errors import SpecgymError
from specgym.io import atomic_write_text, read_text
import specgym.catalogue as catalogue

PROFILE_SOURCES = ("measured", "published", "synthetic")
#: Largest tree (draft nodes, the root excluded) a profile prices: ``verify_nodes(n)`` for ``n <= 65``.
TREE_NODE_LIMIT = 64


@dataclass(frozen=True)
class CostProfile:
    """Per-round cost model of one draft/target pair on one machine.

    Attributes:
        name: Short identifier, e.g. ``speclane-table``.
        draft_ms: One draft forward producing one token.
        verify_ms: Target forward times over 1, 2, ... new tokens (read them with :meth:`verify`).
        round_overhead_ms: Fixed cost added to every speculative round (K >= 1).
        source: ``measured`` (by ``specgym profile``), ``published`` (from a paper/write-up) or ``synthetic``.
        description: Human-readable provenance.
        hardware: Free-form hardware description (measured profiles).
    """

    name: str
    draft_ms: float
    verify_ms: tuple[float, ...]
    round_overhead_ms: float = 0.0
    source: str = "published"
    description: str = ""
    hardware: dict[str, Any] = field(default_factory=dict)

    @property
    def t_ar_ms(self) -> float:
        """Plain autoregressive step time ``verify(1)``."""
        return self.verify_ms[0]

    @property
    def max_k(self) -> int:
        """Largest draft length this profile can price."""
        return len(self.verify_ms) - 1

    @property
    def cost_ratio(self) -> float:
        """``draft_ms / t_AR``: how cheap drafting is relative to the target."""
        return self.draft_ms / self.t_ar_ms

    def verify(self, n: int) -> float:
        """One target forward over ``n >= 1`` new tokens."""
        return self.verify_ms[n - 1]

    def verify_extrapolated(self, n: int) -> bool:
        """True when ``verify_nodes(n)`` is extrapolated (``n`` beyond the measured ``verify_ms`` list)."""
        return n > len(self.verify_ms)

    def verify_nodes(self, n: int) -> float:
        """One target forward over ``n`` tree tokens (tree attention), ``1 <= n <= TREE_NODE_LIMIT + 1``.

        Measured entries as :meth:`verify`; beyond the list a linear extrapolation with the list's mean slope
        (module docstring); above the limit a one-line error.
        """
        m = len(self.verify_ms)
        if n <= m:
            return self.verify_ms[n - 1]
        if n > TREE_NODE_LIMIT + 1:
            raise SpecgymError(f"cost profile {self.name!r}: a tree of {n - 1} nodes is above the limit "
                               f"{TREE_NODE_LIMIT}")
        slope = max((self.verify_ms[-1] - self.verify_ms[0]) / (m - 1), 0.0)
        return self.verify_ms[-1] + (n - m) * slope

    def tree_round_time(self, depth: int, nodes: int) -> float:
        """Time of a tree round: ``depth`` batched draft forwards, one verify over ``nodes + 1`` tokens."""
        if depth == 0:
            return self.verify(1)
        return depth * self.draft_ms + self.verify_nodes(nodes + 1) + self.round_overhead_ms

    @property
    def verify_slope(self) -> float:
        """Extra cost of each verified token beyond the first, relative to ``t_AR`` (0 = perfectly flat)."""
        n = len(self.verify_ms)
        return (self.verify_ms[-1] / self.verify_ms[0] - 1.0) / (n - 1) if n > 1 else 0.0

    def round_time(self, drafted: int) -> float:
        """Time of a round that drafted ``drafted`` tokens."""
        if drafted == 0:
            return self.verify(1)
        return drafted * self.draft_ms + self.verify(drafted + 1) + self.round_overhead_ms

    def round_times(self, k_max: int) -> np.ndarray:
        """``out[d]`` = time of a round with ``d`` drafted tokens, d = 0..k_max (float64)."""
        self.check_k_max(k_max)
        return np.array([self.round_time(d) for d in range(k_max + 1)], dtype=np.float64)

    def check_k_max(self, k_max: int) -> None:
        """Raise if the profile cannot price rounds up to ``k_max``."""
        if k_max > self.max_k:
            raise SpecgymError(
                f"cost profile {self.name!r}: verify_ms has {len(self.verify_ms)} entries, "
                f"needs k_max+1 = {k_max + 1} for k_max={k_max}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the on-disk format)."""
        d = asdict(self)
        d["verify_ms"] = list(self.verify_ms)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "<profile>") -> CostProfile:
        """Build and validate a profile; errors name ``where`` and the field."""
        if not isinstance(d, dict):
            raise SpecgymError(f"{where}: a cost profile must be a JSON object")
        for key in ("name", "draft_ms", "verify_ms"):
            if key not in d:
                raise SpecgymError(f"{where}: missing field {key!r}")
        known = {"name", "draft_ms", "verify_ms", "round_overhead_ms", "source", "description", "hardware"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SpecgymError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
        draft = _positive_number(d["draft_ms"], where, "draft_ms", allow_zero=True)
        verify = d["verify_ms"]
        if not isinstance(verify, (list, tuple)) or len(verify) < 2:
            raise SpecgymError(f"{where}: field 'verify_ms' must be a list of at least 2 numbers (n = 1, 2, ...)")
        verify_t = tuple(_positive_number(v, where, f"verify_ms[{n + 1}]") for n, v in enumerate(verify))
        overhead = _positive_number(d.get("round_overhead_ms", 0.0), where, "round_overhead_ms", allow_zero=True)
        source = d.get("source", "published")
        if source not in PROFILE_SOURCES:
            raise SpecgymError(f"{where}: field 'source' must be one of {PROFILE_SOURCES}, got {source!r}")
        hardware = d.get("hardware", {}) or {}
        if not isinstance(hardware, dict):
            raise SpecgymError(f"{where}: field 'hardware' must be an object")
        return cls(
            name=str(d["name"]),
            draft_ms=draft,
            verify_ms=verify_t,
            round_overhead_ms=overhead,
            source=source,
            description=str(d.get("description", "")),
            hardware=hardware,
        )


#: The largest time a profile may state (ms): ~3 hours per forward. Beyond it a typo (1e300) would overflow
#: every throughput to 0 without an error.
MAX_MS = 1e7


def _positive_number(value: Any, where: str, fieldname: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecgymError(f"{where}: field {fieldname!r} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise SpecgymError(f"{where}: field {fieldname!r} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    if v > MAX_MS:
        raise SpecgymError(f"{where}: field {fieldname!r} = {value!r} ms is not a plausible time (at most "
                           f"{MAX_MS:g} ms; times are milliseconds)")
    return v


def placeholder_profile(k_max: int) -> CostProfile:
    """A flat stand-in for when no cost profile is known (live use without ``--profile``).

    Draft 1 ms, every verify 10 ms, no overhead: cost-aware controllers see a cheap draft and a flat verify. Pass a
    measured profile (``specgym profile``) to give them the real costs.
    """
    return CostProfile("placeholder", 1.0, (10.0,) * (k_max + 1), 0.0, source="synthetic",
                       description="no cost profile given: flat placeholder (draft 1 ms, verify 10 ms)")


def load_profile(name_or_path: str | Path) -> CostProfile:
    """Load a profile by shipped name (``speclane-table``) or by path to a JSON file."""
    path = catalogue.resolve("profile", name_or_path)
    try:
        data = json.loads(read_text(path, "cost profile (JSON)"))
    except json.JSONDecodeError as exc:
        raise SpecgymError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return CostProfile.from_dict(data, where=str(path))


def save_profile(profile: CostProfile, path: str | Path, overwrite: bool = False) -> Path:
    """Write a profile as JSON atomically."""
    return atomic_write_text(Path(path), json.dumps(profile.to_dict(), indent=2) + "\n", overwrite=overwrite)
