"""The ``vllm.general_plugins`` entry point: a specgym batch controller decides vLLM's draft length every step.

vLLM loads general plugins in every process it starts (front end, engine core, workers) and calls
:func:`register` in each. It is a no-op unless ``SPECGYM_VLLM`` is set, so installing specgym next to vLLM changes
nothing by itself. With ``SPECGYM_VLLM=1`` it patches vLLM's scheduler
(:func:`specgym.envs.engines.serving.vllm_hook.install`)
so that the engine core accepts ``specgym_configure`` / ``specgym_take_log`` utility calls (what
``specgym bench vllm`` uses); with ``SPECGYM_VLLM_CONTROLLER=SPEC`` every engine started afterwards
decides K with that controller from its first step::

    SPECGYM_VLLM_CONTROLLER=goodput SPECGYM_VLLM_PROFILE=vllm-midpair.json \\
        vllm serve data/models/midpair/target --speculative-config \\
        '{"method": "draft_model", "model": "data/models/midpair/draft", "num_speculative_tokens": 6,
          "num_speculative_tokens_per_batch_size": [[1, 16, 6]]}'

The engine must be built with speculation (``num_speculative_tokens`` = the largest K the controller may choose);
the controller's K is clipped to it. Any :mod:`specgym.agents.specs` batch spec works:
``goodput`` (SmartSpec's rule on the measured profile), ``table:[[start, end, K], ...]``, ``static:K``, or an
exported batch policy ``ppo:NAME``; a controller that returns one K per sequence is refused (vLLM drafts one K per
step for the whole batch).
"""

from __future__ import annotations

import os

from specgym.agents.specs import make
from specgym.envs.core.batch import BatchController
from specgym.envs.engines.serving.vllm_hook import install, set_startup_config
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError

#: Turns the plugin on (``1``) in the processes vLLM starts; set by specgym's own vLLM runs.
ENV_ON = "SPECGYM_VLLM"
#: A batch controller spec: every engine decides K with it from the first step.
ENV_CONTROLLER = "SPECGYM_VLLM_CONTROLLER"
#: The batched cost profile (name or path) the controller prices steps with.
ENV_PROFILE = "SPECGYM_VLLM_PROFILE"
#: Controllers that only read the batch size: no profile needed.
_PROFILE_FREE = ("static:", "table:")


def controller_factory(spec: str, k_max: int, profile: str | None) -> BatchController:
    """A batch controller from its spec, reset on ``profile`` with ``k_max`` (the engine's largest K)."""
    ctrl = make(spec, k_max, kinds=("batch",))
    if profile is None and not spec.startswith(_PROFILE_FREE):
        raise SpecgymError(f"controller {spec!r} prices steps with a batched cost profile: set {ENV_PROFILE} (e.g. "
                           "the one `specgym profile --engine vllm` writes)")
    prof = load_batch_profile(profile) if profile is not None else None
    if prof is not None:
        prof.check_k_max(k_max)
    ctrl.reset(prof, k_max)  # type: ignore[arg-type]
    return ctrl


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    spec = os.environ.get(ENV_CONTROLLER)
    if not spec and os.environ.get(ENV_ON, "") in ("", "0"):
        return
    profile = os.environ.get(ENV_PROFILE) or None
    if spec:  # a bad spec or profile fails here, in the front end, before any engine starts
        make(spec, 8, kinds=("batch",))
        if profile is not None:
            load_batch_profile(profile)
    if install(controller_factory) and spec:
        set_startup_config({"policy": spec, "profile": profile})
