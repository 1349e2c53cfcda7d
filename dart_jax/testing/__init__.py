"""Harnesses that tests and benchmarks share: a live system on loopback, synthetic trajectories.
Never imported by a role."""
