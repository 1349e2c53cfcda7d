"""The agent side of the policy: UI-TARS prompts as token ids (no torch, no JAX)."""

from dart_jax.agent.prompt import (ACTION_SPACE, COMPUTER_USE_PROMPT, SYSTEM_PROMPT, Prompt, PromptBuilder,
                                   PromptConfig, build_messages, history_form, render)

__all__ = ["ACTION_SPACE", "COMPUTER_USE_PROMPT", "SYSTEM_PROMPT", "Prompt", "PromptBuilder", "PromptConfig",
           "build_messages", "history_form", "render"]
