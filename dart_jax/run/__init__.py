"""`dart-jax run`: orchestration of whole runs: the run config (schema), the supervisor, its
launchers, the phases."""
