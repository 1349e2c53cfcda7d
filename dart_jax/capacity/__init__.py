"""Capacity planning: per-chip memory of a trainer config (`dart-jax plan`), chip tables."""
