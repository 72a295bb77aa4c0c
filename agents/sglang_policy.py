"""A specgym batch controller (a rule or an exported batch policy) as SGLang's ``AdaptiveSpecPolicy`` (numpy only).

SGLang's adaptive speculative decoding asks a policy object for the draft steps of every decode batch. The
Protocol, as read in SGLang 0.5.23 (the PyPI wheel, ``sglang/srt/speculative/adaptive_runtime_state.py``; the same
in sgl-project/sglang commit ``02a3cd954bab7765c272d17886e8af5ca7add79d``; made pluggable by sgl-project/sglang#37274):

* ``candidate_steps`` (a property): every step count the policy may return; SGLang builds one runtime state
  (attention backends, CUDA graphs) per candidate at start-up (``AdaptiveController.init_states``);
* ``set_cuda_graph_bs(cuda_graph_bs)`` then ``cuda_graph_bs_for_step(step)``: the captured batch sizes, and those a
  step can run at (here every one: any step may be chosen at any batch size; ``None`` without CUDA graphs);
* ``get_steps_for_batch(batch_size) -> int``: called before every decode batch
  (``AdaptiveController.activate_step_by_batch``, from ``EAGLEWorkerV2`` with ``batch.seq_lens.shape[0]``);
* ``on_verify_complete(num_correct_drafts_per_req, batch_size) -> int | None``: after the batch's verification,
  the accepted draft tokens of each request; a returned step makes SGLang switch at once. This adapter returns
  ``None``: the next ``get_steps_for_batch`` decides (so the controller is asked exactly once per batch, as in
  specgym's replay). It also accepts a third ``num_steps`` argument (the steps that ran), which some SGLang forks
  pass; the issue that asked for this module named it, the 0.5.23 Protocol does not have it.

**What the controller sees.** SGLang passes only the batch size and the accepted counts, so each batch is shown to
the specgym controller as: ``BatchState(batch=bs, queue=0, concurrency=bs, slots=0..bs-1)`` before it, and after it
``BatchStep(batch=bs, planned_k=steps for every request, accepted=num_correct_drafts_per_req, produced=sum(accepted
+ 1), time_ms=`` the batched cost profile's price of that step, or 0 without a profile ``)``. A controller whose
decisions read only these (every batch rule of specgym, an exported batch policy) makes in SGLang the decisions it
makes on that step sequence in specgym (``tests/test_sglang_export.py`` checks they are identical); one that reads
the queue or a per-sequence room left sees SGLang's view, not specgym's replay. A per-sequence decision (one K per
request) is refused: SGLang runs one step count per batch.

**Deploying.** SGLang 0.5.23 builds its policy at one site, ``EAGLEWorkerV2.__init__`` (``eagle_worker_v2.py``,
``AdaptiveController(self, AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...))`` when
``--speculative-adaptive`` is on); :func:`sglang_params_factory` gives a drop-in for that class name (see
``docs/guides/sglang.md``). Nothing here imports SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specgym.agents.specs import make
from specgym.envs.core.batch import BatchController, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError

_NONE = np.zeros(0, dtype=np.int64)


class SGLangPolicyBase:
    """SGLang's ``AdaptiveSpecPolicy`` around a ready batch controller (numpy only: ``specgym export --to sglang``
    copies this class's source into its self-contained module).

    Args:
        controller: Anything with a batch controller's ``propose(state)`` / ``observe(step)``, already reset.
        candidate_steps: The step counts SGLang may run, sorted, non-negative.
        k_max: The largest step count the controller was reset with.
        profile: What prices a step for the controller (``step_time(batch, k)``), or None.
    """

    def __init__(self, controller: Any, candidate_steps: Sequence[int], k_max: int, profile: Any = None):
        self.controller, self._steps, self.k_max, self.profile = controller, list(candidate_steps), k_max, profile
        self._cuda_graph_bs: list[int] | None = None
        self._last: tuple[int, int] | None = None  # (batch size, steps) of the batch in flight

    # ------------------------------------------------------------------ the AdaptiveSpecPolicy Protocol
    @property
    def candidate_steps(self) -> list[int]:
        """Every step count :meth:`get_steps_for_batch` may return."""
        return list(self._steps)

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        """The batch sizes SGLang captured CUDA graphs for (``None``: graphs off)."""
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        """The captured batch sizes ``step`` can run at: every one (any step at any batch size)."""
        if self._cuda_graph_bs is None:
            return None
        return list(self._cuda_graph_bs) if step in self._steps else []

    def get_steps_for_batch(self, batch_size: int) -> int:
        """The controller's step count for the next batch (asked once per batch), as a candidate."""
        bs = max(int(batch_size), 1)
        state = BatchState(bs, 0, bs, np.arange(bs, dtype=np.int64), _NONE)
        k = self.controller.propose(state)
        if not isinstance(k, (int, np.integer)):
            raise ValueError(f"{self.controller.name}: decided one K per sequence; SGLang runs one step count per "
                             f"batch (use a batch-wide controller)")
        steps = self.clamp(int(k))
        self._last = (bs, steps)
        return steps

    def on_verify_complete(self, num_correct_drafts_per_req: Sequence[int], batch_size: int = 0,
                           num_steps: int | None = None) -> int | None:
        """Show the controller the verified batch; returns None (the next :meth:`get_steps_for_batch` decides)."""
        accepted = np.asarray(list(num_correct_drafts_per_req), dtype=np.int64)
        bs = int(batch_size) or len(accepted)
        if num_steps is not None:
            steps = int(num_steps)
        elif self._last is not None:
            steps = self._last[1]
        else:  # verified before any decision (the engine's initial steps): nothing the controller chose
            return None
        self._last = None
        if len(accepted) != bs:
            raise ValueError(f"on_verify_complete: {len(accepted)} accepted counts for batch_size {bs}")
        planned = np.full(bs, steps, dtype=np.int64)
        time_ms = self.profile.step_time(bs, steps) if self.profile is not None else 0.0
        self.controller.observe(BatchStep(bs, 0, np.arange(bs, dtype=np.int64), planned, accepted,
                                          int(accepted.sum()) + bs, float(time_ms), 0, planned, steps))
        return None

    # ------------------------------------------------------------------ helpers
    def clamp(self, k: int) -> int:
        """``k`` as a candidate: the largest candidate at or below it, else the smallest."""
        below = [s for s in self._steps if s <= k]
        return below[-1] if below else self._steps[0]


class SpecgymSGLangPolicy(SGLangPolicyBase):
    """SGLang's ``AdaptiveSpecPolicy`` around a specgym :class:`~specgym.envs.core.batch.BatchController`.

    Args:
        controller: A batch controller, or its spec (``sglang-adaptive``, ``goodput``, ``table:[[1, 8, 4]]``,
            ``ppo:DIR`` of an exported batch-mode policy, ...: :mod:`specgym.agents.specs`).
        candidate_steps: The step counts SGLang may run (default ``0..k_max``); a decision is clamped to the largest
            candidate at or below it (the smallest candidate if none is).
        k_max: The largest step count (default: the largest candidate, else 8).
        profile: A batched cost profile (object, name or path) the controller prices steps with (rules such as
            ``goodput`` and exported policies need one: measure it where SGLang runs).
    """

    def __init__(self, controller: BatchController | str, candidate_steps: Sequence[int] | None = None,
                 k_max: int | None = None, profile: BatchCostProfile | str | None = None):
        steps = sorted({int(s) for s in candidate_steps}) if candidate_steps is not None else None
        if steps is not None and (not steps or steps[0] < 0):
            raise SpecgymError(f"candidate_steps must be non-negative integers, got {list(candidate_steps or [])}")
        k_max = int(k_max if k_max is not None else steps[-1] if steps else 8)
        if k_max < 1:
            raise SpecgymError(f"k_max must be >= 1, got {k_max}")
        ctrl = make(controller, k_max, kinds=("batch",)) if isinstance(controller, str) else controller
        if not isinstance(ctrl, BatchController):
            raise SpecgymError(f"{controller!r} is not a batch controller (SGLang runs one step count per batch)")
        prof = load_batch_profile(profile) if isinstance(profile, str) else profile
        if prof is not None:
            prof.check_k_max(k_max)
        ctrl.reset(prof, k_max)  # type: ignore[arg-type]  # rules that read no profile accept None
        super().__init__(ctrl, steps if steps is not None else range(k_max + 1), k_max, prof)

    def get_steps_for_batch(self, batch_size: int) -> int:
        try:
            return super().get_steps_for_batch(batch_size)
        except ValueError as exc:
            raise SpecgymError(str(exc)) from None

    def on_verify_complete(self, num_correct_drafts_per_req: Sequence[int], batch_size: int = 0,
                           num_steps: int | None = None) -> int | None:
        try:
            return super().on_verify_complete(num_correct_drafts_per_req, batch_size, num_steps)
        except ValueError as exc:
            raise SpecgymError(str(exc)) from None


def sglang_params_factory(controller: str, profile: str | None = None,
                          candidate_steps: Sequence[int] | None = None) -> Callable[..., SpecgymSGLangPolicy]:
    """A drop-in for SGLang's ``AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...)`` that builds a
    :class:`SpecgymSGLangPolicy` (the worker's ``initial_steps`` joins the candidates, as SGLang's own policy does,
    so the runtime state SGLang pre-built for it is reused)."""

    def build(initial_steps: int, cfg_path: str | None = None, **_: Any) -> SpecgymSGLangPolicy:
        steps = sorted({*(candidate_steps or range(int(initial_steps) + 1)), int(initial_steps)})
        return SpecgymSGLangPolicy(controller, steps, profile=profile)

    return build
