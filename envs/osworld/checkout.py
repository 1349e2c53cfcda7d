"""OSWorld task JSONs: one checked (`load_task`), and a user's checkout of OSWorld
(`Checkout`): `evaluation_examples/examples/<domain>/<id>.json` and the index lists
`evaluation_examples/test_*.json` (`{"domain": ["id", ...]}`). Names that come from index
lists or off the wire are plain names (no separators, no `..`), files are regular files
(no symlinks) of bounded size; every refusal is a `TaskError`."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from envs.types import TaskError

MAX_TASK_BYTES = 1 << 20
MAX_INDEX_BYTES = 8 << 20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a domain or task id: one path part, no '..'


def load_task(source: dict | str | Path) -> dict:
    """An OSWorld example (a dict, JSON text or a path to a .json file), checked."""
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith(("{", "["))):
        try:
            source = Path(source).read_text()
        except OSError as e:
            raise TaskError(f"cannot read OSWorld task {source}: {e.strerror}") from None
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as e:
            raise TaskError(f"OSWorld task is not JSON: {e}") from None
    if not isinstance(source, dict):
        raise TaskError("an OSWorld task must be a JSON object")
    for key, kind in (("id", str), ("instruction", str), ("evaluator", dict)):
        if not isinstance(source.get(key), kind):
            raise TaskError(f"OSWorld task {source.get('id', '?')}: {key!r} must be a {kind.__name__}")
    func = source["evaluator"].get("func")
    if not (isinstance(func, str) or (isinstance(func, list) and func and all(isinstance(f, str) for f in func))):
        raise TaskError(f"OSWorld task {source['id']}: evaluator.func must be a name or a list of names")
    if not isinstance(source.get("config", []), list):
        raise TaskError(f"OSWorld task {source['id']}: config must be a list of setup steps")
    return source



class CatalogError(TaskError):
    """A checkout, index or task file that cannot be read as OSWorld's."""


@dataclasses.dataclass(frozen=True)
class Checkout:
    """A user's OSWorld checkout (its root folder)."""
    root: Path

    @property
    def examples(self) -> Path:
        return self.root / "evaluation_examples" / "examples"

    def indexes(self) -> list[str]:
        return sorted(p.name for p in (self.root / "evaluation_examples").glob("test_*.json"))

    def index(self, name: str = "test_all.json") -> dict[str, list[str]]:
        """An index list's tasks by domain, every name checked."""
        if not re.fullmatch(r"test_[A-Za-z0-9_]+\.json", name):
            raise CatalogError(f"index {name!r}: expected test_<name>.json")
        listing = _read_json(self.root / "evaluation_examples" / name, MAX_INDEX_BYTES)
        if not isinstance(listing, dict) or not all(isinstance(ids, list) for ids in listing.values()):
            raise CatalogError(f"index {name}: expected {{\"domain\": [\"id\", ...]}}")
        for domain, ids in listing.items():
            for part in (domain, *ids):
                _check_name(part, f"index {name}")
        return listing

    def task(self, domain: str, task_id: str) -> dict:
        """The task `<domain>/<id>`, read from the checkout and checked."""
        _check_name(domain, "domain")
        _check_name(task_id, "task id")
        example = load_task(_read_json(self.examples / domain / f"{task_id}.json", MAX_TASK_BYTES))
        if example["id"] != task_id:
            raise CatalogError(f"task {domain}/{task_id}: its file says id {example['id']!r}")
        return example

    def tasks(self, index: str = "test_all.json") -> list[tuple[str, dict]]:
        return [(domain, self.task(domain, i)) for domain, ids in self.index(index).items() for i in ids]


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise CatalogError(f"{what}: {str(name)[:100]!r} is not a plain name (letters, digits, _ . -)")


def _read_json(path: Path, limit: int):
    try:
        if path.is_symlink() or not path.is_file():
            raise CatalogError(f"{path}: not a regular file")
        if path.stat().st_size > limit:
            raise CatalogError(f"{path}: over {limit} bytes")
        return json.loads(path.read_text())
    except OSError as e:
        raise CatalogError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise CatalogError(f"{path}: not JSON ({e})") from None
