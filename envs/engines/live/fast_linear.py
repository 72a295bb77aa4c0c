"""Linear-layer kernels chosen by measurement: every forward of a loaded model takes its fastest path on this machine.

A CPU forward of a small model is memory bound: every weight streams from memory once per call, whatever the row
count (one token for plain decoding and drafting, ``n`` tokens for verification). Which kernel streams fastest depends
on the machine and on the row count, and guesses go wrong both ways: on one AVX2 machine the general matrix multiply
re-packs the weights on every multi-row call (1.5-2.5x the one-token step), on another the pre-packed oneDNN kernel
beats the matrix-vector path even for one row (a one-token forward of the midpair target 5.1 ms packed vs 7.3 ms
through the matrix-vector path). A speedup over plain decoding means something only when plain decoding runs its
fastest path too, so nothing here is assumed: :func:`select_kernels` times the model's *whole* forward with each
kernel at each row count, at load, and keeps the fastest. (Timing one layer alone misleads: a lone weight stays in
the cache between calls, so a layer measured at 30-100 us takes ~270 us inside the forward, where every other
layer's weights evict it.)

The kernels (each computes ``y = x W^T + b``; outputs equal up to float rounding):

* ``gemm``: ``torch.nn.functional.linear`` on the ``(out, in)`` weight (PyTorch's default path);
* ``gemm_t``: ``addmm`` on an ``(in, out)`` copy of the weight (GPT-2's ``Conv1D`` layout);
* ``packed``: oneDNN's linear on a weight pre-packed once in its blocked layout (CPU builds with oneDNN only).

:func:`pack_linears` swaps a float32 CPU model's linear layers (``nn.Linear`` and GPT-2's ``Conv1D``) for
:class:`KernelLinear` modules that keep the layers' own parameters (the model stays an ordinary model: same state dict,
``save_pretrained`` output and ``.to(dtype/device)``); :func:`select_kernels` measures and sets each row count's
kernel, then frees the layouts no row count uses. Plans are cached per architecture in the process, so loading the
same pair twice measures once. Elsewhere (GPU, half precision, no oneDNN) nothing changes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specgym.envs.engines.live.lean_forward import lean_runner

KERNELS = ("gemm", "gemm_t", "packed")
#: Row counts measured at load: one token (plain decoding, drafting) and verification widths up to 17 tokens. A call
#: with ``r`` rows uses the plan of the largest measured row count ``<= r``.
ROW_COUNTS = (1, 2, 3, 5, 9, 17)
_BATCH_HINT = 8  # oneDNN picks its blocking for this many rows; any row count works


def packing_available() -> bool:
    """True when this torch build can pack linear weights with oneDNN on the CPU."""
    import torch

    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") \
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class _KernelPlan:
    """The bookkeeping of a :class:`KernelLinear` that needs no torch at import: which kernel each row count uses
    (:meth:`set_plan`) and which derived weight layouts are kept for them (:meth:`_refresh`). The torch module itself
    is defined on first use (:func:`_kernel_linear_class`), so importing this module does not import torch."""

    weight: Any
    bias: Any
    by_rows: list[str]
    in_features: int
    out_features: int
    _key: tuple
    _fast: bool
    weight_oi: Any
    weight_t: Any
    packed: Any

    def layout(self, kernel: str) -> Any:  # pragma: no cover - KernelLinear's own
        raise NotImplementedError

    def _refresh(self) -> None:
        """Drop the derived layouts of a weight that changed; note whether the fast kernels apply to it."""
        import torch

        w = self.weight
        self._key = (w.data_ptr(), w._version, w.dtype, w.device)
        self.weight_oi = self.weight_t = self.packed = None
        self._fast = w.device.type == "cpu" and w.dtype == torch.float32 and packing_available() and \
            (self.bias is None or (self.bias.dtype == w.dtype and self.bias.device == w.device))

    def set_plan(self, by_rows: list[str]) -> None:
        """Use ``by_rows[r]`` for ``r`` rows (the last entry beyond); build the layouts they read, free the rest."""
        self.by_rows = list(by_rows)
        used = set(by_rows[1:])
        w = self.weight
        if self._key != (w.data_ptr(), w._version, w.dtype, w.device):
            self._refresh()
        if self._fast:
            for kernel in used:
                self.layout(kernel)
        if "gemm_t" not in used:
            self.weight_t = None
        if "packed" not in used:
            self.packed = None
        if "gemm" not in used:
            self.weight_oi = None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _kernel_linear_class() -> type:
    import torch
    import torch.nn.functional as F

    class KernelLinear(_KernelPlan, torch.nn.Module):
        """``y = x W^T + b`` with the kernel of each row count set by :func:`select_kernels`.

        The layer keeps the replaced layer's own ``weight`` and ``bias`` parameters, in their own layout (``(out, in)``
        for ``nn.Linear``, ``(in, out)`` for GPT-2's ``Conv1D``: ``transposed``), so the model's state dict, weight
        tying, ``save_pretrained`` and ``.to(dtype/device)`` are those of the original model. The other layouts a kernel
        needs (a contiguous copy, oneDNN's packed weight) are caches outside the state dict, built when first used and
        dropped whenever the weight changes (a new dtype or device, an in-place update). Away from float32 on the CPU
        the layer computes what the original layer did. Until a plan is set it behaves as the old fixed rule: ``gemm``
        for one row, ``packed`` for several.
        """

        def __init__(self, weight: Any, bias: Any, transposed: bool = False) -> None:
            super().__init__()
            self.weight = weight if isinstance(weight, torch.nn.Parameter) else \
                torch.nn.Parameter(weight.detach().contiguous(), requires_grad=False)
            self.bias = bias if bias is None or isinstance(bias, torch.nn.Parameter) else \
                torch.nn.Parameter(bias.detach().contiguous(), requires_grad=False)
            self.transposed = bool(transposed)
            self.in_features = int(self.weight.shape[0 if transposed else 1])
            self.out_features = int(self.weight.shape[1 if transposed else 0])
            self.by_rows: list[str] = ["gemm", "gemm", "packed"]  # index = rows (0 unused); longer rows: last entry
            self.forced: str | None = None  # set while measuring
            self._key: tuple = ()
            self.weight_oi: Any = None  # (out, in) contiguous: gemm
            self.weight_t: Any = None  # (in, out) contiguous: gemm_t
            self.packed: Any = None  # oneDNN blocked layout: packed
            self._fast = False

        def layout(self, kernel: str) -> Any:
            """The weight in the layout ``kernel`` reads (built on first use)."""
            w = self.weight.detach()
            if kernel == "packed":
                if self.packed is None:
                    oi = w.t().contiguous() if self.transposed else w.contiguous()
                    self.packed = torch.ops.mkldnn._reorder_linear_weight(oi, _BATCH_HINT)
                return self.packed
            if kernel == "gemm_t":
                if self.weight_t is None:
                    self.weight_t = w if self.transposed else w.t().contiguous()
                return self.weight_t
            if self.weight_oi is None:
                self.weight_oi = w.t().contiguous() if self.transposed else w
            return self.weight_oi

        def forward(self, x: Any) -> Any:
            w = self.weight
            if self._key[:2] != (w.data_ptr(), w._version) or self._key[2] != w.dtype or self._key[3] != w.device:
                self._refresh()
            rows = x.reshape(-1, self.in_features)
            if not self._fast or rows.dtype != w.dtype:  # what nn.Linear / Conv1D compute
                if self.transposed:
                    y = rows @ w if self.bias is None else torch.addmm(self.bias, rows, w)
                else:
                    y = F.linear(rows, w, self.bias)
                return y.view(*x.shape[:-1], y.shape[-1])
            r = rows.shape[0]
            kernel = self.forced or self.by_rows[min(r, len(self.by_rows) - 1)]
            if kernel == "packed":
                y = torch.ops.mkldnn._linear_pointwise(rows, self.layout("packed"), self.bias, "none", [], "")
            elif kernel == "gemm_t":
                wt = self.layout("gemm_t")
                y = rows @ wt if self.bias is None else torch.addmm(self.bias, rows, wt)
            else:
                y = F.linear(rows, self.layout("gemm"), self.bias)
            return y.view(*x.shape[:-1], y.shape[-1])

    return KernelLinear


_CLASS: dict[str, type] = {}


def kernel_linear(weight: Any, bias: Any, transposed: bool = False) -> Any:
    """A :class:`KernelLinear` module over ``weight`` (``(out, in)``; ``(in, out)`` with ``transposed``) and
    ``bias``; parameters are kept as they are (the same objects), tensors become parameters."""
    if "cls" not in _CLASS:
        _CLASS["cls"] = _kernel_linear_class()
    return _CLASS["cls"](weight, bias, transposed)


def kernel_modules(model: Any) -> list[Any]:
    """The model's :class:`KernelLinear` modules (empty when :func:`pack_linears` changed nothing)."""
    cls = _CLASS.get("cls")
    return [] if cls is None else [m for m in model.modules() if isinstance(m, cls)]


def pack_linears(model: Any) -> int:
    """Replace the model's linear layers (``nn.Linear`` and GPT-2's ``Conv1D``) by :class:`KernelLinear` modules.

    Only for float32 models on the CPU with oneDNN available; otherwise returns 0 and leaves the model unchanged.
    Returns the number of layers replaced. Call :func:`select_kernels` next to measure which kernel each row count
    should use.
    """
    import torch

    try:
        from transformers.pytorch_utils import Conv1D

        conv_types: tuple[type, ...] = (Conv1D,)
    except ImportError:  # pragma: no cover - transformers without GPT-2's Conv1D
        conv_types = ()
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32 or not packing_available():
        return 0
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear):
                swaps.append((parent, name, child.weight, child.bias, False))
            elif isinstance(child, conv_types):  # Conv1D stores W as (in, out)
                conv: Any = child
                swaps.append((parent, name, conv.weight, conv.bias, True))
    for parent, name, w, b, transposed in swaps:  # the layers' own parameters: the state dict is unchanged
        setattr(parent, name, kernel_linear(w, b, transposed))
    return len(swaps)


# ----------------------------------------------------------------------------------------------------------------
# Choosing by measurement
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelChoice:
    """The kernel of one row count and what each candidate cost (median ms of a whole forward)."""

    rows: int
    kernel: str
    ms: dict[str, float]


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel each row count of one model uses, measured on this machine.

    Attributes:
        choices: One :class:`KernelChoice` per measured row count, ascending.
        context: Tokens of context the forwards were timed at.
        cached: True when the plan was reused from an earlier measurement of the same architecture.
    """

    choices: tuple[KernelChoice, ...]
    context: int
    cached: bool = False

    def kernel_for(self, rows: int) -> str:
        """The kernel a forward over ``rows`` tokens uses."""
        chosen = self.choices[0].kernel
        for c in self.choices:
            if c.rows <= rows:
                chosen = c.kernel
        return chosen

    def forward_ms(self, rows: int) -> float:
        """Measured median ms of a whole forward over ``rows`` (a measured row count) with its chosen kernel."""
        for c in self.choices:
            if c.rows == rows:
                return c.ms[c.kernel]
        raise KeyError(f"row count {rows} was not measured ({[c.rows for c in self.choices]})")

    def summary(self) -> str:
        """One line: ``1 row packed 5.06 ms (gemm 7.33, gemm_t 6.90); 2 rows packed ...``."""
        parts = []
        for c in self.choices:
            others = ", ".join(f"{k} {v:.2f}" for k, v in c.ms.items() if k != c.kernel)
            parts.append(f"{c.rows} row{'s' if c.rows > 1 else ''} {c.kernel} {c.ms[c.kernel]:.2f} ms ({others})")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (bench output)."""
        return {"context": self.context, "cached": self.cached,
                "choices": [{"rows": c.rows, "kernel": c.kernel, "ms": c.ms} for c in self.choices]}


@dataclass
class _PlanCache:
    plans: dict[tuple, KernelPlan] = field(default_factory=dict)


_PLANS = _PlanCache()


def _signature(model: Any, modules: list[Any], context: int) -> tuple:
    import torch

    shapes = tuple((tuple(m.weight.shape), m.bias is not None) for m in modules)
    return type(model).__name__, shapes, torch.get_num_threads(), context


def select_kernels(model: Any, forward: Callable[[list[int], Any], Any], new_cache: Callable[[], Any],
                   rows: Sequence[int] = ROW_COUNTS, context: int = 64, repeats: int = 7, warmup: int = 2,
                   use_cache: bool = True) -> KernelPlan | None:
    """Time the model's whole forward with every kernel at every row count and set the fastest; ``None`` if the
    model has no :class:`KernelLinear` layers.

    Args:
        model: A model :func:`pack_linears` swapped.
        forward: ``forward(ids, cache)`` -> logits, the engine's own cached forward (so the measurement is of the
            path decoding runs).
        new_cache: An empty cache for ``forward``.
        rows: Row counts to measure (ascending); a call with ``r`` rows uses the largest measured count ``<= r``.
        context: Tokens of context every timed forward follows.
        repeats, warmup: Timed and untimed rounds; each round runs every (row count, kernel) once, interleaved, so a
            machine whose speed drifts slows every candidate alike.
        use_cache: Reuse a plan measured in this process for the same architecture and thread count.
    """
    import torch

    modules = kernel_modules(model)
    if not modules:
        return None
    rows = sorted(set(int(r) for r in rows))
    cfg = getattr(model, "config", None)
    vocab = int(getattr(cfg, "vocab_size", 0) or 1000)
    limit = next((int(v) for v in (getattr(cfg, k, None) for k in ("n_positions", "max_position_embeddings"))
                  if isinstance(v, int) and v > 0), 1 << 30)
    rows = [r for r in rows if r < limit] or [1]
    context = max(1, min(context, limit - rows[-1]))
    key = _signature(model, modules, context)
    plan = _PLANS.plans.get(key) if use_cache else None
    if plan is None:
        times: dict[tuple[int, str], list[float]] = {(r, k): [] for r in rows for k in KERNELS}
        with torch.inference_mode():
            cache = new_cache()
            forward([(7 * t) % (vocab - 1) + 1 for t in range(context)], cache)
            for rep in range(warmup + repeats):
                for r in rows:
                    ids = [(11 * t + rep) % (vocab - 1) + 1 for t in range(r)]
                    order = KERNELS[rep % len(KERNELS):] + KERNELS[: rep % len(KERNELS)]
                    for kernel in order:
                        for m in modules:
                            m.forced = kernel
                        t0 = time.perf_counter()
                        forward(ids, cache)
                        elapsed = (time.perf_counter() - t0) * 1000.0
                        cache.crop(-r)
                        if rep >= warmup:
                            times[(r, kernel)].append(elapsed)
        for m in modules:
            m.forced = None
        choices = []
        for r in rows:
            ms = {k: round(float(statistics.median(times[(r, k)])), 4) for k in KERNELS}
            choices.append(KernelChoice(r, min(ms, key=lambda k: ms[k]), ms))
        plan = KernelPlan(tuple(choices), context)
        _PLANS.plans[key] = KernelPlan(plan.choices, context, cached=True)
    by_rows = ["gemm"] + [plan.kernel_for(r) for r in range(1, rows[-1] + 1)]
    for m in modules:
        m.set_plan(by_rows)
    return plan


def engine_forward(model: Any) -> tuple[Callable[[list[int], Any], Any], Callable[[], Any]]:
    """``(forward, new_cache)`` of the path the live engine runs for ``model`` (the lean forward for GPT-2)."""
    import torch

    runner = lean_runner(model)
    if runner is not None:
        return runner, runner.new_cache

    def forward(ids: list[int], cache: Any) -> Any:
        x = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
        return model(input_ids=x, cache=cache, use_cache=True).logits

    from transformers import DynamicCache

    return forward, DynamicCache
