"""The core types every backend speaks: tasks, observations, actions and the Env protocol.

Coordinates in an `Action` are screen pixels (the backend's own screenshot space); the
model's resized-image space exists only in `envs.actions`, which maps both ways.
This package never imports JAX or torch: it runs on environment hosts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Protocol, runtime_checkable

ActionKind = Literal["click", "left_double", "right_single", "drag", "hotkey", "type",
                     "scroll", "wait", "finished", "call_user"]
ACTION_KINDS: tuple[str, ...] = ActionKind.__args__  # type: ignore[attr-defined]
POINT_KINDS = frozenset({"click", "left_double", "right_single", "drag", "scroll"})
TERMINAL_KINDS = frozenset({"finished", "call_user"})
ScrollDirection = Literal["up", "down", "left", "right"]
Point = tuple[float, float]


class TaskError(ValueError):
    """The task itself is bad (unknown name, malformed config): the caller's mistake."""


class EnvError(RuntimeError):
    """The environment itself failed (browser or VM crash, timeout): not the agent's fault.
    The episode ends with status `env_error` and the slot restarts its backend."""


@dataclasses.dataclass(frozen=True)
class Task:
    """One task instance. `id` is unique across backends ("miniwob/click-button/7");
    `instruction` may be empty when the backend generates it on reset (MiniWoB++)."""
    id: str
    backend: str
    name: str
    seed: int = 0
    instruction: str = ""
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: Any) -> "Task":
        """From a wire `TaskSpec`; its `config` is a JSON object (or empty)."""
        try:
            config = json.loads(spec.config) if spec.config else {}
        except json.JSONDecodeError as e:
            raise TaskError(f"task {spec.task_id}: config is not JSON ({e})") from None
        if not isinstance(config, dict):
            raise TaskError(f"task {spec.task_id}: config must be a JSON object")
        return cls(id=spec.task_id, backend=spec.backend, name=spec.name, seed=spec.seed,
                   instruction=str(config.get("instruction", "")), config=config)


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the agent sees: a PNG screenshot of `width` x `height` screen pixels, the
    instruction, and optionally a text rendering of the DOM / accessibility tree."""
    screenshot: bytes
    width: int
    height: int
    instruction: str
    dom_text: str = ""


@dataclasses.dataclass(frozen=True)
class Action:
    """One UI-TARS-1.5 action in screen pixels. `point` is the click/drag-start/scroll
    position, `end_point` the drag end; `keys` the hotkey keys (lowercase, in order);
    `content` the typed text (a trailing newline presses Enter) or the final answer."""
    kind: ActionKind
    point: Point | None = None
    end_point: Point | None = None
    keys: tuple[str, ...] = ()
    content: str = ""
    direction: ScrollDirection | Literal[""] = ""
    thought: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}")
        if self.kind in POINT_KINDS - {"scroll"} and self.point is None:
            raise ValueError(f"{self.kind} needs a point")
        if self.kind == "drag" and self.end_point is None:
            raise ValueError("drag needs an end point")
        if self.kind == "hotkey" and not self.keys:
            raise ValueError("hotkey needs keys")
        if self.kind == "scroll" and self.direction not in ("up", "down", "left", "right"):
            raise ValueError(f"scroll direction must be up/down/left/right, got {self.direction!r}")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The outcome of one action. `done`: the episode is over (the task ended it, or a
    terminal action). `info` carries backend details for logs, never for the reward."""
    observation: Observation
    done: bool
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """One environment instance (one slot). Calls come from a single thread at a time.
    Backend failures raise `EnvError`; `evaluate` is valid after any step and returns the
    task's reward in [0, 1] for the episode so far."""

    def reset(self, task: Task) -> Observation: ...

    def step(self, action: Action) -> StepResult: ...

    def evaluate(self) -> float: ...

    def close(self) -> None: ...
