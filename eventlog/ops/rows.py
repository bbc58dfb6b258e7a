"""Removing the rows a predicate matches from the files that may hold them: whole files when
the predicate covers them, deletion vectors on DV tables, rewrites otherwise. Shared by
DELETE, overwrite with ``replace_where`` and the Spark adapter."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.files.change_data import DELETE
from eventlog.files.scan import FileScan, read_live_rows
from eventlog.log.actions import AddFile
from eventlog.ops.common import write_rows
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
) -> list[tuple[FileScan, np.ndarray]]:
    """Per file with at least one live row matching ``pred``: (the opened file, physical
    positions of its matching live rows). Reads only the predicate's columns, of only the
    row groups whose statistics allow a match; full rows are read later, where needed."""
    out = []
    for f in files:
        scan = FileScan(
            plan.table.log.fs, plan.table.log.root, f, plan.schema, plan.metadata.partition_columns
        )
        matched = scan.matching_positions(pred)
        if matched.size:
            out.append((scan, matched))
    return out


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


def remove_rows(plan: PlanBuilder, files: Sequence[AddFile], pred: ex.Expr | None) -> tuple[int, int, int]:
    """Remove the rows matching ``pred`` from ``files``: whole files when every row
    matches (always, for a partition-only predicate); otherwise mark the rows in deletion
    vectors (tables with DVs enabled) or rewrite the surviving rows.
    Returns (files changed, rows deleted, rows copied)."""
    if removes_whole_files(plan, pred):
        return remove_whole_files(plan, files)
    use_dv = plan.deletion_vectors_enabled
    touched: list[AddFile] = []
    survivors: list[pa.Table] = []
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
        survivors.append(rows.filter(pc.invert(hit)))
        if plan.change_data_enabled:
            plan.record_changes(DELETE, rows.filter(hit))
    if use_dv:
        plan.flush_deletes()
        return len(touched), deleted, 0
    plan.remove_files(touched)
    kept = pa.concat_tables(survivors) if survivors else None
    if kept is not None and kept.num_rows:
        write_rows(plan, kept)
    return len(touched), deleted, kept.num_rows if kept is not None else 0
