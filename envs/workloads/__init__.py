"""Workload data: the Parquet trace format, the synthetic generator and the shipped workloads."""

from specgym.envs.workloads.trace_format import (
    Workload, cached_workload, list_workloads, load_workload, resolve_workload_path, save_workload,
)

__all__ = ["Workload", "cached_workload", "list_workloads", "load_workload", "resolve_workload_path", "save_workload"]
