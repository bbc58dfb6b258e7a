"""DELETE and UPDATE: the predicate is the read set (its partition part for concurrent
appends, the pruned files for concurrent removes); matched rows are removed and, for
UPDATE, written again with their new values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.errors import (
    InvalidInputError,
    UnknownColumnError,
)
from eventlog.expr.evaluate import ARROW_ERRORS
from eventlog.files import row_tracking
from eventlog.files.change_data import UPDATE_POSTIMAGE, UPDATE_PREIMAGE
from eventlog.files.constraints import WriteRules
from eventlog.files.identity import check_not_assigned
from eventlog.ops.common import check_append_only
from eventlog.ops.rows import RewriteSink, matching_files, remove_rows
from eventlog.txn.plan import Plan, PlanBuilder


def begin_dml(plan: PlanBuilder, operation: str, predicate: str | None) -> None:
    """Name a DELETE or UPDATE and its predicate (Delta's commitInfo), once the SQL text is
    checked, and refuse it on an append-only table. Every engine starts with this."""
    if predicate is not None:
        ex.check_sql_text(predicate)
    plan.set_operation(operation, {"predicate": [predicate] if predicate else []})
    check_append_only(plan, operation)


def resolve_set_columns(schema_names: Sequence[str], columns: Iterable[str]) -> dict[str, str]:
    """The table column each SET target names (case-insensitively), in the order given;
    UnknownColumnError for one the table lacks, InvalidInputError for no target at all."""
    by_lower = {n.lower(): n for n in schema_names}
    out: dict[str, str] = {}
    for column in columns:
        name = by_lower.get(column.lower())
        if name is None:
            raise UnknownColumnError(column, list(schema_names), "SET")
        out[column] = name
    if not out:
        raise InvalidInputError("UPDATE needs at least one SET assignment")
    return out


def delete(plan: PlanBuilder, predicate: str | None) -> Plan:
    begin_dml(plan, "DELETE", predicate)
    pred = plan.parse_predicate(predicate) if predicate is not None else None
    files = plan.scan(pred)
    removed, deleted, copied = remove_rows(plan, files, pred)
    plan.add_metrics(numRemovedFiles=removed, numDeletedRows=deleted, numCopiedRows=copied)
    return plan.build()


def parse_assignments(plan: PlanBuilder, assignments: Mapping[str, str], **kw: Any) -> dict[str, ex.Expr]:
    """SET column = expression pairs, the column names resolved case-insensitively."""
    schema = plan.schema
    names = resolve_set_columns(schema.names, assignments)
    return {
        names[column]: ex.parse_expression(sql, schema, context=f"SET {names[column]}", **kw)
        for column, sql in assignments.items()
    }


def apply_assignments(
    rows: pa.Table, mask: pa.Array | None, assignments: Mapping[str, ex.Expr], schema: pa.Schema,
    source: pa.Table | None = None, resolve: Any = None,
) -> pa.Table:  # fmt: skip
    """Rows with the assignments applied where ``mask`` is true (everywhere when None)."""
    env = rows if source is None else source
    out = rows
    for name, expr in assignments.items():
        field = schema.field(name)
        try:
            value = ex.evaluate(expr, env, resolve)
            value = pc.cast(value, field.type)
        except ARROW_ERRORS as exc:
            raise InvalidInputError(f"cannot assign to column {name!r} ({field.type}): {exc}") from exc
        if mask is not None:
            value = pc.if_else(mask, value, rows[name])
        out = out.set_column(out.schema.get_field_index(name), field, value)
    return out


def update(plan: PlanBuilder, predicate: str | None, assignments: Mapping[str, str]) -> Plan:
    begin_dml(plan, "UPDATE", predicate)
    if not assignments:
        raise InvalidInputError("UPDATE needs at least one SET assignment")
    check_not_assigned(plan.schema, assignments.keys(), "UPDATE")  # identity columns (Delta)
    pred = plan.parse_predicate(predicate) if predicate is not None else None
    exprs = parse_assignments(plan, assignments)
    files = plan.scan(pred)
    use_dv = plan.deletion_vectors_enabled
    cdf = plan.change_data_enabled
    hidden = plan.row_id_columns  # row tracking: updated and copied rows keep their ids
    rules = WriteRules.of(plan.schema, plan.metadata.configuration)
    # generated columns not assigned are computed again from the new values (Delta)
    stale = [c for c, _ in rules.generated if c not in exprs]
    # file by file: each touched file is read, its new rows queued, then let go
    sink = RewriteSink(plan, rules, stale=stale, context="update")
    touched = updated = copied = 0
    for scan, matched in matching_files(plan, files, pred):
        hits_here = matched.size
        touched += 1
        updated += hits_here
        if use_dv:
            # The old images become DV-deleted rows; the new images go to a new file: only
            # the matched rows are read in full.
            plan.delete_rows(scan.add, matched, scan.deleted, scan.num_rows)
            old = scan.rows_at(matched, hidden=hidden)
            new = apply_assignments(old, None, exprs, plan.schema)
            if cdf:
                plan.record_changes(UPDATE_PREIMAGE, old)
            sink.add(row_tracking.mark_updated(new, hidden), UPDATE_POSTIMAGE if cdf else None)
        else:
            old, hit = scan.live_rows_marked(matched, hidden=hidden)
            copied += old.num_rows - hits_here
            new = apply_assignments(old, hit, exprs, plan.schema)
            plan.remove_files([scan.add])
            if cdf:
                plan.record_changes(UPDATE_PREIMAGE, old.filter(hit))
            sink.add(row_tracking.mark_updated(new, hidden, hit), UPDATE_POSTIMAGE if cdf else None, hit)
        del old, new
    if use_dv and touched:
        plan.flush_deletes()
    sink.flush()
    plan.add_metrics(numRemovedFiles=touched, numUpdatedRows=updated, numCopiedRows=copied)
    return plan.build()
