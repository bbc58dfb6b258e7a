"""Identity values for concurrent writers: reserved through the slot store, recorded in
the commit, and reconciled by the conflict checker (beyond Delta Spark, where every insert
moves the high-water mark and a concurrent insert fails with MetadataChangedException).

How a write gets its values::

    floor = first slot past the snapshot's highWaterMark     (respects any writer: Delta Spark too)
    first = slots.reserve_range(table, "identity/<column>", n, floor)   atomic: ranges are disjoint
            (a process reserves at least BLOCK slots at a time and serves small writes from
            them, past the last foreign writer's mark: :class:`_Blocks`)
    rows get start + (first .. first+n-1) * step
    commit: metaData with highWaterMark = furthest(read mark, our last value), and beside it
            eventlog.identity.ownMark (that mark) and .foreignMark (the last foreign one)
            commitInfo["eventlog.identity"] = {column: [[first value, last value], ...]}
            commitInfo["tags"]["delta.identity.schemaUpdate"] = "true" (identity-only change)

A winning commit whose metadata differs from what this transaction read only in
high-water marks (:func:`only_marks_changed`) does not conflict with it
(:func:`foreign_overlap` says when it does), and the staged metaData is rebuilt on the
winner's with the furthest marks (:func:`restage_metadata`): the log's mark never falls
below a value in a committed row, so a Delta Spark writer that inserts afterwards starts
past every value handed out through the log.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from eventlog.files.identity import (
    FOREIGN_MARK_KEY,
    HIGH_WATER_MARK_KEY,
    OWN_MARK_KEY,
    IdentityColumn,
    check_no_explicit_values,
    fill_identity,
    identity_columns,
    with_high_water_marks,
)
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import CommitInfo, Metadata

if TYPE_CHECKING:
    from lockstore import SlotStore

__all__ = [
    "COMMIT_INFO_KEY",
    "IDENTITY_TAG",
    "IdentityRange",
    "Reserve",
    "counter_name",
    "foreign_overlap",
    "generate_identity",
    "only_marks_changed",
    "recorded_ranges",
    "reserve",
    "restage_metadata",
    "schema_without_marks",
    "stamp_commit_info",
]

COMMIT_INFO_KEY = "eventlog.identity"
IDENTITY_TAG = "delta.identity.schemaUpdate"


@dataclasses.dataclass(frozen=True)
class IdentityRange:
    """Values ``first .. last`` (inclusive, in step order) of ``column`` that a write used."""

    column: str
    first: int
    last: int


def counter_name(column: IdentityColumn) -> str:
    """The slot-store counter of ``column`` (its physical name: stable across renames)."""
    return f"identity/{column.physical}"


BLOCK = 128  # slots a process reserves at once from the store (unused ones become gaps)


class _Blocks:
    """The slots each process reserved from a store and has not used yet, per (table,
    counter): a commit of a few rows takes them from here instead of from the store.

    A cached slot is used only if it lies past the foreign mark of the snapshot the write
    read (:meth:`IdentityColumn.foreign_mark_now`): a foreign writer (Delta Spark)
    generates values up to the mark it commits, so a slot at or below a foreign mark in
    our snapshot may be taken; one above it, if a foreign commit that lands after our
    snapshot took it, fails our commit in the conflict checker (:func:`foreign_overlap`).
    Marks our own commits set do not bound the blocks: our processes never share a block,
    the store's counter hands out disjoint ones. A new block is reserved past the log's
    mark itself, so a new or another store never hands out a value the table holds. A
    forked child starts with no blocks.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # _forget may run in a collection under the lock
        self._pid = os.getpid()
        self._blocks: dict[tuple[object, ...], dict[tuple[str, str], tuple[int, int]]] = {}

    def _store_key(self, slots: SlotStore) -> tuple[object, ...]:
        """Handles on one backing store share blocks (a local-file or object-store root, a
        ZooKeeper ensemble and chroot); any other store by object, forgotten when collected."""
        root, hosts = getattr(slots, "root", None), getattr(slots, "hosts", None)
        if isinstance(root, str) or isinstance(hosts, str):
            return (type(slots).__name__, root, hosts, getattr(slots, "chroot", None))
        key = (type(slots).__name__, id(slots))
        if key not in self._blocks:
            weakref.finalize(slots, self._forget, key)
        return key

    def _forget(self, key: tuple[object, ...]) -> None:
        with self._lock:
            self._blocks.pop(key, None)

    def _mine(self, slots: SlotStore) -> dict[tuple[str, str], tuple[int, int]]:
        if self._pid != os.getpid():  # inherited through fork: the parent's blocks
            self._blocks, self._pid = {}, os.getpid()
        return self._blocks.setdefault(self._store_key(slots), {})

    def take(self, slots: SlotStore, table_key: str, column: IdentityColumn, count: int) -> int:
        key, floor = (table_key, counter_name(column)), column.next_index()
        with self._lock:
            blocks = self._mine(slots)
            start, end = blocks.get(key, (0, 0))
            # Our cached slots came from the counter: only a foreign writer's values bound them.
            start = max(start, column.foreign_index())
            if end - start >= count:
                blocks[key] = (start + count, end)
                return start
        size = max(count, BLOCK)
        first = slots.reserve_range(table_key, key[1], size, floor=floor)
        with self._lock:
            self._mine(slots)[key] = (first + count, first + size)  # the old block's rest: a gap
        return first


_BLOCKS = _Blocks()


def reserve(slots: SlotStore, table_key: str, column: IdentityColumn, count: int) -> int:
    """``count`` consecutive slots of ``column`` past the column's mark, from this process's
    block or a new block reserved through the store (:class:`_Blocks`); the first index."""
    return _BLOCKS.take(slots, table_key, column, count)


Reserve = Callable[[IdentityColumn, int], int]  # (column, count) -> first slot index


def generate_identity(
    data: pa.Table, schema: pa.Schema, reserve: Reserve, *, operation: str
) -> tuple[pa.Table, list[IdentityRange]]:
    """``data`` with values generated for every identity column it leaves out, and the
    ranges used; IdentityColumnError if it supplies a ``GENERATED ALWAYS`` column. Columns
    it supplies (``BY DEFAULT``) are kept as they are. ``reserve``: where the slots come
    from (:func:`reserve` on the table's slot store); not called for no rows."""
    columns = identity_columns(schema)
    if not columns:
        return data, []
    names = data.schema.names
    check_no_explicit_values(columns, names, operation)
    ranges: list[IdentityRange] = []
    for column in columns:
        if column.name in names:
            continue
        n = data.num_rows
        first = reserve(column, n) if n else 0
        data = fill_identity(data, column, first)
        if n:
            ranges.append(IdentityRange(column.name, column.value(first), column.value(first + n - 1)))
    return data, ranges


def _columns(metadata: Metadata) -> dict[str, IdentityColumn]:
    return {c.name: c for c in identity_columns(from_spark_schema_json(metadata.schema_string))}


def marks_after(metadata: Metadata, ranges: Iterable[IdentityRange]) -> dict[str, int]:
    """Column -> the mark ``metadata`` must carry once ``ranges`` are in the table."""
    columns = _columns(metadata)
    out: dict[str, int] = {}
    for r in ranges:
        column = columns.get(r.column)
        if column is None:
            continue
        mark = column.merged_mark(out.get(r.column, column.high_water_mark), r.first, r.last)
        if mark is not None:
            out[r.column] = mark
    return out


def restage_metadata(base: Metadata, ranges: Sequence[IdentityRange]) -> Metadata:
    """``base`` with every identity column's mark moved past ``ranges`` (never back)."""
    marks = marks_after(base, ranges)
    if not marks:
        return base
    columns = _columns(base)
    ours = {name: columns[name].foreign_mark_now() for name in marks}
    return dataclasses.replace(
        base, schema_string=with_high_water_marks(base.schema_string, marks, ours=ours)
    )


def stamp_commit_info(info: CommitInfo, ranges: Sequence[IdentityRange], *, only_marks: bool) -> CommitInfo:
    """``info`` recording the ranges (``eventlog.identity``) and, for a commit whose only
    metadata change is the marks, Delta's identity-only tag."""
    if not ranges:
        return info
    record: dict[str, list[list[int]]] = {}
    for r in ranges:
        record.setdefault(r.column, []).append([r.first, r.last])
    extra: dict[str, Any] = {**info.extra, COMMIT_INFO_KEY: record}
    if only_marks:
        extra["tags"] = {**(info.extra.get("tags") or {}), IDENTITY_TAG: "true"}
    return dataclasses.replace(info, extra=extra)


def recorded_ranges(info: CommitInfo | None) -> list[IdentityRange] | None:
    """The ranges a commit of ours recorded; None for a commit without the record (a
    foreign writer's, or one that generated nothing)."""
    if info is None:
        return None
    record = info.extra.get(COMMIT_INFO_KEY)
    if not isinstance(record, Mapping):
        return None
    return [IdentityRange(str(c), int(a), int(b)) for c, pairs in record.items() for a, b in pairs]


def schema_without_marks(schema_string: str) -> Any:
    """A Delta schema string parsed, with the identity high-water marks (Delta's and ours)
    left out: what stays the same when only inserts moved the marks."""
    doc = orjson.loads(schema_string)
    for field in doc.get("fields", []):
        meta = field.get("metadata") or {}
        for key in (HIGH_WATER_MARK_KEY, OWN_MARK_KEY, FOREIGN_MARK_KEY):
            meta.pop(key, None)
    return doc


def only_marks_changed(old: Metadata, new: Metadata) -> bool:
    """Whether ``new`` differs from ``old`` in identity high-water marks only."""
    if old.schema_string == new.schema_string:
        return False  # not a mark change (the caller's other rules apply)
    same_rest = dataclasses.replace(old, schema_string=new.schema_string) == new
    return same_rest and schema_without_marks(old.schema_string) == schema_without_marks(new.schema_string)


def foreign_overlap(
    read: Metadata, winner: Metadata, winner_info: CommitInfo | None, ours: Sequence[IdentityRange]
) -> IdentityRange | None:
    """A range of ours that a marks-only winner may have generated values in, or None.

    A winner of ours recorded its ranges: they come from the same counter, disjoint from
    ours by construction. A foreign winner (Delta Spark) generated values up to its mark,
    from the mark we read on: it can overlap a range of ours only if its mark reached the
    range's first value (the Delta outcome, MetadataChangedException, then follows).
    """
    if not ours or recorded_ranges(winner_info) is not None:
        return None
    columns = {c.name: c for c in identity_columns(from_spark_schema_json(winner.schema_string))}
    before = {c.name: c for c in identity_columns(from_spark_schema_json(read.schema_string))}
    for r in ours:
        column = columns.get(r.column)
        if column is None or column.high_water_mark is None:
            continue
        old = before.get(r.column)
        if old is not None and old.high_water_mark == column.high_water_mark:
            continue  # the winner did not move this column's mark
        if not column.beyond(r.first, column.high_water_mark):
            return r
    return None
