"""Paths that arrive on the wire, confined to the directories a request may reach.

A request names a path relative to a base directory (the data manager's run directory, an
env host's OSWorld task directory), or an absolute path inside one of the allowed roots
(the base is always one). The path is resolved, symlinks followed, before the check, so a
symlink pointing out is refused like an absolute path outside; `..` is refused outright.
Every refusal is a `PathRefused` (a ValueError) naming the field; receivers answer it with
a `bad_request` error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


class PathRefused(ValueError):
    """A requested path reaches outside the roots the request may touch."""


def roots(base: Path, extra: Sequence[str] = ()) -> tuple[Path, ...]:
    """`base` and the configured roots (relative ones taken in `base`), resolved."""
    return tuple((Path(base) / r).resolve() for r in ("", *extra))


def confine(requested: str, base: Path, allowed: Sequence[Path], field: str = "path") -> Path:
    """`requested` (relative to `base`) resolved, if inside one of `allowed`; else PathRefused."""
    path = Path(requested)
    if ".." in path.parts:  # refused even where it would stay inside: no path games at all
        raise PathRefused(f"{field}: {requested!r} contains '..'")
    return check_inside(Path(base) / path, allowed, f"{field}: {requested!r}")


def check_inside(path: Path, allowed: Sequence[Path], what: str) -> Path:
    """`path` resolved (symlinks followed), if inside one of `allowed` (resolved roots)."""
    resolved = path.resolve()
    if not any(resolved.is_relative_to(root) for root in allowed):
        raise PathRefused(f"{what} resolves to {resolved}, outside {', '.join(map(str, allowed))}")
    return resolved
