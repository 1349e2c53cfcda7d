"""Per-seed records of a benchmark whose seeds outlive their machine. One seed of the curation
benchmark is about 1.5 h of runs on a 2-core machine: its seeds are measured in separate
sittings, often on fresh machines where the run directories of the last sitting are gone. The
record of a finished seed (its sampled evaluation episodes, each run's facts and trace: what the
tables need, not the run directories) is written when the seed's last row ends, into a folder
kept in the repository; a later invocation with the same settings loads it instead of running
the seed again. A record written under other settings (another config text, RL budget or row
overrides) is refused, naming what differs: pooled seeds must be runs of one experiment."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

from benchmarks.common import commit, machine
from dart_jax.eval.stats import Outcome


class RecordError(ValueError):
    """A seed's record that cannot be pooled with this invocation's runs."""


def settings(config: Path, budget: list[str], rows: list[tuple[str, list[str]]]) -> dict:
    """What makes two seeds' runs one experiment: the config file's text (its sha256), the RL
    budget overrides and every row's label and overrides."""
    return {"config_sha256": hashlib.sha256(Path(config).read_bytes()).hexdigest(),
            "budget": list(budget), "rows": [[label, list(o)] for label, o in rows]}


def outcome_json(o: Outcome) -> dict:
    """An episode as the record keeps it: without the policy's text (the tables never read it)."""
    return dataclasses.asdict(dataclasses.replace(o, actions=()))


def outcomes(records: list[dict]) -> list[Outcome]:
    return [Outcome(**{**e, "actions": ()}) for e in records]


def write(path: Path, benchmark: str, seed: int, setting: dict, sft: list[Outcome], rows: list[dict]) -> dict:
    """The record of one finished seed. `rows`: per row {"label", "run" (its facts), "outcomes"
    (Outcome list) and any other JSON fields (the trace)}. Written whole (temp + rename)."""
    record = {"benchmark": benchmark, "seed": seed, "settings": setting, "commit": commit(), "machine": machine(),
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "sft": [outcome_json(o) for o in sft],
              "rows": [r | {"outcomes": [outcome_json(o) for o in r["outcomes"]]} for r in rows]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return read(path, benchmark, seed, setting)


def read(path: Path, benchmark: str, seed: int, setting: dict) -> dict | None:
    """The record at `path` with its episodes as Outcome lists, or None where there is none;
    RecordError for one that is unreadable or from another experiment."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        sft = outcomes(record["sft"])
        rows = [r | {"outcomes": outcomes(r["outcomes"])} for r in record["rows"]]
        theirs = record["settings"]
        ok = record["benchmark"] == benchmark and record["seed"] == seed
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RecordError(f"{path}: not a readable seed record ({type(e).__name__}: {e})") from None
    if not ok:
        raise RecordError(f"{path}: a record of {record['benchmark']} seed {record['seed']}, not {benchmark} seed {seed}")
    differ = [k for k in sorted(setting.keys() | theirs.keys()) if setting.get(k) != theirs.get(k)]
    if differ:
        raise RecordError(f"{path}: written under other settings ({', '.join(differ)} differ; it has "
                          f"{json.dumps({k: theirs.get(k) for k in differ})[:400]}); move it aside to run seed {seed} again")
    return record | {"sft": sft, "rows": rows}
