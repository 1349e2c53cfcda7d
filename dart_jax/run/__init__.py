"""`dart-jax run`: whole runs. The run config, the supervisor and its launchers, presets."""
