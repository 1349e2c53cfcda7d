"""What a run's trajectory store holds, read as a test checks it (read-only SQLite)."""

import hashlib
import sqlite3
from collections import Counter
from pathlib import Path

from dart_jax.wire import from_bytes
from dart_jax.wire.messages import Step


def content_duplicates(db_path: Path) -> list[tuple[str, int]]:
    """(task id, copies) of every episode stored more than once under different trajectory ids:
    the same task with the same prompt and response tokens, step by step. (Ids cannot repeat:
    the schema makes traj_id UNIQUE; a resubmission under a new id would.)"""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        keys = Counter()
        for traj_id, task_id in db.execute("SELECT traj_id, task_id FROM trajectories"):
            h = hashlib.sha256(task_id.encode())
            for (payload,) in db.execute("SELECT payload FROM steps WHERE traj_id = ? ORDER BY idx", (traj_id,)):
                step = from_bytes(payload, Step)
                for ids in (step.prompt_ids, step.response_ids):
                    h.update(len(ids).to_bytes(8, "little") + ids.tobytes())
            keys[(task_id, h.digest())] += 1
    finally:
        db.close()
    return [(task, n) for (task, _), n in keys.items() if n > 1]


def stored_ids(db_path: Path) -> list[str]:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return [r[0] for r in db.execute("SELECT traj_id FROM trajectories")]
    finally:
        db.close()
