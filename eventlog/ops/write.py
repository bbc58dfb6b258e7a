"""Append and overwrite (``replace_where``), of rows or of data files written elsewhere
(Spark tasks). An append reads nothing (a blind append); an overwrite reads the whole table
or its ``replace_where`` predicate."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.errors import (
    InvalidInputError,
)
from eventlog.files.constraints import WriteRules
from eventlog.files.datastream import DataFileStream
from eventlog.files.enforce import merge_schema
from eventlog.files.schema import canonical_schema
from eventlog.log.actions import AddFile, Metadata
from eventlog.ops.alter import change_schema
from eventlog.ops.common import (
    RowStream,
    check_append_only,
    file_rows,
    input_rows,
    table_target_size,
    write_rows,
)
from eventlog.ops.rows import remove_rows
from eventlog.snapshot.protocol import protocol_for
from eventlog.txn.plan import Plan, PlanBuilder


def _input_schema(
    plan: PlanBuilder, data: Any, schema_mode: str | None
) -> tuple[pa.Table | RowStream, pa.Schema]:
    """The rows a write was given (whole or a stream), and the schema they are written with
    (the table's, merged with theirs under ``schema_mode="merge"``)."""
    if schema_mode not in (None, "merge"):
        raise InvalidInputError(f"schema_mode must be None or 'merge', got {schema_mode!r}")
    rows = input_rows(data)
    schema = plan.schema
    if schema_mode == "merge" and rows.schema is not None:
        merged = merge_schema(schema, canonical_schema(rows.schema))
        if not merged.equals(schema):
            change_schema(plan, merged)
            schema = plan.schema  # as staged (column mapping gives new fields physical names)
    return rows, schema


def write_input(
    plan: PlanBuilder,
    rows: pa.Table | RowStream,
    schema: pa.Schema,
    context: str,
    check: Callable[[pa.Table], None] | None = None,
) -> tuple[list[AddFile], int]:
    """Write rows a user gave (a whole table or a stream) as new data files of the table of
    ``schema``, and stage their adds: identity values generated, the rows conformed, NOT
    NULL, generated columns and CHECK rules enforced, ``check`` run on them; the files and
    the row count. A stream is written chunk by chunk (:mod:`eventlog.files.datastream`);
    if anything fails on the way, every file already written is deleted."""
    rules = WriteRules.of(schema, plan.metadata.configuration)

    def conformed(chunk: pa.Table) -> pa.Table:
        chunk = plan.generate_identity(chunk, schema, context)  # identity columns left out
        return rules.prepare(chunk, schema, context=context)

    if isinstance(rows, pa.Table):
        table = conformed(rows)
        with rules.start_checks(table, schema):  # the rules are checked while the files are written
            if check is not None:
                check(table)
            return write_rows(plan, table), table.num_rows
    stream: DataFileStream | None = None
    try:
        for chunk in rows.chunks:
            table = conformed(chunk)
            with rules.start_checks(table, schema):
                if check is not None:
                    check(table)
                body, hidden = file_rows(plan, table)
                if stream is None:
                    stream = DataFileStream(
                        plan.table.log.fs, plan.table.log.root,
                        partition_columns=plan.metadata.partition_columns,
                        target_file_size=table_target_size(plan), hidden=hidden,
                    )  # fmt: skip
                stream.write(body)
        adds = stream.close() if stream is not None else []
    except BaseException:
        if stream is not None:
            stream.abort()
        raise
    plan.add_files(adds)
    return adds, stream.num_rows if stream is not None else 0


def append(plan: PlanBuilder, data: Any, *, schema_mode: str | None = None) -> Plan:
    """Blind append: reads nothing, so it cannot conflict with concurrent data changes."""
    parts = list(plan.metadata.partition_columns)
    plan.set_operation("WRITE", {"mode": "Append", "partitionBy": parts})
    rows, schema = _input_schema(plan, data, schema_mode)
    adds, count = write_input(plan, rows, schema, "append")
    plan.add_metrics(numFiles=len(adds), numOutputRows=count, numOutputBytes=sum(a.size for a in adds))
    return plan.build()


def _begin_overwrite(plan: PlanBuilder, replace_where: str | None) -> None:
    """Name an overwrite (Delta's WRITE in Overwrite mode) once its SQL text is checked."""
    params: dict[str, Any] = {"mode": "Overwrite", "partitionBy": list(plan.metadata.partition_columns)}
    if replace_where is not None:
        ex.check_sql_text(replace_where, "replace_where")
        params["predicate"] = [replace_where]
    plan.set_operation("WRITE", params)
    check_append_only(plan, "overwrite")


def overwrite(
    plan: PlanBuilder, data: Any, *, replace_where: str | None = None, schema_mode: str | None = None
) -> Plan:
    """Replace the table's rows (or the rows matching ``replace_where``) with ``data``."""
    _begin_overwrite(plan, replace_where)
    rows, schema = _input_schema(plan, data, schema_mode)
    pred = plan.parse_predicate(replace_where, "replace_where") if replace_where is not None else None

    def inside(table: pa.Table) -> None:
        if pred is None or not table.num_rows:
            return
        ok = pc.sum(ex.evaluate_mask(pred, table)).as_py() or 0
        if ok != table.num_rows:
            raise InvalidInputError(
                f"Data written out does not match replaceWhere '{replace_where}': "
                f"{table.num_rows - ok} rows fall outside it"
            )

    adds, count = write_input(plan, rows, schema, "overwrite", inside)
    plan.record_added_files(adds)
    files = plan.scan(pred)
    removed, deleted_rows, copied = remove_rows(plan, files, pred)
    plan.add_metrics(
        numFiles=len(adds), numOutputRows=count, numRemovedFiles=removed,
        numDeletedRows=deleted_rows, numCopiedRows=copied,
    )  # fmt: skip
    return plan.build()


def _evolve_schema(plan: PlanBuilder, written_schema: pa.Schema | None) -> None:
    """``mergeSchema`` for files written elsewhere: adopt their schema if it only adds columns."""
    if written_schema is None:
        return
    schema = plan.schema
    merged = merge_schema(schema, canonical_schema(written_schema))
    if not merged.equals(schema):
        change_schema(plan, merged)


def append_files(
    plan: PlanBuilder,
    adds: Sequence[AddFile],
    *,
    schema: pa.Schema | None = None,
    num_rows: int | None = None,
) -> Plan:
    """A blind append of data files an engine (Spark tasks) already wrote and conformed.

    ``schema``: the written files' schema, when it may add columns (mergeSchema); the
    files are deleted if the commit fails.
    """
    plan.set_operation("WRITE", {"mode": "Append", "partitionBy": list(plan.metadata.partition_columns)})
    _evolve_schema(plan, schema)
    plan.add_files(adds)
    rows = num_rows if num_rows is not None else sum(a.num_records or 0 for a in adds)
    plan.add_metrics(numFiles=len(adds), numOutputRows=rows, numOutputBytes=sum(a.size for a in adds))
    return plan.build()


def overwrite_files(
    plan: PlanBuilder,
    adds: Sequence[AddFile],
    *,
    replace_where: str | None = None,
    schema: pa.Schema | None = None,
    num_rows: int | None = None,
) -> Plan:
    """Replace the table's rows (or those matching ``replace_where``) with files already
    written. The writer must have checked that every new row satisfies ``replace_where``."""
    _begin_overwrite(plan, replace_where)
    _evolve_schema(plan, schema)
    pred = plan.parse_predicate(replace_where, "replace_where") if replace_where is not None else None
    files = plan.scan(pred)
    removed, deleted_rows, copied = remove_rows(plan, files, pred)
    plan.add_files(adds)
    plan.record_added_files(adds)
    rows = num_rows if num_rows is not None else sum(a.num_records or 0 for a in adds)
    plan.add_metrics(
        numFiles=len(adds), numOutputRows=rows, numRemovedFiles=removed, numDeletedRows=deleted_rows,
        numCopiedRows=copied,
    )  # fmt: skip
    return plan.build()


def stage_new_table(
    plan: PlanBuilder, schema: pa.Schema, schema_json: str, partition_by: Sequence[str]
) -> None:
    """Stage the protocol and metadata of the table this commit creates as version 0: what a
    writer that found no table when it planned does (Spark's batch writer, the streaming
    sink). A writer that created the table meanwhile wins; this commit then fails with
    ProtocolChangedException, as in Delta."""
    plan.update_protocol(protocol_for(schema, {}))
    plan.update_metadata(
        Metadata(
            id=Metadata.new_id(),
            schema_string=schema_json,
            partition_columns=tuple(partition_by),
            configuration={},
            created_time=int(time.time() * 1000),
        )
    )
