"""Statistics of data being written: :func:`file_stats` and :class:`StatsAccumulator`
compute Delta's per-file ``stats`` JSON (``numRecords``, ``minValues``, ``maxValues``,
``nullCount``), row group by row group. (:mod:`eventlog.files.stats` parses that JSON back.)

Dates are ``YYYY-MM-DD``; timestamps ISO with milliseconds (``Z`` suffix when tz-aware),
the min truncated and the max rounded up to the millisecond; decimals are exact JSON
numbers; strings keep a 32-character prefix as min and drop a longer max; a float column
holding NaN has no max; binary, array and map columns get a null count only; struct
columns nest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["STRING_PREFIX_LENGTH", "StatsAccumulator", "file_stats"]

STRING_PREFIX_LENGTH = 32  # Delta's dataSkippingStringPrefixLength
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = dt.date(1970, 1, 1)


def _leaf_columns(table: pa.Table) -> Iterable[tuple[tuple[str, ...], pa.ChunkedArray]]:
    """Non-struct leaves; struct children carry their parents' nulls (Spark counts those)."""

    def walk(
        path: tuple[str, ...], col: pa.ChunkedArray
    ) -> Iterable[tuple[tuple[str, ...], pa.ChunkedArray]]:
        if pa.types.is_struct(col.type):
            for i, child in enumerate(col.flatten()):
                yield from walk((*path, col.type.field(i).name), child)
        else:
            yield path, col

    for name, col in zip(table.column_names, table.columns, strict=True):
        yield from walk((name,), col)


def _minmax_kind(t: pa.DataType) -> str | None:
    types = pa.types
    if types.is_integer(t) or types.is_boolean(t):
        return "plain"
    if types.is_floating(t):
        return "float"
    if types.is_decimal(t):
        return "decimal"
    if types.is_string(t) or types.is_large_string(t):
        return "string"
    if types.is_date32(t):
        return "date"
    if types.is_timestamp(t):
        return "ts" if t.tz is not None else "ntz"
    return None  # binary, lists, maps: nullCount only


class StatsAccumulator:
    """Delta stats of a file, accumulated row group by row group (vectorised per group)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.num_records = 0
        self.null_counts: dict[tuple[str, ...], int] = {}
        self.mins: dict[tuple[str, ...], Any] = {}
        self.maxs: dict[tuple[str, ...], Any] = {}
        self.kinds: dict[tuple[str, ...], str | None] = {}
        self.has_nan: set[tuple[str, ...]] = set()
        for path, col in _leaf_columns(schema.empty_table()):
            self.null_counts[path] = 0
            self.kinds[path] = _minmax_kind(col.type)

    def update(self, table: pa.Table | pa.RecordBatch) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        self.num_records += table.num_rows
        for path, col in _leaf_columns(table):
            nulls = col.null_count
            self.null_counts[path] += nulls
            kind = self.kinds[path]
            if kind is None or nulls == len(col):
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"], mm["max"]
            if kind == "date":
                lo_v, hi_v = lo.value, hi.value  # days since the epoch
            elif kind in ("ts", "ntz"):  # microseconds since the epoch, whatever the unit
                per_us = _UNITS_PER_US[col.type.unit]
                lo_v, hi_v = _to_micros(lo.value, per_us, False), _to_micros(hi.value, per_us, True)
            else:
                lo_v, hi_v = lo.as_py(), hi.as_py()
            if kind == "float" and pc.any(pc.is_nan(col)).as_py():
                # Spark orders NaN above every number: the max is unknown, the min still holds.
                self.has_nan.add(path)
            if lo_v is not None and (path not in self.mins or lo_v < self.mins[path]):
                self.mins[path] = lo_v
            if hi_v is not None and (path not in self.maxs or hi_v > self.maxs[path]):
                self.maxs[path] = hi_v

    def to_json(self) -> str:
        min_values: dict[str, Any] = {}
        max_values: dict[str, Any] = {}
        null_count: dict[str, Any] = {}
        for path, nulls in self.null_counts.items():
            _put(null_count, path, nulls)
            kind = self.kinds[path]
            if kind is None:
                continue
            if path in self.mins:
                lo = _json_value(self.mins[path], kind, upper=False)
                if lo is not None:
                    _put(min_values, path, lo)
            if path in self.maxs and path not in self.has_nan:
                hi = _json_value(self.maxs[path], kind, upper=True)
                if hi is not None:
                    _put(max_values, path, hi)
        doc = {
            "numRecords": self.num_records,
            "minValues": min_values,
            "maxValues": max_values,
            "nullCount": null_count,
        }
        return orjson.dumps(doc).decode()


_UNITS_PER_US = {"s": 1e-6, "ms": 1e-3, "us": 1, "ns": 1000}


def _to_micros(v: int | None, per_us: float, upper: bool) -> int | None:
    if v is None or per_us == 1:
        return v
    if per_us < 1:
        return v * round(1 / per_us)
    return -(-v // int(per_us)) if upper else v // int(per_us)


def _put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc.setdefault(part, {})
    doc[path[-1]] = value


def _json_value(v: Any, kind: str, *, upper: bool) -> Any:
    """A min (``upper=False``) or max in Delta's JSON form, or None to omit it."""
    if kind == "plain":
        return v
    if kind == "float":
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if kind == "decimal":
        assert isinstance(v, Decimal)
        return orjson.Fragment(format(v, "f").encode())  # exact digits as a JSON number
    if kind == "string":
        assert isinstance(v, str)
        if len(v) <= STRING_PREFIX_LENGTH:
            return v
        # A prefix is still a lower bound; a truncated max would not be an upper bound.
        return None if upper else v[:STRING_PREFIX_LENGTH]
    try:
        if kind == "date":
            return (_EPOCH_DATE + dt.timedelta(days=v)).isoformat()
        # Delta keeps millisecond precision: floor the min, ceil the max so skipping stays safe.
        ms = -(-v // 1000) if upper else v // 1000
        t = _EPOCH + dt.timedelta(milliseconds=ms)
    except OverflowError:  # outside Python's datetime range: no bound rather than a wrong one
        return None
    text = f"{t.year:04d}-{t:%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}"
    return text + "Z" if kind == "ts" else text


def file_stats(batch_or_table: pa.Table | pa.RecordBatch) -> str:
    """Delta stats JSON (numRecords, minValues, maxValues, nullCount) of data about to be written.

    Dates are ``YYYY-MM-DD``; timestamps ISO with milliseconds (``Z`` suffix when tz-aware),
    the min truncated and the max rounded up to the millisecond; decimals are exact JSON
    numbers; strings keep a 32-character prefix as min and drop a longer max; binary, array
    and map columns get a null count only; struct columns nest.
    """
    acc = StatsAccumulator(batch_or_table.schema)
    acc.update(batch_or_table)
    return acc.to_json()
