"""`run.seed` seeds every component of a run (and leaves explicit seeds alone when 0)."""

from dart_jax.config.loader import apply_overrides, from_dict
from dart_jax.data.tasks import write_task_file
from dart_jax.eval import main as evaluate
from dart_jax.run.schema import RunConfig
from dart_jax.rundir import RunDir
from dart_jax.wire.messages import TaskSpec


def test_the_run_seed_is_every_components_seed():
    cfg = from_dict(RunConfig, apply_overrides({}, ["run.seed=7", "trainer.seed=3"], "test")).seeded()
    assert (cfg.policy.tiny_seed, cfg.trainer.seed, cfg.rollout.engine.seed, cfg.eval.seed) == (7, 7, 7, 7)
    assert cfg.seeded() == cfg  # a resolved config stays as it is
    own = from_dict(RunConfig, apply_overrides({}, ["trainer.seed=3"], "test")).seeded()
    assert (own.policy.tiny_seed, own.trainer.seed, own.rollout.engine.seed, own.eval.seed) == (0, 3, 0, 0)


def test_dart_jax_eval_samples_with_the_run_seed_as_the_run_did(tmp_path, monkeypatch):
    """`dart-jax eval CONFIG run.seed=3` must seed its requests as `dart-jax run` seeded the
    run's own evaluation (the eval phase runs on the seeded config), or it plays other episodes."""
    cfg = from_dict(RunConfig, apply_overrides({}, ["run.seed=3", "data.tasks.task_file=tasks.jsonl"], "test"))
    run = RunDir.create(tmp_path / "run")
    write_task_file(run.root / "tasks.jsonl", [TaskSpec(task_id="synthetic/enter-text/10000", backend="synthetic",
                                                        name="enter-text", seed=10_000, split="eval")])
    seen = []

    async def play_nothing(run_cfg, policy_dir, tasks, endpoint):
        seen.append(run_cfg.eval.seed)
        return []

    monkeypatch.setattr(evaluate, "evaluate", play_nothing)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")  # a Hugging Face directory, never loaded here
    evaluate.main(cfg, run, tmp_path / "hf", "again")
    assert seen == [cfg.seeded().eval.seed] == [3]
