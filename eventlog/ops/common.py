"""What every data-writing operation shares: accepted input types, ``delta.appendOnly``, and
writing rows as new data files."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from eventlog.errors import (
    AppendOnlyViolationError,
    InvalidInputError,
)
from eventlog.files import row_tracking
from eventlog.files.constraints import WriteRules
from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE, write_data_files
from eventlog.log.actions import AddFile
from eventlog.ops.alter import APPEND_ONLY_KEY, TARGET_FILE_SIZE_KEY
from eventlog.txn.plan import PlanBuilder


def check_append_only(plan: PlanBuilder, operation: str) -> None:
    if plan.metadata.configuration.get(APPEND_ONLY_KEY) == "true":
        raise AppendOnlyViolationError(
            f"{operation} is not allowed: table {plan.table.uri} has {APPEND_ONLY_KEY} = true"
        )


# --------------------------------------------------------------------------- data writes


Rows = Any
"""What writes take: a pyarrow Table, RecordBatch or RecordBatchReader, a pandas DataFrame,
an object with the Arrow C stream interface (polars, DuckDB), or an iterable of pyarrow
record batches or tables (a generator, say). Readers, streams and iterables are written as
they come, never held whole (:func:`eventlog.ops.write.write_input`)."""


class RowStream:
    """Rows that arrive in chunks, each a ``pyarrow.Table``: from a ``RecordBatchReader``, an
    object with the Arrow C stream interface, or an iterable of record batches or tables.
    ``schema`` is None for an empty iterable (nothing says what its rows would be)."""

    def __init__(self, schema: pa.Schema | None, chunks: Iterator[pa.Table]) -> None:
        self.schema = schema
        self.chunks = chunks


def input_rows(data: Any) -> pa.Table | RowStream:
    """What a write was given: a whole table (a pyarrow Table or RecordBatch, a pandas
    DataFrame) or a :class:`RowStream` (anything else that yields record batches); a
    RecordBatchReader or an iterator is consumed as the write goes."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if type(data).__name__ == "DataFrame" and hasattr(data, "to_records"):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, pa.RecordBatchReader):
        return RowStream(data.schema, _reader_chunks(data))
    if hasattr(data, "__arrow_c_stream__"):  # polars, DuckDB results, other Arrow producers
        reader = pa.RecordBatchReader.from_stream(data)
        return RowStream(reader.schema, _reader_chunks(reader))
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise InvalidInputError(
            "expected a pyarrow Table, RecordBatch or RecordBatchReader, a pandas DataFrame, "
            f"or an iterable of record batches; got {type(data).__name__}"
        )
    items = iter(data)
    first = next(items, None)
    if first is None:
        return RowStream(None, iter(()))
    head = _chunk(first, 0)
    return RowStream(head.schema, itertools.chain([head], (_chunk(b, i) for i, b in enumerate(items, 1))))


def _reader_chunks(reader: pa.RecordBatchReader) -> Iterator[pa.Table]:
    for batch in reader:
        yield pa.Table.from_batches([batch])


def _chunk(item: object, index: int) -> pa.Table:
    if isinstance(item, pa.RecordBatch):
        return pa.Table.from_batches([item])
    if isinstance(item, pa.Table):
        return item
    raise InvalidInputError(
        f"item {index} of the rows is a {type(item).__name__}, not a pyarrow RecordBatch or Table"
    )


def to_arrow_table(data: Any) -> pa.Table:
    """Every row of ``data`` (any input :func:`input_rows` takes) as one table in memory."""
    rows = input_rows(data)
    if isinstance(rows, pa.Table):
        return rows
    chunks = list(rows.chunks)
    if rows.schema is None:
        raise InvalidInputError("no rows and no schema: an empty iterable of record batches")
    try:
        return pa.concat_tables(chunks) if chunks else rows.schema.empty_table()
    except pa.ArrowInvalid as exc:
        raise InvalidInputError(f"the record batches do not share one schema: {exc}") from exc


def table_target_size(plan: PlanBuilder) -> int:
    return int(plan.metadata.configuration.get(TARGET_FILE_SIZE_KEY, DEFAULT_TARGET_FILE_SIZE))


def write_rows(plan: PlanBuilder, data: pa.Table, *, data_change: bool = True) -> list[AddFile]:
    """Write conformed rows as new data files and stage their adds."""
    if data.num_rows == 0:
        return []
    data, hidden = file_rows(plan, data)
    adds = write_data_files(
        plan.table.log.fs,
        plan.table.log.root,
        data,
        partition_columns=plan.metadata.partition_columns,
        data_change=data_change,
        target_file_size=table_target_size(plan),
        hidden=hidden,
    )
    plan.add_files(adds)
    return adds


def file_rows(plan: PlanBuilder, data: pa.Table) -> tuple[pa.Table, list[str]]:
    """Conformed rows as :func:`write_data_files` takes them for this table: with column
    mapping's physical names, and the names of row tracking's hidden columns among them
    (rows a rewrite copied carry their stable ids there)."""
    return row_tracking.file_layout(
        data, plan.schema, row_tracking.hidden_columns(plan.metadata.configuration)
    )


def prepare_rewrite(
    plan: PlanBuilder, rules: WriteRules, rows: pa.Table, schema: pa.Schema, *, context: str
) -> pa.Table:
    """``rules.prepare`` of rows a rewrite writes: row tracking's hidden columns (the rows'
    stable ids) are set aside while the rows are conformed, then put back."""
    body, hidden = row_tracking.split(rows, row_tracking.hidden_columns(plan.metadata.configuration))
    return row_tracking.rejoin(rules.prepare(body, schema, context=context), hidden)
