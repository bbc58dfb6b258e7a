"""Identity values reserved where the rows are: in Spark tasks and streaming-sink tasks.

A task holds only strings (the plan): :class:`TaskIdentity` opens the table's slot store
from them when a batch needs values (:meth:`eventlog.table.Table.handle`: no log is read),
reserves one range per column and batch, and keeps the ranges for the task's commit
message; the driver records them on its transaction (``record_identity``), whose commit
moves the high-water marks. No pass over the data happens on the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eventlog.files.identity import IdentityColumn, check_no_explicit_values, fill_identity, identity_columns
from eventlog.table.handle import Table
from eventlog.txn.identity import IdentityRange, generate_identity, reserve

__all__ = ["TaskIdentity", "check_identity_write", "ranges_from_json", "ranges_to_json"]


def check_identity_write(schema: pa.Schema, data_schema: pa.Schema, context: str) -> pa.Table:
    """Driver-side check before any task runs: IdentityColumnError when the data supplies a
    ``GENERATED ALWAYS`` column. Returns an empty table of ``data_schema`` with the identity
    columns it leaves out added (what the tasks' rows will look like, for schema checks)."""
    columns = identity_columns(schema)
    check_no_explicit_values(columns, data_schema.names, context)
    empty = data_schema.empty_table()
    for column in columns:
        if column.name not in data_schema.names:
            empty = fill_identity(empty, column, 0)
    return empty


class TaskIdentity:
    """Reserves identity values for one task's batches (see the module docstring)."""

    def __init__(self, uri: str, slots: str | None, storage_options: Mapping[str, Any] | None) -> None:
        self._uri, self._slots, self._options = uri, slots, storage_options
        self._table: Table | None = None
        self.ranges: list[IdentityRange] = []

    def _reserve(self, column: IdentityColumn, count: int) -> int:
        if self._table is None:
            self._table = Table.handle(self._uri, self._slots, storage_options=self._options)
        return reserve(self._table.slots, self._table.key, column, count)

    def fill(self, data: pa.Table, schema: pa.Schema, context: str) -> pa.Table:
        """``data`` with values for the identity columns it leaves out (no-op without any)."""
        if not identity_columns(schema):
            return data
        data, ranges = generate_identity(data, schema, self._reserve, operation=context)
        self.ranges.extend(ranges)
        return data

    def fill_flagged(self, data: pa.Table, schema: pa.Schema, flags: Mapping[str, str]) -> pa.Table:
        """``data`` with values for the rows of each identity column whose flag column
        (``flags``: column -> flag column) is true, the flag columns dropped: a MERGE's
        inserted rows that leave the column to be generated, beside rows that keep theirs."""
        for column in identity_columns(schema):
            flag = flags.get(column.name)
            if flag is None:
                continue
            mask = pc.fill_null(data[flag].combine_chunks(), False)
            n = int(pc.sum(mask).as_py() or 0)
            if not n:
                continue
            first = self._reserve(column, n)
            values = fill_identity(pa.table({"_": pa.nulls(n)}), column, first).column(column.name)
            current = data[column.name].combine_chunks().cast(pa.int64())
            index = data.schema.get_field_index(column.name)
            filled = pc.replace_with_mask(current, mask, values.combine_chunks())
            data = data.set_column(index, data.schema.field(index).with_type(pa.int64()), filled)
            self.ranges.append(IdentityRange(column.name, column.value(first), column.value(first + n - 1)))
        return data.drop_columns([f for f in flags.values() if f in data.column_names])

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None


def ranges_to_json(ranges: Sequence[IdentityRange]) -> list[list[Any]]:
    """Ranges as plain data for a task's commit message."""
    return [[r.column, r.first, r.last] for r in ranges]


def ranges_from_json(data: Sequence[Sequence[Any]]) -> list[IdentityRange]:
    return [IdentityRange(str(c), int(a), int(b)) for c, a, b in data]
