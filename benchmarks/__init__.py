"""Benchmarks: `python -m benchmarks.NAME`; each prints one JSON line with its figures and the machine."""
