"""Switch costs of a serving engine: changing a step's K tier is not free.

A serving engine runs each step as a CUDA graph captured for a number of speculative tokens; the **tier** of a step
is the longest draft it asks for (the K the step runs as, whether or not a request near its end drafts that many;
verification trimmed inside a tier, as vLLM's adaptive verification does, keeps the tier). Three published effects,
one record (:class:`SwitchCosts`), paid by every controller because the engine charges them:

* ``per_switch_ms``: a fixed cost each time the tier changes (inference-lab's ``SwitchConstraints`` cost per
  switch; a graph swap, a re-plan of the draft buffers);
* ``cooldown_steps``: after a switch the tier is held that many steps (inference-lab's cooldown in rounds): the step
  runs at the held tier whatever it asked (every sequence drafts the tier; verification is cut to it);
* ``captured`` with ``outside_slowdown``: the tiers captured as CUDA graphs (SGLang runs only captured tiers); a
  step at a tier outside them runs eager/piecewise, its time multiplied by ``outside_slowdown``. vLLM's batch-size
  table forces a FULL -> PIECEWISE graph downgrade measured at -14% single-stream (vllm#49548): a slowdown of
  ``1 / (1 - 0.14) = 1.163``, the default of :data:`VLLM_PIECEWISE_SLOWDOWN`.

The first step of a run sets the tier without paying a switch.
"""

from __future__ import annotations

from dataclasses import dataclass

from specgym.errors import SpecgymError

#: The step-time factor of a FULL -> PIECEWISE CUDA-graph downgrade, from vllm#49548's -14% single-stream.
VLLM_PIECEWISE_SLOWDOWN = 1.0 / (1.0 - 0.14)


@dataclass(frozen=True)
class SwitchCosts:
    """What changing a step's K tier costs (module docstring).

    Attributes:
        per_switch_ms: Added to a step whose tier differs from the previous step's.
        cooldown_steps: Steps after a switch during which the tier is held.
        captured: Captured tiers (empty: every tier is captured, nothing is slowed).
        outside_slowdown: Step-time factor of a tier outside ``captured``.
    """

    per_switch_ms: float = 0.0
    cooldown_steps: int = 0
    captured: tuple[int, ...] = ()
    outside_slowdown: float = VLLM_PIECEWISE_SLOWDOWN

    def __post_init__(self) -> None:
        if not self.per_switch_ms >= 0.0:
            raise SpecgymError(f"switch costs: per_switch_ms must be >= 0, got {self.per_switch_ms}")
        if self.cooldown_steps < 0:
            raise SpecgymError(f"switch costs: cooldown_steps must be >= 0, got {self.cooldown_steps}")
        if any(k < 0 for k in self.captured):
            raise SpecgymError(f"switch costs: captured tiers must be >= 0, got {self.captured}")
        if not self.outside_slowdown >= 1.0:
            raise SpecgymError(f"switch costs: outside_slowdown must be >= 1, got {self.outside_slowdown}")
        object.__setattr__(self, "captured", tuple(sorted(set(int(k) for k in self.captured))))

    @property
    def free(self) -> bool:
        """True when switching costs nothing (the engine skips the bookkeeping)."""
        return self.per_switch_ms == 0.0 and self.cooldown_steps == 0 and not self.captured

    def slowdown(self, tier: int) -> float:
        """The step-time factor of running at ``tier``."""
        return 1.0 if not self.captured or tier in self.captured else self.outside_slowdown

    @classmethod
    def parse(cls, text: str) -> SwitchCosts:
        """``ms=0.5,cooldown=4,captured=0-1-3-5,slowdown=1.16`` (any subset; ``off``/``none``: free)."""
        if text.strip().lower() in ("off", "none", ""):
            return cls()
        kw: dict[str, object] = {}
        for part in text.split(","):
            key, sep, val = part.partition("=")
            key = key.strip().lower()
            try:
                if key == "ms":
                    kw["per_switch_ms"] = float(val)
                elif key == "cooldown":
                    kw["cooldown_steps"] = int(val)
                elif key == "captured":
                    kw["captured"] = tuple(int(v) for v in val.split("-") if v.strip())
                elif key == "slowdown":
                    kw["outside_slowdown"] = float(val)
                else:
                    raise SpecgymError(f"switch costs {text!r}: unknown key {key!r} (ms, cooldown, captured, "
                                       f"slowdown)")
            except ValueError:
                raise SpecgymError(f"switch costs {text!r}: bad value {val!r} for {key!r}") from None
            if not sep:
                raise SpecgymError(f"switch costs {text!r}: expected key=value, got {part!r}")
        return cls(**kw)  # type: ignore[arg-type]
