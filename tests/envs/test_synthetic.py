"""The synthetic suite: deterministic by seed, solvable by its oracle, milliseconds a step."""

import time

import pytest

from envs import actions, dom, oracle
from envs.synthetic import TASKS, WORDS, SyntheticEnv
from envs.types import Action, Task, TaskError


def _task(name: str, seed: int, difficulty: int = 1, **config) -> Task:
    return Task(id=f"synthetic/{name}/{seed}", backend="synthetic", name=name, seed=seed,
                config={"difficulty": difficulty, **config})


def run_oracle(env, task: Task, max_steps: int = 30) -> tuple[float, int]:
    obs = env.reset(task)
    for step in range(1, max_steps + 1):
        text = oracle.act(task.backend, task.name, obs)
        result = env.step(actions.parse(text, (obs.width, obs.height)))
        obs = result.observation
        if result.done:
            break
    return env.evaluate(), step


@pytest.mark.parametrize("name", TASKS)
def test_deterministic_by_seed(name):
    a, b = SyntheticEnv(), SyntheticEnv()
    first = a.reset(_task(name, 7, 3))
    assert first == b.reset(_task(name, 7, 3))
    assert first.instruction != a.reset(_task(name, 8, 3)).instruction or first.dom_text != a.observe().dom_text


@pytest.mark.parametrize("difficulty", [1, 2, 3])
@pytest.mark.parametrize("name", TASKS)
def test_oracle_solves_every_task(name, difficulty):
    env = SyntheticEnv()
    results = [run_oracle(env, _task(name, seed, difficulty)) for seed in range(20)]
    assert all(reward == 1.0 for reward, _ in results)
    if difficulty == 3 and name in ("click-button", "select-item", "check-boxes"):
        assert max(steps for _, steps in results) > 1  # targets below the fold need scrolling


def test_wrong_choice_scores_zero_and_finished_ends():
    env = SyntheticEnv()
    obs = env.reset(_task("click-button", 1))
    target = obs.instruction.split('"')[1]
    wrong = next(e for e in dom.parse(obs.dom_text) if e.label != target)
    result = env.step(Action(kind="click", point=wrong.center))
    assert result.done and env.evaluate() == 0.0
    env.reset(_task("enter-text", 1))
    assert env.step(Action(kind="finished")).done and env.evaluate() == 0.0


def test_every_action_kind_is_accepted_and_steps_are_fast():
    env = SyntheticEnv()
    env.reset(_task("form", 3, 3))
    kinds = [Action(kind="click", point=(50, 80)), Action(kind="left_double", point=(1, 1)),
             Action(kind="right_single", point=(5, 5)), Action(kind="drag", point=(1, 1), end_point=(9, 9)),
             Action(kind="hotkey", keys=("ctrl", "a")), Action(kind="type", content="x"),
             Action(kind="scroll", direction="down"), Action(kind="wait")]
    start = time.perf_counter()
    for i in range(200):
        assert not env.step(kinds[i % len(kinds)]).done
    assert (time.perf_counter() - start) / 200 < 0.05
    assert env.step(Action(kind="call_user")).done


def test_unknown_task_and_difficulty_are_errors():
    with pytest.raises(ValueError, match="unknown synthetic task"):
        SyntheticEnv().reset(_task("nope", 0))
    with pytest.raises(ValueError, match="difficulty"):
        SyntheticEnv(difficulty=4)


def test_a_smaller_vocabulary_draws_only_its_words_and_the_oracle_still_solves_it():
    env = SyntheticEnv()
    words = {env.reset(_task("enter-text", seed, words=3)).instruction.split('"')[1] for seed in range(60)}
    assert words == set(WORDS[:3])
    assert env.reset(_task("enter-text", 5, words=len(WORDS))) == env.reset(_task("enter-text", 5))
    assert all(run_oracle(env, _task("check-boxes", seed, 1, words=4))[0] == 1.0 for seed in range(10))


@pytest.mark.parametrize("words", [0, len(WORDS) + 1, "4", True, 2.5])
def test_a_vocabulary_outside_the_word_list_is_a_task_error(words):
    with pytest.raises(TaskError, match="config.words"):
        SyntheticEnv().reset(_task("enter-text", 0, words=words))


def test_x_span_narrows_where_widgets_lie_and_the_oracle_still_solves_it():
    env = SyntheticEnv()
    assert env.reset(_task("enter-text", 7, x_span=220)) == env.reset(_task("enter-text", 7))
    lefts = set()
    for seed in range(40):
        env.reset(_task("enter-text", seed, x_span=30))
        lefts |= {w.x for w in env.scene.widgets}
        assert run_oracle(env, _task("enter-text", seed, x_span=30))[0] == 1.0
    assert min(lefts) == 10 and max(lefts) == 40
    env.reset(_task("enter-text", 3, x_span=0))
    assert {w.x for w in env.scene.widgets} == {10}


@pytest.mark.parametrize("span", [-1, 221, "100", True, 50.0])
def test_an_x_span_off_the_screen_is_a_task_error(span):
    with pytest.raises(TaskError, match="config.x_span"):
        SyntheticEnv().reset(_task("enter-text", 0, x_span=span))


def test_a_vocabulary_too_small_for_the_task_is_a_task_error():
    with pytest.raises(TaskError, match="select-item/0"):
        SyntheticEnv().reset(_task("select-item", 0, 1, words=5))  # 8 distinct list entries


def test_latency_draws_are_heavy_tailed_seeded_and_capped():
    import random
    import statistics


    from envs.config import Latency
    from envs.synthetic import delay
    lat = Latency(kind="lognormal", median_s=2.0, sigma=1.0, max_s=30.0, seed=3)
    draws = [delay(lat, random.Random(f"{lat.seed}:0")) for _ in range(1)] + \
        [delay(lat, rng) for rng in [random.Random(7)] for _ in range(4000)]
    assert draws[0] == delay(lat, random.Random(f"{lat.seed}:0"))  # seeded
    assert 1.8 < statistics.median(draws) < 2.2 and max(draws) == 30.0  # median as set; the tail is capped
    assert statistics.mean(draws) > 1.4 * statistics.median(draws)  # heavy right tail
    assert delay(Latency(kind="fixed", median_s=0.5), random.Random(0)) == 0.5
    assert delay(Latency(), random.Random(0)) == 0.0


def test_a_slot_with_latency_takes_that_long():
    from envs.config import Latency
    env = SyntheticEnv(latency=Latency(kind="fixed", median_s=0.05))
    start = time.monotonic()
    env.reset(_task("click-button", 0))
    assert time.monotonic() - start >= 0.05


@pytest.mark.parametrize("name", TASKS)
def test_each_elements_point_clicks_that_element(name):
    """`dom.with_points` (what the env server sends): clicking an on-screen element's point,
    written as the model writes it, lands on that element (the action space's round trip)."""
    env = SyntheticEnv(difficulty=2)
    for seed in range(5):
        obs = env.reset(_task(name, seed, 2))
        screen = (obs.width, obs.height)
        text = dom.with_points(obs.dom_text, lambda p: actions.to_model(p, screen))
        assert dom.with_points(text, lambda p: (0, 0)) == text  # points are added once
        for element in dom.parse(text):
            x, y, w, h = element.box
            if y < 40 or y + h > obs.height:  # under the instruction header, or scrolled off
                continue
            point = element.attrs["point"]
            action = actions.parse(f"Action: click(start_box='{point}')", screen)
            assert env._hit(action.point).ref == element.ref, (name, seed, element, point)
