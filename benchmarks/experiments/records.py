"""Records of benchmark runs that outlive their machine. One seed of the curation benchmark is
about 2 h on a 2-core machine, one learning-sweep run about 12 min: a benchmark of several is
measured in separate sittings, often on fresh machines where the run directories of the last
sitting are gone. When a unit (a seed, a run) finishes, its record (what the tables need, not
the run directory) is written into a folder kept in the repository; a later invocation with the
same settings reads it instead of running the unit again. A record written under other settings
(another config text, overrides or bar) is refused, naming what differs: pooled units must be
runs of one experiment.

    setting = settings(config, overrides, bar=...)
    body = read(path, "curation", {"seed": 0}, setting)           # None: not recorded yet
    body = body or write(path, "curation", {"seed": 0}, setting, measure())

On disk: {"benchmark", the identity's fields, "settings", "commit", "machine", "written", and
the body's fields}.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from benchmarks.common import commit, machine

META = ("benchmark", "settings", "commit", "machine", "written")


class RecordError(ValueError):
    """A record that cannot be pooled with this invocation's runs."""


def settings(config: Path, overrides: list[str], **more) -> dict:
    """What makes two units one experiment: the config file's text (its sha256), the overrides
    every unit shares, and whatever else the benchmark names (JSON values)."""
    setting = {"config_sha256": hashlib.sha256(Path(config).read_bytes()).hexdigest(), "budget": list(overrides), **more}
    return json.loads(json.dumps(setting))  # as a record reads back (tuples become lists)


def write(path: Path, benchmark: str, ident: dict, setting: dict, body: dict) -> dict:
    """Records a finished unit (written whole: temp + rename); returns it as `read` would."""
    record = {"benchmark": benchmark, **ident, "settings": setting, "commit": commit(), "machine": machine(),
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **body}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return read(path, benchmark, ident, setting)


def read(path: Path, benchmark: str, ident: dict, setting: dict) -> dict | None:
    """The record at `path` (its body, with "commit", "machine" and "written"), or None where
    there is none; RecordError for one that is unreadable, of another unit, or of another
    experiment."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        theirs = record["settings"]
        got = {k: record[k] for k in ("benchmark", *ident)}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RecordError(f"{path}: not a readable record ({type(e).__name__}: {e})") from None
    if got != {"benchmark": benchmark, **ident}:
        raise RecordError(f"{path}: a record of {json.dumps(got)}, not {json.dumps({'benchmark': benchmark, **ident})}")
    differ = [k for k in sorted(setting.keys() | theirs.keys()) if setting.get(k) != theirs.get(k)]
    if differ:
        raise RecordError(f"{path}: written under other settings ({', '.join(differ)} differ; it has "
                          f"{json.dumps({k: theirs.get(k) for k in differ})[:400]}); move it aside to run it again")
    return {k: v for k, v in record.items() if k not in ("benchmark", "settings", *ident)}
