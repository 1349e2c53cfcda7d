"""The trainer on its device: the GPU suite (`python -m benchmarks.gpu.gpu_suite OUT`), the
benchmarks its parts run (train step, vision tower, log-prob kernel, publish conversion), each
also a command of its own, and what they measure with (measure, memory_plan, op_profile)."""
