"""The store's SQLite tables, as versioned migrations.

`PRAGMA user_version` holds the number of migrations applied; `migrate` applies the rest,
each in its own transaction, so a store made by an older build opens in a newer one.
Append migrations; never edit one that has shipped.
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: tuple[str, ...] = (
    # 1: tasks, trajectories, steps, screenshots and their blobs, policy versions, pool, batches.
    """
    CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY,
        backend TEXT NOT NULL,
        name TEXT NOT NULL,
        seed INTEGER NOT NULL,
        split TEXT NOT NULL CHECK (split IN ('train', 'eval')),
        config TEXT NOT NULL,
        added_at REAL NOT NULL
    );
    -- seq (the rowid) is the ingest order; used_batch is set when a batch consumes it.
    CREATE TABLE trajectories (
        seq INTEGER PRIMARY KEY,
        traj_id TEXT NOT NULL UNIQUE,
        task_id TEXT NOT NULL REFERENCES tasks(task_id),
        reward REAL NOT NULL,
        status TEXT NOT NULL,
        success INTEGER NOT NULL,
        source TEXT NOT NULL,
        worker_id TEXT NOT NULL,
        temperature REAL NOT NULL,
        created_at REAL NOT NULL,
        ingested_at REAL NOT NULL,
        num_steps INTEGER NOT NULL,
        num_screenshots INTEGER NOT NULL,
        min_version INTEGER NOT NULL,
        max_version INTEGER NOT NULL,
        used_batch INTEGER REFERENCES batches(batch_id)
    );
    CREATE INDEX trajectories_task ON trajectories(task_id, seq);
    CREATE INDEX trajectories_unused ON trajectories(task_id, seq) WHERE used_batch IS NULL;
    -- payload: the wire Step, msgpack with inline arrays (dart_jax.wire.to_bytes).
    CREATE TABLE steps (
        traj_id TEXT NOT NULL REFERENCES trajectories(traj_id),
        idx INTEGER NOT NULL,
        policy_version INTEGER NOT NULL,
        action TEXT NOT NULL,
        valid INTEGER NOT NULL,
        prompt_len INTEGER NOT NULL,
        response_len INTEGER NOT NULL,
        payload BLOB NOT NULL,
        PRIMARY KEY (traj_id, idx)
    ) WITHOUT ROWID;
    -- Screenshots are content-addressed: `blobs` says where each sha256 lies in the packs.
    CREATE TABLE blobs (
        sha256 TEXT PRIMARY KEY,
        pack INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        size INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE screenshots (
        traj_id TEXT NOT NULL REFERENCES trajectories(traj_id),
        idx INTEGER NOT NULL,
        sha256 TEXT NOT NULL REFERENCES blobs(sha256),
        PRIMARY KEY (traj_id, idx)
    ) WITHOUT ROWID;
    CREATE TABLE policy_versions (
        version INTEGER PRIMARY KEY,
        first_seen_at REAL NOT NULL,
        seen_by TEXT NOT NULL
    );
    -- The experience pool: successes that may be injected into a group with none.
    CREATE TABLE pool (
        traj_id TEXT PRIMARY KEY REFERENCES trajectories(traj_id),
        task_id TEXT NOT NULL,
        origin TEXT NOT NULL,
        added_at REAL NOT NULL
    );
    CREATE INDEX pool_task ON pool(task_id);
    CREATE TABLE batches (
        batch_id INTEGER PRIMARY KEY,
        trainer_version INTEGER NOT NULL,
        created_at REAL NOT NULL,
        num_tasks INTEGER NOT NULL,
        num_trajectories INTEGER NOT NULL,
        max_staleness INTEGER NOT NULL  -- trainer_version - oldest sampling version of its own data
    );
    CREATE TABLE batch_items (
        batch_id INTEGER NOT NULL REFERENCES batches(batch_id),
        pos INTEGER NOT NULL,
        traj_id TEXT NOT NULL REFERENCES trajectories(traj_id),
        injected INTEGER NOT NULL,
        PRIMARY KEY (batch_id, pos)
    ) WITHOUT ROWID;
    """,
    # 2: the whole trajectory record without steps and screenshots (msgpack of the wire
    # Trajectory), so fields added to the wire struct are stored without a migration each.
    """
    ALTER TABLE trajectories ADD COLUMN head BLOB;
    """,
    # 3: each screenshot's size as the image processor sees it, so a curated batch names its
    # screenshots by content and the trainer plans shapes without pixels. Blobs stored before
    # keep NULL and are sized from their PNG header when a batch names them.
    """
    ALTER TABLE blobs ADD COLUMN height INTEGER;
    ALTER TABLE blobs ADD COLUMN width INTEGER;
    """,
)


def version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection) -> int:
    """Apply pending migrations; returns the schema version. Refuses a newer store."""
    current = version(conn)
    if current > len(MIGRATIONS):
        raise RuntimeError(f"store schema version {current} is newer than this build's "
                           f"{len(MIGRATIONS)}; upgrade dart-jax")
    for number, script in enumerate(MIGRATIONS[current:], start=current + 1):
        # executescript commits first; BEGIN makes the migration and its number atomic.
        try:
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
        except sqlite3.Error:
            if conn.in_transaction:
                conn.rollback()
            raise
    return version(conn)
