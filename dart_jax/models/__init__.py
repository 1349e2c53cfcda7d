"""Qwen2.5-VL policy in Flax NNX: config, host-side inputs, model, sharding rules, HF conversion and I/O.

Nothing here imports torch or transformers; see qwen25vl.py for the trainer-facing functions.
"""
