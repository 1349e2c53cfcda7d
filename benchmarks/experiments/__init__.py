"""Learning experiments: whole `dart-jax run`s compared (the learning sweep, the curation ablation,
async vs sync): `python -m benchmarks.experiments.NAME`."""
