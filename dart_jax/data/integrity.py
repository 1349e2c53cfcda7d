"""Store integrity: what must hold after any crash, checked by tests and `dart-jax` tools."""

from __future__ import annotations

from dart_jax.data.store import Store


def check(store: Store, deep: bool = False) -> list[str]:
    """Problems found (empty when sound): SQLite's own checks, step and screenshot counts,
    batch sizes, and every referenced blob present (and, with `deep`, hashing to its name)."""
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
    present = store.blobs.digests()
    for (digest,) in store.query("SELECT DISTINCT sha256 FROM screenshots"):
        if digest not in present or (deep and not store.blobs.verify(digest)):
            problems.append(f"blob {digest}: {'missing' if digest not in present else 'corrupt'}")
    return problems


def orphan_blobs(store: Store) -> set[str]:
    """Blobs no committed row refers to (left by a crash between blob write and commit)."""
    used = {r[0] for r in store.query("SELECT DISTINCT sha256 FROM screenshots")}
    return store.blobs.digests() - used
