"""Store integrity: what must hold after any crash, checked by tests and tools."""

from __future__ import annotations

from dart_jax.data.store import Store
from dart_jax.wire.png import address


def check(store: Store, deep: bool = False) -> list[str]:
    """Problems found (empty when sound): SQLite's own checks, step and screenshot counts,
    batch sizes, and every indexed blob inside its pack (with `deep`, hashing to its name)."""
    problems = [f"sqlite: {r[0]}" for r in store.query("PRAGMA integrity_check") if r[0] != "ok"]
    problems += [f"foreign key: {r}" for r in store.query("PRAGMA foreign_key_check")]
    for tid, want, got in store.query(
            "SELECT t.traj_id, t.num_steps, count(s.idx) FROM trajectories t "
            "LEFT JOIN steps s USING (traj_id) GROUP BY t.traj_id HAVING t.num_steps != count(s.idx)"):
        problems.append(f"trajectory {tid}: {got} steps stored, {want} expected")
    for tid, want, got in store.query(
            "SELECT t.traj_id, t.num_screenshots, count(s.idx) FROM trajectories t "
            "LEFT JOIN screenshots s USING (traj_id) GROUP BY t.traj_id "
            "HAVING t.num_screenshots != count(s.idx)"):
        problems.append(f"trajectory {tid}: {got} screenshots stored, {want} expected")
    for bid, want, got in store.query(
            "SELECT b.batch_id, b.num_trajectories, count(i.pos) FROM batches b "
            "LEFT JOIN batch_items i USING (batch_id) GROUP BY b.batch_id "
            "HAVING b.num_trajectories != count(i.pos)"):
        problems.append(f"batch {bid}: {got} items stored, {want} expected")
    return problems + _blob_problems(store, deep)


def _blob_problems(store: Store, deep: bool) -> list[str]:
    sizes, problems = store.blobs.sizes(), []
    for digest, pack, offset, size in store.query("SELECT sha256, pack, offset, size FROM blobs"):
        if offset + size > sizes.get(pack, -1):
            problems.append(f"blob {digest}: missing (pack {pack} ends before {offset + size})")
        elif deep and address(store.blobs.read(pack, offset, size)) != digest:
            problems.append(f"blob {digest}: corrupt")
    return problems


def orphan_bytes(store: Store) -> int:
    """Pack bytes no committed index row refers to (appended, then the process died)."""
    used = store.query("SELECT coalesce(sum(size), 0) FROM blobs")[0][0]
    return sum(store.blobs.sizes().values()) - used
