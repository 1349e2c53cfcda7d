"""`run.seed` seeds every component of a run (and leaves explicit seeds alone when 0)."""

from dart_jax.config.loader import apply_overrides, from_dict
from dart_jax.run.schema import RunConfig


def test_the_run_seed_is_every_components_seed():
    cfg = from_dict(RunConfig, apply_overrides({}, ["run.seed=7", "trainer.seed=3"], "test")).seeded()
    assert (cfg.policy.tiny_seed, cfg.trainer.seed, cfg.rollout.engine.seed, cfg.eval.seed) == (7, 7, 7, 7)
    assert cfg.seeded() == cfg  # a resolved config stays as it is
    own = from_dict(RunConfig, apply_overrides({}, ["trainer.seed=3"], "test")).seeded()
    assert (own.policy.tiny_seed, own.trainer.seed, own.rollout.engine.seed, own.eval.seed) == (0, 3, 0, 0)
