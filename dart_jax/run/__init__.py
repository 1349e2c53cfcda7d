"""`dart-jax run`: orchestration of whole runs: the supervisor, its launchers, the phases."""
