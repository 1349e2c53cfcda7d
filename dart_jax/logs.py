"""Structured per-role logging: JSON lines in the run directory, short lines on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, role, level, logger, message, extra fields."""

    def __init__(self, role: str):
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": round(record.created, 3), "role": self.role, "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _RESERVED})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(role: str, log_file: Path | None = None, level: str = "INFO") -> logging.Logger:
    """Configure the root logger of a role process; returns the role's logger."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter(f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s",
                                           "%H:%M:%S"))
    root.addHandler(console)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
        handler.setFormatter(JsonFormatter(role))
        root.addHandler(handler)
    logging.Formatter.converter = time.gmtime
    logging.getLogger("absl").setLevel(max(logging.WARNING, root.level))  # orbax narrates every save
    # JAX tries every backend it knows and tells at INFO that a CPU host has no TPU
    logging.getLogger("jax._src.xla_bridge").setLevel(max(logging.WARNING, root.level))
    return logging.getLogger(f"dart_jax.{role}")
