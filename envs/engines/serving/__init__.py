"""Serving engines (vLLM, in its own environment): vLLM's offline engine, its metrics hook and its measured profile."""
