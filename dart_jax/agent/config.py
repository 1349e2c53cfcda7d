"""The agent protocol's settings: how a prompt is built from the task, screenshots and history
(the rollout config's `prompt:` section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class PromptConfig:
    max_images: int = 5
    max_responses: int = 35
    language: str = "English"
    template: Literal["computer_use", "compact"] = "computer_use"  # the first user turn's text
    # the current screen's elements as text after its screenshot (the env's `dom_text`, each
    # element with its click point): an accessibility-tree observation beside the pixels
    screen_text: bool = False
    # where the task text goes: "first", the first user turn (UI-TARS); "last", the end of the
    # current user turn, after the screen, so it sits the same few tokens before every response
    # (a small policy finds a word it must copy at a fixed distance long before it learns to
    # search the whole context for it)
    task_position: Literal["first", "last"] = "first"

    def __post_init__(self):
        if self.max_images < 1 or self.max_responses < 0:
            raise ValueError("max_images must be >= 1 and max_responses >= 0")
        if self.task_position not in ("first", "last"):
            raise ValueError(f"prompt task_position {self.task_position!r}: first or last")
        if self.template not in ("computer_use", "compact"):
            raise ValueError(f"prompt template {self.template!r}: computer_use or compact")
