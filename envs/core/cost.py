"""Hardware cost profiles: what a round of speculative decoding costs, in milliseconds.

A profile gives ``draft_ms`` (one draft forward producing one token), ``verify(n)`` for n = 1..n_max (one target
forward over ``n`` new tokens; ``verify(1)`` is the plain autoregressive step ``t_AR``) and
``round_overhead_ms`` (sampling, cache bookkeeping and other fixed work of a speculative round). The cost model:

    round time(drafted) = drafted * draft_ms + verify(drafted + 1) + round_overhead_ms     (drafted >= 1)
    round time(0)       = verify(1) = t_AR                                                  (plain step)

On disk a profile is a JSON object whose ``verify_ms`` list holds ``verify(1), verify(2), ...`` in order; in code
always call :meth:`CostProfile.verify` with the number of tokens, never index the list. Profiles are measured by
``specgym profile`` or taken from published figures (``source`` says which).

**The general form** (format of issue 25; every term defaults to 0, which is the model above exactly). A round at
a KV cache of ``kv`` tokens (a request at completion position ``i`` holds ``prompt_len + i``) that drafts ``d``
tokens with drafter ``D`` costs

    forward(n, kv) = verify(n) + context_ms * kv                       (one target forward over n new tokens)
    round(d, kv)   = forward(d + 1, kv) + draft_D(d, kv) + round_overhead_ms + step_overhead_ms     (d >= 1)
    round(0, kv)   = forward(1, kv) + step_overhead_ms                                               (plain step)
    draft_D(d, kv) = D.fixed_ms + D.per_token_ms * d + D.per_kv_ms * kv + D.verify_fraction * forward(d + 1, kv)

so a round's time is affine in ``kv``: ``base[d] + per_kv[d] * kv`` (:class:`RoundTable`; :func:`step_cost` is the
one place that composes it, for a single request and for a batch). ``step_overhead_ms`` is paid by every step,
plain ones included (the SpecDecode-Bench simulator's per-step overhead); ``round_overhead_ms`` by speculative
rounds only. A profile without ``drafters`` has one implicit drafter, ``draft`` (an autoregressive model costing
``draft_ms`` per token); a profile may name several (``drafters``: ``kind`` ``model`` or ``lookup``), the first
being its default. A trace's drafter a profile does not name is priced as its default drafter when the name is
``draft`` (a per-position trace's one drafter) or the profile has a single drafter, else as its first drafter of the
same kind; otherwise :meth:`CostProfile.pricing_drafter` refuses in one line.

**Published linear profiles** (``forward`` in the JSON, e.g. ``h100-llama31-8b``): the target forward is given in
the batched form ``forward(kv_tokens, batched_tokens) = per_kv_ms * kv_tokens + per_token_ms * batched_tokens +
fixed_ms`` (batched tokens optionally padded up to the next CUDA-graph capture size). The single-request view is
that form at batch 1: ``verify(n) = fixed_ms + per_token_ms * n`` (n up to ``max_k + 1``), ``context_ms =
per_kv_ms``. The batched view prices a step of many sequences from the same parameters (:meth:`CostProfile.
batch_step_ms`: whole-batch KV, the batch's tokens, the longest draft) and is loadable as a batched profile
(:func:`specgym.envs.profiles.load_batch_profile`). :meth:`CostProfile.copies` is a batch of ``b``
identical sequences in lockstep as a single-request profile (the reference simulator's "like experiment").

Shipped measured CPU profiles have ``context_ms = 0`` (``specgym profile`` measures at one context length) until
re-measured: their rounds do not depend on the position.

**Tree rounds** (:mod:`specgym.envs.core.tree`) verify ``nodes + 1`` tokens in one forward with tree attention and
run one draft forward per depth (the whole frontier of a depth is one batched forward, priced as ``draft_ms``, the
cost of one single-token draft forward: batching a few frontier rows is assumed free, as on a memory-bound
accelerator; on a CPU it is optimistic):

    tree round time(depth, nodes) = depth * draft_ms + verify_nodes(nodes + 1) + round_overhead_ms   (depth >= 1)

(in the general form: :func:`step_cost` with ``verify_nodes(nodes + 1)`` as the forward and ``depth`` draft steps).

:meth:`CostProfile.verify_nodes` prices ``n`` up to :data:`TREE_NODE_LIMIT` + 1: inside the measured list it is
:meth:`verify`; beyond it, a **linear extrapolation** from the last measured entry with the list's mean slope
``(verify_ms[-1] - verify_ms[0]) / (len - 1)`` per token (:meth:`CostProfile.verify_extrapolated` says when; no
shipped profile is re-measured: a profile whose ``verify_ms`` list runs to 65 entries is priced as measured
throughout). Above the limit it refuses. A width-1 tree of depth K is the chain round: same time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.kinds import IMPLICIT_DRAFTER
from specgym.errors import SpecgymError
from specgym.io import atomic_write_text

PROFILE_SOURCES = ("measured", "published", "synthetic")
#: Largest tree (draft nodes, the root excluded) a profile prices: ``verify_nodes(n)`` for ``n <= 65``.
TREE_NODE_LIMIT = 64
#: Drafter kinds: an autoregressive draft model (one forward per draft token: EAGLE, a small LM) or prompt lookup
#: (vLLM's ``ngram`` proposer: no model, a string match over the context).
DRAFTER_KINDS = ("model", "lookup")
#: Verify entries a published linear profile derives by default (drafts of up to 32 tokens).
LINEAR_MAX_K = 32


@dataclass(frozen=True)
class DraftCost:
    """What one drafter's draft phase costs in a round (module docstring: ``draft_D(d, kv)``).

    Attributes:
        kind: ``model`` (autoregressive) or ``lookup`` (prompt lookup).
        fixed_ms: Fixed cost of the draft phase of a speculative round.
        per_token_ms: Cost of each drafted token.
        per_kv_ms: Cost per token in the KV cache (a model drafter reads its own cache).
        verify_fraction: A share of the round's target forward (the reference's n-gram proposer: 0.005875).
    """

    kind: str = "model"
    fixed_ms: float = 0.0
    per_token_ms: float = 0.0
    per_kv_ms: float = 0.0
    verify_fraction: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``drafters`` entries of a profile)."""
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("fixed_ms", "per_token_ms", "per_kv_ms", "verify_fraction"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str) -> DraftCost:
        """Build and validate one ``drafters`` entry; errors name ``where`` and the field."""
        if not isinstance(d, dict):
            raise SpecgymError(f"{where}: must be an object with 'kind' and cost fields")
        unknown = sorted(set(d) - {"kind", "fixed_ms", "per_token_ms", "per_kv_ms", "verify_fraction"})
        if unknown:
            raise SpecgymError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
        kind = d.get("kind", "model")
        if kind not in DRAFTER_KINDS:
            raise SpecgymError(f"{where}: field 'kind' must be one of {DRAFTER_KINDS}, got {kind!r}")
        vals = {k: _positive_number(d.get(k, 0.0), where, k, allow_zero=True)
                for k in ("fixed_ms", "per_token_ms", "per_kv_ms")}
        frac = _positive_number(d.get("verify_fraction", 0.0), where, "verify_fraction", allow_zero=True)
        if frac > 10.0:
            raise SpecgymError(f"{where}: field 'verify_fraction' = {frac!r} is not a plausible share of a forward")
        return cls(kind, vals["fixed_ms"], vals["per_token_ms"], vals["per_kv_ms"], frac)


def step_cost(verify_ms: Any, verify_per_kv_ms: float, drafted: Any, draft: DraftCost | None,
              round_overhead_ms: float, step_overhead_ms: float) -> tuple[Any, Any]:
    """The one composition of a round's (or a batch step's) time, affine in the KV cache: ``(base, per_kv)`` with
    time = ``base + per_kv * kv``.

    Args:
        verify_ms: The target forward over the round's new tokens at an empty cache (a float, or an array).
        verify_per_kv_ms: The forward's cost per cached token.
        drafted: Tokens drafted (the longest draft of a batch step); a float/int or an array.
        draft: The drafter's cost, or ``None`` for a plain step (no draft phase runs).
        round_overhead_ms: Paid by a speculative round (``draft`` given).
        step_overhead_ms: Paid by every step.

    The order of the additions keeps a profile without the general terms bit-identical to the classic
    ``drafted * draft_ms + verify(drafted + 1) + round_overhead_ms``.
    """
    if draft is None:
        return verify_ms + step_overhead_ms, verify_per_kv_ms
    base = drafted * draft.per_token_ms + verify_ms + round_overhead_ms + (
        draft.fixed_ms + draft.verify_fraction * verify_ms + step_overhead_ms)
    return base, verify_per_kv_ms * (1.0 + draft.verify_fraction) + draft.per_kv_ms


@dataclass(frozen=True)
class RoundTable:
    """Round times of one drafter under one profile, affine in the KV cache: ``time(d, kv) = base[d] + per_kv[d] *
    kv`` for d = 0..k_max (``d = 0``: the plain step).

    Attributes:
        base: ``(k_max + 1,)`` times at an empty cache (the classic ``round_times``).
        per_kv: ``(k_max + 1,)`` ms per cached token (all zero without a context term).
        spec0: ``(base, per_kv)`` of a speculative round that drafts nothing (the drafter ran and proposed no token;
            the reference simulator charges it to an oracle round of input length 1). Not a plain step.
    """

    base: np.ndarray
    per_kv: np.ndarray
    spec0: tuple[float, float]

    @property
    def has_context(self) -> bool:
        """True when some round's time depends on the KV cache."""
        return bool(np.any(self.per_kv != 0.0))

    @property
    def k_max(self) -> int:
        """Largest draft length the table prices."""
        return len(self.base) - 1

    def at(self, kv: float) -> np.ndarray:
        """``(k_max + 1,)`` round times at ``kv`` cached tokens (the base itself without a context term)."""
        return self.base + self.per_kv * kv if self.has_context else self.base


@dataclass(frozen=True)
class ForwardCost:
    """The target forward of a published linear profile, batched form:
    ``per_kv_ms * kv_tokens + per_token_ms * pad(batched_tokens) + fixed_ms``.

    Attributes:
        per_kv_ms: Per token in the KV cache (over the whole batch).
        per_token_ms: Per token fed in this forward (over the whole batch).
        fixed_ms: Fixed cost of a forward.
        capture_sizes: CUDA-graph capture sizes, increasing: batched tokens are padded up to the next one (none:
            no padding; beyond the largest: no padding, as an eager forward).
    """

    per_kv_ms: float
    per_token_ms: float
    fixed_ms: float
    capture_sizes: tuple[int, ...] = ()

    def padded(self, tokens: Any) -> Any:
        """Batched tokens after padding to the next capture size (scalar or array)."""
        if not self.capture_sizes:
            return tokens
        sizes, arr = np.asarray(self.capture_sizes), np.asarray(tokens)
        idx = np.searchsorted(sizes, arr, side="left")  # the first capture size >= tokens
        out = np.where(idx < len(sizes), sizes[np.minimum(idx, len(sizes) - 1)], arr)
        return out if arr.ndim else int(out)

    def base_ms(self, tokens: Any) -> Any:
        """The forward over ``tokens`` batched tokens at an empty cache."""
        return self.fixed_ms + self.per_token_ms * self.padded(tokens)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``forward`` block)."""
        out: dict[str, Any] = {"per_kv_token_ms": self.per_kv_ms, "per_batched_token_ms": self.per_token_ms,
                               "fixed_ms": self.fixed_ms}
        if self.capture_sizes:
            out["capture_sizes"] = list(self.capture_sizes)
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ForwardCost:
        """Build and validate the ``forward`` block."""
        if not isinstance(d, dict):
            raise SpecgymError(f"{where}: field 'forward' must be an object")
        unknown = sorted(set(d) - {"per_kv_token_ms", "per_batched_token_ms", "fixed_ms", "capture_sizes"})
        if unknown:
            raise SpecgymError(f"{where}: unknown field(s) in 'forward': {', '.join(map(repr, unknown))}")
        for key in ("per_kv_token_ms", "per_batched_token_ms", "fixed_ms"):
            if key not in d:
                raise SpecgymError(f"{where}: missing field 'forward.{key}'")
        sizes = d.get("capture_sizes", [])
        if not isinstance(sizes, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in sizes) \
                or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise SpecgymError(f"{where}: field 'forward.capture_sizes' must be increasing integers >= 1")
        return cls(_positive_number(d["per_kv_token_ms"], where, "forward.per_kv_token_ms", allow_zero=True),
                   _positive_number(d["per_batched_token_ms"], where, "forward.per_batched_token_ms",
                                    allow_zero=True),
                   _positive_number(d["fixed_ms"], where, "forward.fixed_ms"), tuple(sizes))


@dataclass(frozen=True)
class CostProfile:
    """Per-round cost model of one draft/target pair on one machine.

    Attributes:
        name: Short identifier, e.g. ``speclane-table``.
        draft_ms: One draft forward producing one token (the default drafter's ``per_token_ms``).
        verify_ms: Target forward times over 1, 2, ... new tokens at an empty cache (read them with :meth:`verify`).
        round_overhead_ms: Fixed cost added to every speculative round (K >= 1).
        source: ``measured`` (by ``specgym profile``), ``published`` (from a paper/write-up) or ``synthetic``.
        description: Human-readable provenance.
        hardware: Free-form hardware description (measured profiles).
        context_ms: Target forward cost per token in the KV cache (0: rounds do not depend on the position).
        step_overhead_ms: Fixed cost of every step, plain steps included.
        drafters: ``((name, DraftCost), ...)``, the default first; empty = the implicit drafter ``draft``.
        forward: The batched linear forward a published linear profile is defined by (``None`` otherwise).
    """

    name: str
    draft_ms: float
    verify_ms: tuple[float, ...]
    round_overhead_ms: float = 0.0
    source: str = "published"
    description: str = ""
    hardware: dict[str, Any] = field(default_factory=dict)
    context_ms: float = 0.0
    step_overhead_ms: float = 0.0
    drafters: tuple[tuple[str, DraftCost], ...] = ()
    forward: ForwardCost | None = None

    @property
    def t_ar_ms(self) -> float:
        """Plain autoregressive step time at an empty cache: ``verify(1)`` (+ the step overhead)."""
        return self.verify_ms[0] + self.step_overhead_ms

    @property
    def max_k(self) -> int:
        """Largest draft length this profile can price."""
        return len(self.verify_ms) - 1

    @property
    def cost_ratio(self) -> float:
        """``draft_ms / t_AR``: how cheap drafting is relative to the target."""
        return self.draft_ms / self.t_ar_ms

    @property
    def drafter_names(self) -> tuple[str, ...]:
        """The drafters this profile prices, the default first."""
        return tuple(n for n, _ in self.drafters) or (IMPLICIT_DRAFTER,)

    @property
    def has_context(self) -> bool:
        """True when a round's time depends on the KV cache (a context term in the forward or a drafter)."""
        return self.context_ms != 0.0 or any(dc.per_kv_ms != 0.0 for _, dc in self.drafters)

    def draft_cost(self, drafter: str | None = None) -> DraftCost:
        """The cost of ``drafter`` (``None``: the default; a name the profile lacks: :meth:`pricing_drafter`)."""
        if not self.drafters:
            return DraftCost("model", 0.0, self.draft_ms, 0.0, 0.0)
        name = self.pricing_drafter(drafter)
        return next(dc for n, dc in self.drafters if n == name)

    def pricing_notes(self, drafters: Sequence[tuple[str, str]]) -> list[str]:
        """One note per trace drafter (``(name, kind)``) this profile prices as another of its drafters (a profile
        measured without it), so a report never hides a stand-in price; empty for a one-drafter trace."""
        if len(drafters) < 2:
            return []
        notes = []
        for name, kind in drafters:
            if self.with_drafter(name, kind) is not self:  # prompt lookup added at no draft cost (with_drafter)
                notes.append(f"cost profile {self.name!r} has no {name!r} drafter: its rounds are priced as prompt "
                             f"lookup (no draft cost: the verify and the overheads)")
                continue
            try:  # a profile without drafters prices one, the implicit draft model
                priced = self.pricing_drafter(name, kind) if self.drafters else IMPLICIT_DRAFTER
            except SpecgymError:
                continue  # not priceable at all: the engine refuses it in its own line
            if priced != name:
                notes.append(f"cost profile {self.name!r} has no {name!r} drafter: its rounds are priced as "
                             f"{'the draft model' if not self.drafters else repr(priced)}")
        return notes

    def pricing_drafter(self, drafter: str | None, kind: str | None = None) -> str:
        """The profile drafter that prices a trace's ``drafter`` (of ``kind``): the same name; else the default when
        the name is ``draft`` (a per-position trace's one drafter) or the profile has one drafter; else the profile's
        first drafter of the same kind; else a one-line error."""
        names = self.drafter_names
        if drafter is None or drafter in names:
            return names[0] if drafter is None else drafter
        if drafter == IMPLICIT_DRAFTER or len(names) == 1:
            return names[0]
        same = [n for n, dc in self.drafters if dc.kind == kind]
        if same:
            return same[0]
        raise SpecgymError(f"cost profile {self.name!r} prices drafters {', '.join(names)}, not {drafter!r}"
                           + (f" (kind {kind!r})" if kind else ""))

    def with_drafter(self, name: str, kind: str | None) -> CostProfile:
        """This profile, able to price drafter ``name`` of ``kind``: itself when it prices the name or a drafter of
        that kind (or ``kind`` is not ``lookup``); else, for prompt lookup, a copy that adds ``name`` as a lookup
        drafter with no draft cost (a search over token ids, no forward: its rounds cost the verify and the
        overheads), the default drafter unchanged. A profile measured with a model drafter alone (the midpairs')
        prices a recorded or live n-gram drafter this way."""
        if kind != "lookup" or name in self.drafter_names or any(dc.kind == "lookup" for _, dc in self.drafters):
            return self
        default = self.drafters or ((IMPLICIT_DRAFTER, DraftCost("model", 0.0, self.draft_ms, 0.0, 0.0)),)
        return replace(self, drafters=(*default, (name, DraftCost("lookup"))))

    def led_by(self, name: str, kind: str | None) -> CostProfile:
        """This profile with drafter ``name`` (of ``kind``) as its default: how a chain rule deciding that drafter's
        K prices its rounds (:class:`~specgym.baselines.drafter_chain.ChainOnDrafter`); itself when it already is."""
        prof = self.with_drafter(name, kind)
        if not prof.drafters:
            return prof
        priced = prof.pricing_drafter(name, kind)
        if priced == prof.drafter_names[0]:
            return prof
        lead = next(entry for entry in prof.drafters if entry[0] == priced)
        return replace(prof, draft_ms=lead[1].per_token_ms,
                       drafters=(lead, *(entry for entry in prof.drafters if entry[0] != priced)))

    def verify(self, n: int) -> float:
        """One target forward over ``n >= 1`` new tokens (at an empty cache)."""
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

    def tree_round_time(self, depth: int, nodes: int, kv: float = 0.0) -> float:
        """Time of a tree round: ``depth`` batched draft forwards, one verify over ``nodes + 1`` tokens."""
        base, per_kv = step_cost(self.verify_nodes(nodes + 1) if depth else self.verify(1), self.context_ms, depth,
                                 self.draft_cost() if depth else None, self.round_overhead_ms, self.step_overhead_ms)
        return base + per_kv * kv if kv else base

    @property
    def verify_slope(self) -> float:
        """Extra cost of each verified token beyond the first, relative to ``t_AR`` (0 = perfectly flat)."""
        n = len(self.verify_ms)
        return (self.verify_ms[-1] / self.verify_ms[0] - 1.0) / (n - 1) if n > 1 else 0.0

    def _round(self, drafted: int, draft: DraftCost | None) -> tuple[float, float]:
        return step_cost(self.verify(drafted + 1), self.context_ms, drafted, draft, self.round_overhead_ms,
                         self.step_overhead_ms)

    def round_time(self, drafted: int, kv: float = 0.0, drafter: str | None = None) -> float:
        """Time of a round that drafted ``drafted`` tokens with ``drafter`` at ``kv`` cached tokens."""
        base, per_kv = self._round(drafted, self.draft_cost(drafter) if drafted else None)
        return base + per_kv * kv if kv else base

    def round_times(self, k_max: int, drafter: str | None = None) -> np.ndarray:
        """``out[d]`` = time of a round with ``d`` drafted tokens at an empty cache, d = 0..k_max (float64)."""
        return self.round_table(k_max, drafter).base

    def round_table(self, k_max: int, drafter: str | None = None) -> RoundTable:
        """The :class:`RoundTable` of ``drafter`` for d = 0..k_max."""
        self.check_k_max(k_max)
        dc = self.draft_cost(drafter)
        rows = [self._round(d, dc if d else None) for d in range(k_max + 1)]
        return RoundTable(np.array([b for b, _ in rows], dtype=np.float64),
                          np.array([s for _, s in rows], dtype=np.float64), self._round(0, dc))

    def batch_step_ms(self, kv_tokens: Any, batched_tokens: Any, drafted: Any, drafter: str | None = None,
                      speculative: bool = True) -> Any:
        """A step of a batch, priced by the batched form of a published linear profile (scalars or arrays).

        Args:
            kv_tokens: Tokens in the KV cache over the whole batch.
            batched_tokens: Tokens the target forward takes over the whole batch (``sum(K + 1)``).
            drafted: The longest draft of the step (a model drafter runs that many draft steps).
            drafter: The drafter (``None``: the default).
            speculative: False for a plain step (no draft phase, no round overhead).
        """
        fwd = self._forward("the batched form")
        base, per_kv = step_cost(fwd.base_ms(batched_tokens), fwd.per_kv_ms, drafted,
                                 self.draft_cost(drafter) if speculative else None, self.round_overhead_ms,
                                 self.step_overhead_ms)
        return base + per_kv * kv_tokens

    def batch_step_pricer(self, drafter: str | None = None) -> Callable[[int, int, int], float]:
        """:meth:`batch_step_ms` for one drafter as a scalar function ``price(kv_tokens, batched_tokens, drafted)``
        (a plain step when ``drafted`` is 0), the lookups done once: the batch replay's hot path."""
        fwd = self._forward("the batched form")
        dc = self.draft_cost(drafter)
        over, step_over, per_kv = self.round_overhead_ms, self.step_overhead_ms, fwd.per_kv_ms

        def price(kv_tokens: int, batched_tokens: int, drafted: int) -> float:
            base, kv_ms = step_cost(fwd.base_ms(batched_tokens), per_kv, drafted, dc if drafted > 0 else None, over,
                                    step_over)
            return float(base + kv_ms * kv_tokens)

        return price

    def copies(self, b: int) -> CostProfile:
        """A round of ``b`` identical sequences in lockstep as a single-request profile (a linear profile only):
        ``verify(n) = forward(0, b * n)``, ``b`` times the cache and the drafters' per-KV terms."""
        fwd = self._forward("copies()")
        if b == 1:
            return self
        n = len(self.verify_ms)
        return replace(self, name=f"{self.name}x{b}", verify_ms=tuple(float(fwd.base_ms(b * i)) for i in
                                                                      range(1, n + 1)),
                       context_ms=self.context_ms * b,
                       drafters=tuple((k, replace(dc, per_kv_ms=dc.per_kv_ms * b)) for k, dc in self.drafters),
                       description=f"{self.description} ({b} identical sequences in lockstep)", forward=None)

    def _forward(self, what: str) -> ForwardCost:
        if self.forward is None:
            raise SpecgymError(f"cost profile {self.name!r}: {what} needs a published linear profile (field "
                               f"'forward')")
        return self.forward

    def summary(self) -> str:
        """A short description of the cost terms (the classic ``draft X ms`` for a classic profile)."""
        if not (self.drafters or self.context_ms or self.step_overhead_ms):
            return f"draft {self.draft_ms:g} ms"
        parts = []
        for name, dc in self.drafters or ((IMPLICIT_DRAFTER, self.draft_cost()),):
            terms = [f"{v:g} {unit}" for v, unit in ((dc.fixed_ms, "ms"), (dc.per_token_ms, "ms/token"),
                                                      (dc.per_kv_ms, "ms/KV token"),
                                                      (dc.verify_fraction, "x the forward")) if v]
            parts.append(f"{name} ({dc.kind}: {' + '.join(terms) or 'free'})")
        out = "drafters " + ", ".join(parts)
        if self.context_ms:
            out += f"; forward + {self.context_ms:g} ms/KV token"
        if self.step_overhead_ms:
            out += f"; {self.step_overhead_ms:g} ms every step"
        return out

    def check_k_max(self, k_max: int) -> None:
        """Raise if the profile cannot price rounds up to ``k_max``."""
        if k_max > self.max_k:
            raise SpecgymError(
                f"cost profile {self.name!r}: verify_ms has {len(self.verify_ms)} entries, "
                f"needs k_max+1 = {k_max + 1} for k_max={k_max}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the on-disk format; the general terms only where they are set)."""
        d: dict[str, Any] = {"name": self.name}
        if self.forward is not None:
            d["forward"] = self.forward.to_dict()
            d["max_k"] = self.max_k
        else:
            if not self.drafters:
                d["draft_ms"] = self.draft_ms
            d["verify_ms"] = list(self.verify_ms)
        d["round_overhead_ms"] = self.round_overhead_ms
        d.update(source=self.source, description=self.description, hardware=self.hardware)
        if self.context_ms and self.forward is None:
            d["context_ms_per_token"] = self.context_ms
        if self.step_overhead_ms:
            d["step_overhead_ms"] = self.step_overhead_ms
        if self.drafters:
            d["drafters"] = {n: dc.to_dict() for n, dc in self.drafters}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "<profile>") -> CostProfile:
        """Build and validate a profile; errors name ``where`` and the field."""
        if not isinstance(d, dict):
            raise SpecgymError(f"{where}: a cost profile must be a JSON object")
        if "batch_sizes" in d:  # a serving profile (specgym tune): say so, by name, not by its install path
            raise SpecgymError(f"cost profile {d.get('name', where)!r} is a batched serving profile (it prices "
                               f"batches for specgym tune); this command prices one sequence at a time: give a "
                               f"cost profile (specgym workloads list)")
        linear = "forward" in d
        need = ("name", "forward") if linear else ("name", "verify_ms") if "drafters" in d else \
            ("name", "draft_ms", "verify_ms")
        for key in need:
            if key not in d:
                raise SpecgymError(f"{where}: missing field {key!r}")
        known = {"name", "draft_ms", "verify_ms", "round_overhead_ms", "source", "description", "hardware",
                 "context_ms_per_token", "step_overhead_ms", "drafters"} | ({"forward", "max_k"} if linear else set())
        unknown = sorted(set(d) - known)
        if unknown:
            raise SpecgymError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
        drafters = _drafters(d.get("drafters"), where)
        forward = ForwardCost.from_dict(d["forward"], where) if linear else None
        if forward is not None:
            if "verify_ms" in d or "context_ms_per_token" in d:
                raise SpecgymError(f"{where}: a linear profile ('forward') derives 'verify_ms' and the context term; "
                                   f"give neither")
            max_k = d.get("max_k", LINEAR_MAX_K)
            if isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= TREE_NODE_LIMIT:
                raise SpecgymError(f"{where}: field 'max_k' must be an integer in [1, {TREE_NODE_LIMIT}]")
            verify_t = tuple(float(forward.base_ms(n)) for n in range(1, max_k + 2))
            context = forward.per_kv_ms
        else:
            verify = d["verify_ms"]
            if not isinstance(verify, (list, tuple)) or len(verify) < 2:
                raise SpecgymError(f"{where}: field 'verify_ms' must be a list of at least 2 numbers (n = 1, 2, ...)")
            verify_t = tuple(_positive_number(v, where, f"verify_ms[{n + 1}]") for n, v in enumerate(verify))
            context = _positive_number(d.get("context_ms_per_token", 0.0), where, "context_ms_per_token",
                                       allow_zero=True)
        if drafters:
            if "draft_ms" in d:
                raise SpecgymError(f"{where}: with 'drafters', the draft cost is the drafters' (drop 'draft_ms')")
            draft = drafters[0][1].per_token_ms
        else:
            draft = _positive_number(d["draft_ms"], where, "draft_ms", allow_zero=True)
        overhead = _positive_number(d.get("round_overhead_ms", 0.0), where, "round_overhead_ms", allow_zero=True)
        step = _positive_number(d.get("step_overhead_ms", 0.0), where, "step_overhead_ms", allow_zero=True)
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
            context_ms=context,
            step_overhead_ms=step,
            drafters=drafters,
            forward=forward,
        )


def _drafters(raw: Any, where: str) -> tuple[tuple[str, DraftCost], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise SpecgymError(f"{where}: field 'drafters' must be a non-empty object {{name: {{kind, ...}}}}")
    out = []
    for name, spec in raw.items():
        if not isinstance(name, str) or not name or any(c in name for c in ",: "):
            raise SpecgymError(f"{where}: drafter name {name!r} must be a word (no ',', ':' or space)")
        out.append((name, DraftCost.from_dict(spec, f"{where}: field 'drafters.{name}'")))
    return tuple(out)


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


def save_profile(profile: CostProfile, path: str | Path, overwrite: bool = False) -> Path:
    """Write a profile as JSON atomically, after checking the text with the reader's own rules
    (:meth:`CostProfile.from_dict`, what :func:`~specgym.envs.profiles.load_profile` applies): a profile that could
    not be loaded back is refused in one line and nothing is written."""
    text = json.dumps(profile.to_dict(), indent=2) + "\n"
    CostProfile.from_dict(json.loads(text), where=f"{path} (not written)")
    return atomic_write_text(Path(path), text, overwrite=overwrite)
