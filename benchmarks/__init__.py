"""Benchmarks by kind: `components/` (one part of the system), `experiments/` (whole runs
compared), `gpu/` (the trainer on its device, and the GPU suite). `python -m
benchmarks.KIND.NAME`; each prints one JSON line with its figures and the machine."""
