import dataclasses
from typing import Literal

import pytest

from dart_jax.config import ConfigError, bounded, dump, from_dict, load


@dataclasses.dataclass(frozen=True)
class Adam:
    type: Literal["adam"] = "adam"
    lr: float = bounded(1e-6, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)


@dataclasses.dataclass(frozen=True)
class Sgd:
    type: Literal["sgd"] = "sgd"
    momentum: float = bounded(0.0, ge=0, lt=1)


@dataclasses.dataclass(frozen=True)
class Trainer:
    optimizer: Adam | Sgd = Adam()
    steps: int = bounded(10, ge=1)
    mesh: tuple[int, ...] = (1,)
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    note: str | None = None

    def __post_init__(self):
        if len(self.mesh) > 3:
            raise ValueError("mesh has at most 3 axes")


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    trainer: Trainer = Trainer()


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_loads_nested_variant_and_overrides(tmp_path):
    path = write(tmp_path, "name: r\ntrainer:\n  optimizer: {type: sgd, momentum: 0.5}\n  mesh: [2, 4]\n")
    cfg = load(Run, path, ["trainer.steps=3", "trainer.tags.site=tpu", "trainer.optimizer.momentum=0.9"])
    assert cfg == Run("r", Trainer(Sgd(momentum=0.9), steps=3, mesh=(2, 4), tags={"site": "tpu"}))
    assert load(Run, write(tmp_path, dump(cfg))) == cfg


def test_switching_variant_by_override(tmp_path):
    cfg = load(Run, write(tmp_path, "name: r\n"), ["trainer.optimizer.type=sgd"])
    assert cfg.trainer.optimizer == Sgd()


def test_int_accepted_for_float(tmp_path):
    assert load(Run, write(tmp_path, "name: r\ntrainer: {optimizer: {lr: 1}}\n")).trainer.optimizer.lr == 1.0


@pytest.mark.parametrize("text, overrides, key, reason", [
    ("name: r\ntrainer: {stepz: 3}\n", [], "trainer.stepz", "unknown key"),
    ("name: r\ntrainer: {steps: three}\n", [], "trainer.steps", "expected int, got str 'three'"),
    ("name: r\ntrainer: {steps: true}\n", [], "trainer.steps", "expected int, got bool"),
    ("name: r\n", ["trainer.steps=0"], "trainer.steps", "must be >= 1, got 0"),
    ("name: r\n", ["trainer.optimizer.lr=-1"], "trainer.optimizer.lr", "must be > 0"),
    ("trainer: {}\n", [], "name", "required key is missing"),
    ("name: r\ntrainer: {optimizer: {type: lion}}\n", [], "trainer.optimizer.type", "must be one of"),
    ("name: r\ntrainer: {mesh: [1, 1, 1, 1]}\n", [], "trainer", "mesh has at most 3 axes"),
    ("name: r\ntrainer: {optimizer: {betas: [0.9]}}\n", [], "trainer.optimizer.betas", "expected 2 items"),
    ("name: r\ntrainer: 5\n", [], "trainer", "expected a mapping"),
    ("- a\n- b\n", [], "<root>", "top level must be a mapping"),
    ("name: [unclosed\n", [], "<root>", "invalid YAML"),
    ("name: r\n", ["name.sub=1"], "name", "is not a section"),
    ("name: r\n", ["noequals"], "noequals", "expected KEY=VALUE"),
])
def test_errors_name_file_key_and_reason(tmp_path, text, overrides, key, reason):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(Run, path, overrides)
    message = str(err.value)
    assert "\n" not in message
    assert err.value.key.startswith(key.replace("<root>", "")) and reason in message
    assert message.startswith(str(path)) or message.startswith("override")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: <root>: cannot read config file"):
        load(Run, tmp_path / "nope.yaml")


def test_from_dict_is_strict_about_nested_dicts():
    with pytest.raises(ConfigError, match=r"trainer.tags.a: expected str, got int"):
        from_dict(Run, {"name": "r", "trainer": {"tags": {"a": 1}}})


def test_exponent_floats_without_a_dot(tmp_path):
    cfg = load(Run, write(tmp_path, "name: r\ntrainer: {optimizer: {lr: 1e-6}}\n"), [])
    assert cfg.trainer.optimizer.lr == 1e-6
    assert load(Run, write(tmp_path, "name: r\n"), ["trainer.optimizer.lr=3E-4"]).trainer.optimizer.lr == 3e-4
    assert load(Run, write(tmp_path, "name: '1e5'\n")).name == "1e5"  # quoted stays a string
