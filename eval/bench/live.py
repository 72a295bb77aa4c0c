"""Live-engine benchmark (``specgym bench live``): sim-to-real for every controller on a real pair.

On test prompts of a workload recorded from the pair (the same requests the replay harness evaluates), every
controller decodes live, with the pair on this machine. What makes the figures trustworthy:

* **the fastest plain path**: the pair loads with each linear layer's kernel chosen by measurement for each row count
  (:mod:`specgym.envs.engines.live.fast_linear`; printed), and the bench prints the target's one- and two-token forwards
  through the engine, so every speedup is against plain decoding at its best on this machine;
* **a profile of this machine, fitted to the engine's own rounds** (:mod:`specgym.envs.engines.live.calibration`, on
  train-split prompts, never the measured ones) unless ``profile`` names one; the micro-benchmarked profile
  (:func:`~specgym.envs.engines.live.profiler.measure_profile`) is measured too and its prediction printed beside, as a
  cross-check. Controllers see the profile in use, and the replay prediction prices their rounds with it;
* **paired statistics**: per prompt, every controller runs back to back (order rotated per prompt and repeat, so a
  drifting machine slows all alike), ``repeats`` times; a prompt's time is the median of its repeats; each
  controller's speedup over the best fixed K (and over plain decoding) carries a paired bootstrap 95% interval over
  prompts (:class:`~specgym.eval.stats.PairedBootstrap`), and a row whose interval contains 1 is a **tie**;
* whether every greedy output equals plain decoding, token for token;
* once through transformers' ``generate(assistant_model=...)`` (:func:`generate_with_controller`) with the best
  chain controller, against transformers' own plain ``generate()``.

**Drafter-choice controllers** (the ``drafter`` kind: ``fixed:K@DRAFTER``, ``lookup-rule[:N]``,
``drafter-marginal``, drafter policies) choose each round between the draft model (``draft``), the engine's
prompt-lookup drafter (``ngram``, :mod:`~specgym.envs.core.ngram_proposer`) and, for a pair with one, its draft head
(``head``), greedy or sampled, in the same rotation; the workload gains those drafters' per-start runs where it
lacks them (recomputed per request as the recorder stores them,
:func:`~specgym.envs.engines.live.recorder.with_drafter_runs`), which the fitting rules fit on and the replay prediction
reads.

**Tree controllers** (specs starting with ``tree``: ``tree-static:W1-W2-..``, ``tree-sequoia[:BUDGET]``,
``tree-eagle[:DEPTH:BEAM:M]`` (exact live; its replay prediction is approximate), ``tree-chain:SPEC``; greedy
workloads) decode through live tree verification (:mod:`~specgym.envs.engines.live.tree`)
in the same rotation, so their rows carry the same paired intervals against the best fixed K, and a ``tree vs chain``
line compares the fastest tree row (``tree-chain:SPEC`` rows are width-1 trees, i.e. chains, and do not count) with
the fastest chain row (paired interval over prompts), whatever the answer.
Their prices need verify cost by node count: the micro-benchmarked profile then measures tree verification up to
:data:`~specgym.envs.core.cost.TREE_NODE_LIMIT` nodes, and the profiles controllers see and the prediction uses gain
those costs (:func:`~specgym.envs.engines.live.profiler.extend_tree_verify`; the fitted ones come from chain rounds).
The prediction of a tree row is the tree replay (:mod:`~specgym.envs.engines.replay.tree_engine`) of the same requests;
``tree-chain:SPEC`` is predicted as SPEC (the width-1 tree is the chain round). ``acceptance`` of a tree row is
accepted tokens per verified node.

One torch thread. Results are printed and written as JSON (``--json``); the live table of
docs/results/live-midpair.md comes from here.

The bench runs in phases over one :class:`~specgym.eval.bench.live_config.LiveBenchConfig`, checked once when it is
made: :func:`~specgym.eval.bench.live_measure.open_bench` (the pair, the prompts, this machine's profile), every
row's controller built and prepared once (:class:`~specgym.eval.bench.live_measure.LiveControllers`),
:func:`~specgym.eval.bench.live_measure.measure` (with a progress bar over prompts x rows and the time left),
:func:`~specgym.eval.bench.live_predict.predict` and :func:`~specgym.eval.bench.live_report.report`.
"""

from __future__ import annotations

from typing import Any

from specgym.envs.engines.live.model_loading import load_pair
from specgym.errors import SpecgymError
from specgym.eval.bench.live_config import (
    DEFAULT_CALIBRATION_PROMPTS,
    DEFAULT_PER_CATEGORY,
    DEFAULT_REPEATS,
    LiveBenchConfig,
    check_live_specs,
    controller_specs,
    live_config,
)
from specgym.eval.bench.live_measure import LiveControllers, engine_forward_ms, measure, open_bench
from specgym.eval.bench.live_predict import predict
from specgym.eval.bench.live_report import LiveRow, report, verdict

__all__ = ["DEFAULT_CALIBRATION_PROMPTS", "DEFAULT_PER_CATEGORY", "DEFAULT_REPEATS", "LiveBenchConfig", "LiveRow",
           "check_live_specs", "controller_specs", "engine_forward_ms", "live_config", "live_section", "load_pair",
           "run_live_bench", "verdict"]


def run_live_bench(console: Any, config: LiveBenchConfig | None = None, **options: Any) -> dict[str, Any]:
    """Run the live benchmark; returns every figure (also printed as a table).

    Args:
        console: A rich console.
        config: What to run; ``None``: a :class:`LiveBenchConfig` of ``options`` (its fields: ``pair_name``,
            ``workload``, ``specs``, ``repeats`` ...), checked before anything loads.
        **options: The config's fields, when no ``config`` is given.
    """
    cfg = config if config is not None else LiveBenchConfig(**options)
    if config is not None and options:
        raise SpecgymError(f"run_live_bench: give a config or its fields, not both (got {', '.join(options)} too)")
    setup = open_bench(console, cfg)
    ctrls = LiveControllers.open(console, setup)
    measured = measure(console, cfg, setup, ctrls)
    predicted = predict(console, setup, measured, ctrls)
    return report(console, cfg, setup, measured, predicted, ctrls)


def live_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``live``: the sim-to-real benchmark on the test prompts of ``workload``, decoded by the pair it was recorded
    from (or ``--draft``/``--target``; skipped without torch/transformers). Its config is the one ``specgym bench``
    checked before anything ran (``args.live_config``), else made from ``args`` here."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        console.print(f"[yellow]live section skipped: {exc}[/yellow]")
        return {}
    cfg = getattr(args, "live_config", None) or live_config(args, workload)
    return {"live": run_live_bench(console, cfg)}
