"""Engines that play rounds, split by what they depend on:

* :mod:`~specgym.envs.engines.replay`: trace replay (numpy only);
* :mod:`~specgym.envs.engines.live`: live decoding with real models, the recorder and the profiler (torch);
* :mod:`~specgym.envs.engines.serving`: vLLM (its own environment).

``tests/test_structure.py`` keeps replay free of torch and of the other two, and live free of vLLM.
"""

from specgym.envs.engines.replay.trace_engine import ReplayRequest, TraceEngine, VectorReplay

__all__ = ["ReplayRequest", "TraceEngine", "VectorReplay"]
