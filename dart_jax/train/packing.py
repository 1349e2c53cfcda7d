"""Which steps share a row, and which rows a microbatch: the layout of an RL batch's rows.

A row holds up to `BucketSpec.pack` steps back to back (batch.py: each its own sequence).
`microbatch_rows` lays out a batch's steps twice, one step a row and packed, and takes the packed layout
when it pads less:

- packed: first fit decreasing. Each step, longest first, joins the first row that has a free
  step slot and room for its tokens and vision slots in that row's own bucket (the smallest
  holding the row's first step), or opens a row.
- either way, rows sorted by shape (long with long: tight buckets) are cut into microbatches
  of rows x hosts rows, each padded to the smallest bucket holding its rows.
- padding is counted in positions: a microbatch's rows x (bucket tokens + bucket vision
  slots), the decoder tokens and vision patches the step computes over. Both layouts hold the
  same steps, so the one with fewer positions wastes less.

Packing never enlarges a row's bucket, but fewer rows can regroup into microbatches of larger
buckets (a short step absorbed by a long one leaves its partner to share a long microbatch),
which is why the layouts are compared rather than packing always.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from dart_jax.train.batch import Bucket, BucketSpec, Row, StepRef, StepShape
from dart_jax.train.collate import Collator


def row_shape(row: Row) -> StepShape:
    return StepShape(sum(r.seq_len for r in row), sum(r.num_slots for r in row))


def global_bucket(collator: Collator, rows: Sequence[Row]) -> Bucket:
    """The bucket of a global batch (every host picks the same one); rows stay per host."""
    shapes = [row_shape(row) for row in rows]
    shape = StepShape(max(s.seq_len for s in shapes), max(s.num_slots for s in shapes))
    return collator.buckets.choose_bucket([shape])


def pack_rows(refs: Sequence[StepRef], spec: BucketSpec) -> list[Row]:
    """First fit decreasing: each step, longest first, joins the first row with a free step
    slot and room in that row's bucket (the smallest holding its first step); else it opens a
    row. Rows that can take no further step are closed, so a step looks only at open rows."""
    order = sorted(refs, key=lambda r: (r.seq_len, r.num_slots), reverse=True)
    smallest = min((r.seq_len for r in refs), default=0)
    rows: list[list[StepRef]] = []
    open_rows: list[tuple[list[StepRef], list[int]]] = []  # a row and its room [tokens, slots]
    for r in order:
        for k, (row, room) in enumerate(open_rows):
            if r.seq_len <= room[0] and r.num_slots <= room[1]:
                row.append(r)
                room[0] -= r.seq_len
                room[1] -= r.num_slots
                if len(row) == spec.pack or room[0] < smallest:
                    del open_rows[k]
                break
        else:
            bucket = spec.choose_bucket([r])
            rows.append([r])
            if spec.pack > 1:
                open_rows.append((rows[-1], [bucket.seq_len - r.seq_len, bucket.num_slots - r.num_slots]))
    return [tuple(row) for row in rows]


def _microbatches(rows: Sequence[Row], size: int) -> list[tuple[Row, ...]]:
    """Rows sorted by shape (long with long: tight buckets), cut into microbatches of `size`."""
    rows = sorted(rows, key=lambda row: (*dataclasses.astuple(row_shape(row)), row[0].traj, row[0].step))
    return [tuple(rows[i:i + size]) for i in range(0, len(rows), size)]


def padded_positions(layout: Sequence[Sequence[Row]], collator: Collator, size: int) -> int:
    """Decoder tokens plus vision slots a layout's microbatches of `size` rows compute over."""
    buckets = [global_bucket(collator, rows) for rows in layout]
    return sum(size * (b.seq_len + b.num_slots) for b in buckets)


def microbatch_rows(refs: Sequence[StepRef], collator: Collator, hosts: int) -> list[tuple[Row, ...]]:
    """Microbatches of rows x hosts rows: one step a row, or packed where that pads less
    (module docstring)."""
    size = collator.buckets.rows * hosts
    single = _microbatches([(r,) for r in refs], size)
    if collator.buckets.pack == 1:
        return single
    packed = _microbatches(pack_rows(refs, collator.buckets), size)
    if padded_positions(packed, collator, size) < padded_positions(single, collator, size):
        return packed
    return single
