"""Removing the rows a predicate matches from the files that may hold them: whole files when
the predicate covers them, deletion vectors on DV tables, rewrites otherwise. Shared by
DELETE, overwrite with ``replace_where`` and the Spark adapter."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.files.change_data import DELETE
from eventlog.files.constraints import WriteRules
from eventlog.files.scan import FileScan, read_live_rows
from eventlog.log.actions import AddFile
from eventlog.ops.common import prepare_rewrite, table_target_size, write_rows
from eventlog.txn.plan import PlanBuilder


def read_rows(plan: PlanBuilder, files: Sequence[AddFile]) -> pa.Table:
    """Live rows of ``files`` (deletion vectors applied), with their stable row ids in row
    tracking's hidden columns when the table tracks rows (a rewrite keeps them)."""
    fs, root, parts = plan.table.log.fs, plan.table.log.root, plan.metadata.partition_columns
    hidden = plan.row_id_columns
    if hidden is None or not files:
        return read_live_rows(fs, root, files, plan.schema, parts)
    tracked = []
    for f in files:
        scan = FileScan(fs, root, f, plan.schema, parts)
        rows, positions = scan.live_rows()
        tracked.append(scan.tracked(rows, positions, hidden))
    return pa.concat_tables(tracked)


def live_row_count(f: AddFile) -> int:
    dv = f.deletion_vector.cardinality if f.deletion_vector is not None else 0
    return (f.num_records or 0) - dv


def matching_files(
    plan: PlanBuilder, files: Sequence[AddFile], pred: ex.Expr | None
) -> Iterator[tuple[FileScan, np.ndarray]]:
    """Per file with at least one live row matching ``pred``: (the opened file, physical
    positions of its matching live rows), one file at a time (as the caller asks for the
    next). Reads only the predicate's columns, of only the row groups whose statistics
    allow a match; full rows are read later, where needed."""
    for f in files:
        scan = FileScan(
            plan.table.log.fs, plan.table.log.root, f, plan.schema, plan.metadata.partition_columns
        )
        matched = scan.matching_positions(pred)
        if matched.size:
            yield scan, matched


def removes_whole_files(plan: PlanBuilder, pred: ex.Expr | None) -> bool:
    """Whether removing the rows matching ``pred`` removes whole files, unread: true for no
    predicate and for one on partition columns only (every row of a pruned file matches)."""
    parts = set(plan.metadata.partition_columns)
    return pred is None or {c.name for c in ex.referenced_columns(pred)} <= parts


def remove_whole_files(plan: PlanBuilder, files: Sequence[AddFile]) -> tuple[int, int, int]:
    """Stage removes of ``files``; (files removed, live rows deleted, rows copied = 0)."""
    plan.remove_files(files)
    plan.record_removed_files(files)
    return len(files), sum(live_row_count(f) for f in files), 0


class RewriteSink:
    """The rows a DML operation writes as new data files, written in groups as they come:
    a group is written once it holds about the table's target file size (in memory), so an
    operation that rewrites many files holds the rows of about one of them at a time, not
    of every file it touches.

    ``rules``: the table's write rules, applied to each group (rows conformed, generated
    columns computed again, CHECK constraints checked while the files are written), with
    ``stale`` (generated columns to compute again) dropped first; None for rows copied as
    they are. Each part may carry the change data kind of (some of) its rows, recorded as
    they are written (the new images, as conformed).
    """

    def __init__(
        self,
        plan: PlanBuilder,
        rules: WriteRules | None = None,
        *,
        stale: Sequence[str] = (),
        context: str = "rewrite",
    ) -> None:
        self.plan = plan
        self.rules = rules
        self.stale = list(stale)
        self.context = context
        self.limit = table_target_size(plan)
        self.rows_written = 0
        self._parts: list[tuple[pa.Table, str | None, pa.Array | None]] = []
        self._bytes = 0

    def add(self, rows: pa.Table, change: str | None = None, which: pa.Array | None = None) -> None:
        """Queue ``rows`` for writing; ``change``: the change data kind of the rows ``which``
        marks (all of them when None) once conformed."""
        if not rows.num_rows:
            return
        self._parts.append((rows, change, which))
        self._bytes += rows.nbytes
        if self._bytes >= self.limit:
            self.flush()

    def flush(self) -> None:
        """Write the queued rows (a no-op when none are queued)."""
        parts, self._parts, self._bytes = self._parts, [], 0
        if not parts:
            return
        plan, rules = self.plan, self.rules
        tables = [
            rows.drop_columns([c for c in self.stale if c in rows.column_names]) for rows, _, _ in parts
        ]
        # nullability may differ between parts (rows read, new images, rows inserted)
        data = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="default")
        del tables
        if rules is not None:
            data = prepare_rewrite(plan, rules, data, plan.schema, context=self.context)
        offset = 0
        for rows, change, which in parts:
            if change is not None:
                part = data.slice(offset, rows.num_rows)
                # a copy: a slice would keep the whole group alive while the change data holds it
                plan.record_changes(change, part.filter(which if which is not None else _all(part)))
            offset += rows.num_rows
        del parts
        self.rows_written += data.num_rows
        if rules is None:
            write_rows(plan, data)
            return
        with rules.start_checks(data, plan.schema):  # checked while the files are written
            write_rows(plan, data)


def _all(rows: pa.Table) -> pa.Array:
    return pa.array(np.ones(rows.num_rows, dtype=np.bool_))


def remove_rows(plan: PlanBuilder, files: Sequence[AddFile], pred: ex.Expr | None) -> tuple[int, int, int]:
    """Remove the rows matching ``pred`` from ``files``: whole files when every row
    matches (always, for a partition-only predicate); otherwise mark the rows in deletion
    vectors (tables with DVs enabled) or rewrite the surviving rows, file by file
    (:class:`RewriteSink`). Returns (files changed, rows deleted, rows copied)."""
    if removes_whole_files(plan, pred):
        return remove_whole_files(plan, files)
    use_dv = plan.deletion_vectors_enabled
    touched: list[AddFile] = []
    sink = RewriteSink(plan)
    deleted = 0
    for scan, matched in matching_files(plan, files, pred):
        deleted += matched.size
        touched.append(scan.add)
        if use_dv:  # nothing more to read: the positions are the deletion vector
            plan.delete_rows(scan.add, matched, scan.deleted, scan.num_rows)
            # readers tell these deletes from the DVs: read only for a commit's change files
            plan.record_changes_later(DELETE, functools.partial(scan.rows_at, matched))
            continue
        rows, hit = scan.live_rows_marked(matched, hidden=plan.row_id_columns)
        plan.remove_files([scan.add])
        if plan.change_data_enabled:
            plan.record_changes(DELETE, rows.filter(hit))
        sink.add(rows.filter(pc.invert(hit)))
        del rows, hit
    if use_dv:
        plan.flush_deletes()
        return len(touched), deleted, 0
    sink.flush()
    return len(touched), deleted, sink.rows_written
