"""Typed configs: frozen dataclasses per role, loaded from configs/*.yaml (see loader)."""

from dart_jax.config.loader import (ConfigError, UsageError, apply_overrides, bounded, dump, from_dict,
                                    load, to_dict)

__all__ = ["ConfigError", "UsageError", "apply_overrides", "bounded", "dump", "from_dict", "load", "to_dict"]
