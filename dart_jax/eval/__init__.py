"""Held-out evaluation (`dart-jax eval`): episodes on the eval split, Wilson and paired intervals."""
