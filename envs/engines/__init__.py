"""Engines that play rounds: trace replay (numpy) and live decoding with real models (torch, imported lazily),
plus the recorder and profiler that turn a real pair into traces and cost profiles."""

from specgym.envs.engines.trace_engine import ReplayRequest, TraceEngine, VectorReplay

__all__ = ["ReplayRequest", "TraceEngine", "VectorReplay"]
