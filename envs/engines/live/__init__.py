"""Live engines (torch, imported lazily): decoding with a real draft/target pair, and what measures it (the recorder,
the profiler, the calibration, Ray-sharded recording). Nothing here imports vLLM."""
