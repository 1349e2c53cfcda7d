"""A run's task suites: disjoint train and eval seeds, the suite's settings on every task."""

import json

import pytest

from dart_jax.config.loader import ConfigError, from_dict
from dart_jax.data.config import TasksConfig
from dart_jax.data.tasks import suite_tasks
from envs.types import Task


def test_a_suites_config_reaches_every_task_and_the_env_reads_it():
    tasks = from_dict(TasksConfig, {"suites": [{"backend": "synthetic", "names": ["enter-text"], "train_seeds": 3,
                                            "eval_seeds": 2, "config": {"words": 4, "difficulty": 2}}]})
    specs = suite_tasks(tasks)
    assert [(s.seed, s.split) for s in specs] == [(0, "train"), (1, "train"), (2, "train"),
                                                   (10_000, "eval"), (10_001, "eval")]
    assert {json.loads(s.config)["words"] for s in specs} == {4}
    assert Task.from_spec(specs[0]).config == {"difficulty": 2, "words": 4}
    plain = from_dict(TasksConfig, {"suites": [{"backend": "synthetic", "names": ["enter-text"]}]})
    assert {s.config for s in suite_tasks(plain)} == {""}


def test_suites_are_interleaved_in_proportion_so_a_short_run_trains_on_each():
    tasks = from_dict(TasksConfig, {"suites": [
        {"backend": "synthetic", "names": ["enter-text", "click-button"], "train_seeds": 4, "eval_seeds": 1},
        {"backend": "miniwob", "names": ["click-test"], "train_seeds": 2, "eval_seeds": 1}]})
    order = [(s.name, s.seed) for s in suite_tasks(tasks)]
    assert order == [("enter-text", 0), ("click-button", 0), ("click-test", 0), ("enter-text", 1),
                     ("click-button", 1), ("enter-text", 2), ("click-button", 2), ("click-test", 1),
                     ("enter-text", 3), ("click-button", 3),
                     ("enter-text", 10_000), ("click-button", 10_000), ("click-test", 10_000)]
    assert [s.split for s in suite_tasks(tasks)] == ["train"] * 10 + ["eval"] * 3


def test_a_suite_setting_that_is_not_an_integer_is_refused():
    with pytest.raises(ConfigError, match=r"suites\[0\].config.words: expected int"):
        from_dict(TasksConfig, {"suites": [{"backend": "synthetic", "names": ["enter-text"],
                                          "config": {"words": "many"}}]})


def test_the_old_job_key_still_loads_as_tasks_with_a_deprecation_line(caplog):
    from dart_jax.config.loader import apply_overrides
    from dart_jax.run.schema import RunConfig
    suites = "[{backend: synthetic, names: [enter-text], train_seeds: 2, eval_seeds: 0}]"
    old = from_dict(RunConfig, apply_overrides({}, [f"job.suites={suites}"], "old.yaml"), "old.yaml")
    new = from_dict(RunConfig, apply_overrides({}, [f"tasks.suites={suites}"], "new.yaml"), "new.yaml")
    assert old.tasks == new.tasks and len(suite_tasks(old.tasks)) == 2
    assert "old.yaml: `job` is deprecated: it is now `tasks`" in caplog.text
    with pytest.raises(ConfigError, match="renamed to `tasks`, which is also set"):
        from_dict(RunConfig, apply_overrides({}, [f"job.suites={suites}", f"tasks.suites={suites}"], "both.yaml"))
