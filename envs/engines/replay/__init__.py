"""Replay engines (numpy only): rounds played from recorded traces with a cost model, for chains, trees and batches."""
