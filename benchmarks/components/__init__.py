"""Component benchmarks: one part of the system at a time (data manager, env server, rollout worker,
weight sync, HF import, desktop VMs, log-prob parity): `python -m benchmarks.components.NAME`."""
