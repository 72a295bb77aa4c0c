"""The speculative-decoding world a controller acts in, grouped by layer:

* :mod:`~specgym.envs.core`: round records, cost model, controller interface, request shape, the ``drive`` loop,
  observation features;
* :mod:`~specgym.envs.workloads`: data (trace format, synthetic generator, shipped workloads);
* :mod:`~specgym.envs.engines`: engines (trace replay, live decoding, recorder, profiler);
* :mod:`~specgym.envs.gym`: the Gymnasium environments.
"""
