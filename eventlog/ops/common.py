"""What every data-writing operation shares: accepted input types, ``delta.appendOnly``, and
writing rows as new data files."""

from __future__ import annotations

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


def to_arrow_table(data: Any) -> pa.Table:
    """Accept a pyarrow Table / RecordBatch / RecordBatchReader or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if type(data).__name__ == "DataFrame" and hasattr(data, "to_records"):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise InvalidInputError(f"expected a pyarrow Table or RecordBatch, got {type(data).__name__}")


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
