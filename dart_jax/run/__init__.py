"""`dart-jax run` and the run-level commands: run config, supervisor, launchers, plan, TPU, HF import/export."""
