"""Append and overwrite (``replace_where``), of rows or of data files written elsewhere
(Spark tasks). An append reads nothing (a blind append); an overwrite reads the whole table
or its ``replace_where`` predicate."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.errors import (
    InvalidInputError,
)
from eventlog.files.change_data import INSERT
from eventlog.files.constraints import PendingChecks, WriteRules
from eventlog.files.enforce import merge_schema
from eventlog.files.schema import canonical_schema
from eventlog.log.actions import AddFile, Metadata
from eventlog.ops.alter import change_schema
from eventlog.ops.common import check_append_only, to_arrow_table, write_rows
from eventlog.ops.rows import remove_rows
from eventlog.snapshot.protocol import protocol_for
from eventlog.txn.plan import Plan, PlanBuilder


def _prepare_data(
    plan: PlanBuilder, data: Any, schema_mode: str | None, context: str
) -> tuple[pa.Table, PendingChecks]:
    """The rows to write, and their CHECK rules under way (wait before committing)."""
    table = to_arrow_table(data)
    if schema_mode not in (None, "merge"):
        raise InvalidInputError(f"schema_mode must be None or 'merge', got {schema_mode!r}")
    schema = plan.schema
    if schema_mode == "merge":
        merged = merge_schema(schema, canonical_schema(table.schema))
        if not merged.equals(schema):
            change_schema(plan, merged)
            schema = plan.schema  # as staged (column mapping gives new fields physical names)
    table = plan.generate_identity(table, schema, context)  # identity columns left out
    rules = WriteRules.of(schema, plan.metadata.configuration)
    table = rules.prepare(table, schema, context=context)
    return table, rules.start_checks(table, schema)


def append(plan: PlanBuilder, data: Any, *, schema_mode: str | None = None) -> Plan:
    """Blind append: reads nothing, so it cannot conflict with concurrent data changes."""
    parts = list(plan.metadata.partition_columns)
    plan.set_operation("WRITE", {"mode": "Append", "partitionBy": parts})
    table, checks = _prepare_data(plan, data, schema_mode, "append")
    with checks:  # the rules are checked while the files are written
        adds = write_rows(plan, table)
    plan.add_metrics(
        numFiles=len(adds), numOutputRows=table.num_rows, numOutputBytes=sum(a.size for a in adds)
    )
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
    table, checks = _prepare_data(plan, data, schema_mode, "overwrite")
    with checks:  # the rules are checked while the table is read and the files written
        pred = plan.parse_predicate(replace_where, "replace_where") if replace_where is not None else None
        if pred is not None:
            ok = ex.evaluate_mask(pred, table)
            if pc.sum(ok).as_py() != table.num_rows and table.num_rows:
                raise InvalidInputError(
                    f"Data written out does not match replaceWhere '{replace_where}': "
                    f"{table.num_rows - (pc.sum(ok).as_py() or 0)} rows fall outside it"
                )
        files = plan.scan(pred)
        removed, deleted_rows, copied = remove_rows(plan, files, pred)
        plan.record_changes(INSERT, table)
        adds = write_rows(plan, table)
    plan.add_metrics(
        numFiles=len(adds), numOutputRows=table.num_rows, numRemovedFiles=removed,
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
