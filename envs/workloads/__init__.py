"""Workload data: the Parquet trace format, the synthetic generator and the shipped workloads (named through
:mod:`specgym.catalogue`)."""

from specgym.envs.workloads.trace_format import Workload, cached_workload, load_workload, save_workload

__all__ = ["Workload", "cached_workload", "load_workload", "save_workload"]
