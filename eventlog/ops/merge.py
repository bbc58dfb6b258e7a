"""MERGE INTO with pyarrow: upsert a source table into the target, in one transaction.

What the MERGE reads and which clause applies to a row are decided by the shared planner
(:mod:`eventlog.ops.mergeplan`: the ON split into join keys, target predicate and residual;
clause resolution and choice; the cardinality rule; commitInfo). This module executes the
plan with pyarrow, one target file at a time: it reads a file the target predicate keeps,
joins it with the source on the keys (:mod:`eventlog.ops.mergejoin`), evaluates the
residual and the clauses on the joined rows and, if the file holds an updated or deleted
row, rewrites it (or marks those rows in a deletion vector) before it reads the next one;
so the target rows held are about one file's, while the source is held whole. Inserted
rows go to new files, last.

Like every operation, MERGE follows one rule: running it *stages* (plans, writes the new
files, records the reads) and committing publishes. :class:`MergeBuilder` (from
``txn.merge(...)``) stages on ``execute()`` and leaves the commit to ``txn.commit()``,
which runs the conflict check against every commit that won meanwhile.
:class:`TableMergeBuilder` (from ``Table.merge(...)``) is the one-shot form: ``execute()``
stages in its own transaction and commits it at once, like ``Table.delete`` and the rest.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.errors import InvalidInputError
from eventlog.expr.evaluate import ARROW_ERRORS
from eventlog.files import row_tracking
from eventlog.files.change_data import DELETE, INSERT, UPDATE_POSTIMAGE, UPDATE_PREIMAGE
from eventlog.files.constraints import WriteRules
from eventlog.files.identity import check_not_assigned, identity_columns
from eventlog.files.scan import FileScan, top_level_columns
from eventlog.log.actions import AddFile
from eventlog.ops.common import to_arrow_table
from eventlog.ops.dml import apply_assignments
from eventlog.ops.mergejoin import FILE, ROW, SRC, SourceKeys, gather
from eventlog.ops.mergeplan import (
    ClauseSpec,
    MergeClause,
    MergePlan,
    MergeScope,
    begin_merge,
    cardinality_error,
    check_aliases,
    clause_cases,
    merge_metrics,
)
from eventlog.ops.rows import RewriteSink
from eventlog.txn.plan import Plan, PlanBuilder
from eventlog.txn.transaction import CommitResult
from eventlog.txn.transaction import CoreTransaction as Transaction


class _MergeClauses:
    """Delta's merge builder: ``when_matched_*`` / ``when_not_matched_*``, then ``execute()``.

    The clauses, resolved by the shared planner (:mod:`eventlog.ops.mergeplan`) as they are
    added, and the pyarrow execution of the plan; the subclasses decide what ``execute()``
    returns.
    """

    def __init__(
        self,
        txn: Transaction,
        source: Any,
        on: str,
        *,
        source_alias: str = "source",
        target_alias: str = "target",
    ) -> None:
        check_aliases(source_alias, target_alias)
        self.txn = txn
        self.source = to_arrow_table(source)
        self.target_alias = target_alias
        self.source_alias = source_alias
        self.on_sql = on
        self.target_schema = txn.schema
        self.scope = MergeScope(self.target_schema, self.source.schema, target_alias, source_alias)
        self.on = self.scope.parse_on(on)
        self.matched: list[MergeClause[str]] = []
        self.not_matched: list[MergeClause[str]] = []
        self.by_source: list[MergeClause[str]] = []
        self._out: PlanBuilder = txn  # the plan being built (set by plan_merge)
        self._needed: list[str] = []  # the target columns the MERGE reads (set by _plan)
        self._scans: dict[int, FileScan] = {}  # the target file being merged, by file id
        self._whole: dict[int, tuple[pa.Table, np.ndarray]] = {}  # its every live row, positions

    # ------------------------------------------------------------------ clauses

    def when_matched_update(self, condition: str | None = None, set: Mapping[str, str] | None = None) -> Self:
        spec = ClauseSpec.update(condition, set, method="when_matched_update")
        check_not_assigned(self.target_schema, (set or {}).keys(), "MERGE")  # identity columns
        self.matched.append(self.scope.resolve(spec))
        return self

    def when_matched_update_all(self, condition: str | None = None) -> Self:
        clause = self.scope.resolve(ClauseSpec[str].update_all(condition))
        # UPDATE SET * sets an identity column the source has: refused, as in Delta (both modes)
        check_not_assigned(self.target_schema, clause.from_source.keys(), "MERGE")
        self.matched.append(clause)
        return self

    def when_matched_delete(self, condition: str | None = None) -> Self:
        self.matched.append(self.scope.resolve(ClauseSpec[str].delete(condition)))
        return self

    def when_not_matched_insert(
        self, condition: str | None = None, values: Mapping[str, str] | None = None
    ) -> Self:
        spec = ClauseSpec.insert(condition, values, method="when_not_matched_insert")
        self.not_matched.append(self.scope.resolve(spec))
        return self

    def when_not_matched_insert_all(self, condition: str | None = None) -> Self:
        self.not_matched.append(self.scope.resolve(ClauseSpec[str].insert_all(condition)))
        return self

    def when_not_matched_by_source_update(
        self, condition: str | None = None, set: Mapping[str, str] | None = None
    ) -> Self:
        """WHEN NOT MATCHED BY SOURCE [AND condition] THEN UPDATE SET ...: target rows no
        source row matches; ``condition`` and ``set`` read target columns only."""
        spec = ClauseSpec.update(condition, set, method="when_not_matched_by_source_update")
        check_not_assigned(self.target_schema, (set or {}).keys(), "MERGE")
        self.by_source.append(self.scope.resolve_by_source(spec))
        return self

    def when_not_matched_by_source_delete(self, condition: str | None = None) -> Self:
        """WHEN NOT MATCHED BY SOURCE [AND condition] THEN DELETE."""
        self.by_source.append(self.scope.resolve_by_source(ClauseSpec[str].delete(condition)))
        return self

    # ------------------------------------------------------------------ execution

    def _resolve(self, col: ex.Column) -> str:
        return f"{col.qualifier}.{col.name}"

    def plan_merge(self, plan: PlanBuilder) -> Plan:
        """The MERGE's plan: its reads (the target predicate), the files it writes and the
        rows it removes, built on ``plan`` (which the planning steps below write to)."""
        self._out = plan
        merge = begin_merge(
            plan, self.scope, self.on_sql, self.on, self.matched, self.not_matched, self.by_source
        )
        files = plan.scan(merge.target_predicate)
        plan.add_metrics(**self._plan(files, merge))
        return plan.build()

    def _plan(self, files: list[AddFile], merge: MergePlan[str]) -> dict[str, int]:
        """File by file: each target file is read (the columns the MERGE reads), joined with
        the source, given to the clauses and, when touched, rewritten (or its rows marked
        in a deletion vector) before the next one is read, so the target rows held are
        about one file's; the source is held whole (it is the caller's table). The rows no
        target row matched are inserted last."""
        plan = self._out
        schema = self.target_schema
        self._needed = self._needed_columns()
        source = self.source.append_column(SRC, pa.array(np.arange(self.source.num_rows, dtype=np.int64)))
        keys = SourceKeys(source, list(merge.keys), schema)
        rules = WriteRules.of(schema, plan.metadata.configuration)
        # generated columns no clause assigns are computed from the rows' new values
        assigned = {c for clause in (*self.matched, *self.not_matched) for c in clause.assignments}
        stale = [c for c, _ in rules.generated if c not in assigned]
        sink = RewriteSink(plan, rules, stale=stale, context="merge")
        matched_sources = np.zeros(source.num_rows, dtype=np.bool_)
        counts = _Counts()
        repeated = 0  # target rows more than one source row matched (the cardinality rule)
        s = self.source_alias
        for fid, f in enumerate(files):
            self._open(fid, f)
            target = self._read_target(fid, merge.target_predicate)
            joined = self._join(target, source, keys, merge)
            if merge.matched and merge.checks_cardinality and joined.num_rows:
                repeated += _repeated(joined, self.target_alias)
            if repeated:  # the MERGE fails: the other files are only counted
                continue
            matched_sources[joined.column(f"{s}.{SRC}").to_numpy()] = True
            self._merge_file(fid, f, target, joined, merge, sink, counts)
        self._scans, self._whole = {}, {}
        if repeated:
            raise cardinality_error(repeated)
        inserted = self._insert(source, matched_sources, merge)
        if inserted is not None:  # the new images end the rewritten rows, then inserts
            sink.add(inserted, INSERT if plan.change_data_enabled else None)
        if plan.deletion_vectors_enabled and counts.files:
            plan.flush_deletes()
        sink.flush()
        return merge_metrics(
            files_removed=counts.files,
            updated=counts.updated,
            deleted=counts.deleted,
            inserted=inserted.num_rows if inserted is not None else 0,
            source_rows=self.source.num_rows,
            by_source_updated=counts.by_source_updated,
            by_source_deleted=counts.by_source_deleted,
        )

    def _open(self, fid: int, f: AddFile) -> None:
        """Open target file ``fid``, letting the previous one go."""
        plan = self._out
        scan = FileScan(
            plan.table.log.fs, plan.table.log.root, f, self.target_schema, plan.metadata.partition_columns
        )
        self._scans = {fid: scan}
        self._whole = {}  # file id: every live row, positions (read once, if needed)

    def _join(self, target: pa.Table, source: pa.Table, keys: SourceKeys, merge: MergePlan[str]) -> pa.Table:
        """The (target, source) row pairs ON holds for, columns named ``alias.column``."""
        join_filter = merge.join_filter  # the target rows that may match
        if join_filter is not None and target.num_rows:
            eligible = target.filter(ex.evaluate_mask(join_filter, target))
        else:
            eligible = target
        joined = gather(eligible, source, keys.join(eligible), self.target_alias, self.source_alias)
        if merge.residual and joined.num_rows:
            keep = ex.evaluate_mask(ex.conjoin(merge.residual), joined, self._resolve)
            joined = joined.filter(keep)
        return joined

    def _merge_file(
        self,
        fid: int,
        f: AddFile,
        target: pa.Table,
        joined: pa.Table,
        merge: MergePlan[str],
        sink: RewriteSink,
        counts: _Counts,
    ) -> None:
        """Apply the clauses to the rows of target file ``fid`` and, if it is touched, queue
        its rewrite (or mark its rows in a deletion vector) and its change data."""
        plan = self._out
        updates, deletes = self._apply_matched(joined, merge)
        if merge.not_matched_by_source:
            updates, deletes, by_source = self._apply_by_source(target, joined, updates, deletes, merge)
            counts.by_source_updated += by_source[0]
            counts.by_source_deleted += by_source[1]
        deleted = sum(len(v) for v in deletes.values())
        if not updates.num_rows and not deleted:
            return
        counts.files += 1
        counts.updated += updates.num_rows
        counts.deleted += deleted
        cdf = plan.change_data_enabled
        if cdf:
            self._record_deletes(deletes)
        if plan.deletion_vectors_enabled:
            # Old images of updated rows and deleted rows become DV deletes; only the new
            # images are written.
            self._delete_by_dv(fid, f, updates, deletes)
        else:
            sink.add(self._rewrite(fid, updates, deletes))
            plan.remove_files([f])
        if updates.num_rows:
            sink.add(self._new_images(updates), UPDATE_POSTIMAGE if cdf else None)

    def _record_deletes(self, deletes: dict[int, set[int]]) -> None:
        """The change data of the target rows the MERGE deletes (the old images of updated
        rows are recorded as they are read, :meth:`_apply_matched`)."""
        for fid, rids in sorted(deletes.items()):
            positions = np.fromiter(sorted(rids), dtype=np.int64)
            if self._out.deletion_vectors_enabled:  # readers tell DV deletes from the DVs
                self._out.record_changes_later(DELETE, functools.partial(self._scans[fid].rows_at, positions))
            else:
                fids = pa.chunked_array([pa.array(np.full(len(positions), fid), pa.int64())])
                self._out.record_changes(DELETE, self._full_rows(fids, pa.chunked_array([positions])))

    def _needed_columns(self) -> list[str]:
        """The target columns the join, the ON condition and the clauses read (schema order)."""
        exprs: list[ex.Expr] = [self.on]
        for clause in (*self.matched, *self.not_matched, *self.by_source):
            if clause.predicate is not None:
                exprs.append(clause.predicate)
            exprs.extend(clause.assignments.values())
        t = self.target_alias
        wanted = {c for e in exprs for c in top_level_columns(e, self.target_schema, qualifier=t)}
        return [n for n in self.target_schema.names if n in wanted]

    def _read_target(self, fid: int, target_pred: ex.Expr | None) -> pa.Table:
        """The live target rows of file ``fid`` that may satisfy ``target_pred``: only the
        columns the MERGE reads (:meth:`_needed_columns`), of only the row groups whose
        statistics allow ``target_pred``, with their file id and physical position. Full
        rows are read later, for the rows that need them (:meth:`_full_rows`)."""
        rows, positions = self._scans[fid].live_rows(self._needed, skip_by=target_pred)
        rows = rows.append_column(FILE, pa.array(np.full(rows.num_rows, fid, dtype=np.int64)))
        return rows.append_column(ROW, pa.array(positions))

    def _whole_file(self, fid: int) -> tuple[pa.Table, np.ndarray]:
        """Every live row of file ``fid`` (all columns) and their physical positions, read once."""
        got = self._whole.get(fid)
        if got is None:
            got = self._whole[fid] = self._scans[fid].live_rows()
        return got

    def _full_rows(self, file_ids: pa.ChunkedArray, positions: pa.ChunkedArray) -> pa.Table:
        """All target columns of the rows at (file id, physical position), in that order.

        With deletion vectors only the row groups holding them are read; without, the whole
        file is read once, since the rewrite needs every row of it anyway."""
        fids = np.asarray(file_ids.to_numpy(), dtype=np.int64)
        pos = np.asarray(positions.to_numpy(), dtype=np.int64)
        order = np.empty(len(fids), dtype=np.int64)
        parts: list[pa.Table] = []
        offset = 0
        for fid in np.unique(fids):
            at = np.flatnonzero(fids == fid)
            wanted = np.unique(pos[at])
            if self._out.deletion_vectors_enabled:
                parts.append(self._scans[fid].rows_at(wanted))
            else:
                rows, live = self._whole_file(int(fid))
                parts.append(rows.take(pa.array(np.searchsorted(live, wanted), pa.int64())))
            order[at] = offset + np.searchsorted(wanted, pos[at])
            offset += len(wanted)
        if not parts:
            return self.target_schema.empty_table()
        return pa.concat_tables(parts).take(pa.array(order, pa.int64()))

    def _rows_per_clause(
        self, clauses: Sequence[MergeClause[Any]], table: pa.Table
    ) -> Iterator[tuple[MergeClause[Any], pa.Table]]:
        """The rows of ``table`` each clause applies to, by the clause choice rule
        (:func:`~eventlog.ops.mergeplan.clause_cases`: the first clause whose condition holds)."""
        remaining = pa.array(np.ones(table.num_rows, dtype=bool))
        for _, clause in clause_cases(clauses):
            cond = ex.evaluate_mask(clause.predicate, table, self._resolve) if clause.predicate else None
            hit = pc.and_(remaining, cond) if cond is not None else remaining
            remaining = pc.and_(remaining, pc.invert(hit))
            rows = table.filter(hit)
            if rows.num_rows:
                yield clause, rows

    def _apply_matched(self, joined: pa.Table, merge: MergePlan[str]) -> tuple[pa.Table, dict[int, set[int]]]:
        """(updated target rows with file/row ids, {file id: deleted row ids})."""
        t = self.target_alias
        deletes: dict[int, set[int]] = {}
        empty_updates = pa.table({f"{t}.{FILE}": pa.array([], pa.int64())})
        if not merge.matched or joined.num_rows == 0:
            return empty_updates, deletes
        updated: list[pa.Table] = []
        for clause, rows in self._rows_per_clause(merge.matched, joined):
            if clause.kind == "delete":
                for fid, rid in zip(
                    rows[f"{t}.{FILE}"].to_pylist(), rows[f"{t}.{ROW}"].to_pylist(), strict=True
                ):
                    deletes.setdefault(fid, set()).add(rid)
            else:
                if len(self._needed) == len(self.target_schema.names):
                    target_cols = pa.table({n: rows[f"{t}.{n}"] for n in self.target_schema.names})
                else:  # the joined rows hold only the columns the MERGE reads
                    target_cols = self._full_rows(rows[f"{t}.{FILE}"], rows[f"{t}.{ROW}"])
                self._out.record_changes(UPDATE_PREIMAGE, target_cols)  # change data: old images
                new = apply_assignments(
                    target_cols,
                    None,
                    clause.assignments,
                    self.target_schema,
                    source=rows,
                    resolve=self._resolve,
                )
                new = new.append_column(f"{t}.{FILE}", rows[f"{t}.{FILE}"])
                new = new.append_column(f"{t}.{ROW}", rows[f"{t}.{ROW}"])
                updated.append(new)
        return (pa.concat_tables(updated) if updated else empty_updates), deletes

    def _apply_by_source(
        self,
        target: pa.Table,
        joined: pa.Table,
        updates: pa.Table,
        deletes: dict[int, set[int]],
        merge: MergePlan[str],
    ) -> tuple[pa.Table, dict[int, set[int]], tuple[int, int]]:
        """WHEN NOT MATCHED BY SOURCE: the target rows no source row matched (every live row
        was read) go to the first clause whose condition holds. Returns the updates and
        deletes with theirs added, and (rows updated, rows deleted) by these clauses."""
        t = self.target_alias
        matched = np.zeros(0, dtype=np.int64)
        if joined.num_rows:
            matched = np.unique(
                joined[f"{t}.{FILE}"].to_numpy().astype(np.int64) * (1 << 32)
                + joined[f"{t}.{ROW}"].to_numpy().astype(np.int64)
            )
        ids = target[FILE].to_numpy().astype(np.int64) * (1 << 32) + target[ROW].to_numpy().astype(np.int64)
        alone = target.filter(pa.array(~np.isin(ids, matched)))
        if not alone.num_rows:
            return updates, deletes, (0, 0)
        full = self._full_rows(alone[FILE], alone[ROW])
        env = pa.table({f"{t}.{n}": full[n] for n in full.column_names})
        env = env.append_column(f"{t}.{FILE}", alone[FILE]).append_column(f"{t}.{ROW}", alone[ROW])
        new_updates: list[pa.Table] = []
        counts = [0, 0]
        for clause, rows in self._rows_per_clause(merge.not_matched_by_source, env):
            fids, positions = rows[f"{t}.{FILE}"].to_pylist(), rows[f"{t}.{ROW}"].to_pylist()
            if clause.kind == "delete":
                for fid, rid in zip(fids, positions, strict=True):
                    deletes.setdefault(fid, set()).add(rid)
                counts[1] += rows.num_rows
                continue
            old = pa.table({n: rows[f"{t}.{n}"] for n in self.target_schema.names})
            self._out.record_changes(UPDATE_PREIMAGE, old)  # change data: old images
            new = apply_assignments(
                old, None, clause.assignments, self.target_schema, source=rows, resolve=self._resolve
            )
            new = new.append_column(f"{t}.{FILE}", rows[f"{t}.{FILE}"])
            new_updates.append(new.append_column(f"{t}.{ROW}", rows[f"{t}.{ROW}"]))
            counts[0] += rows.num_rows
        if new_updates:
            parts = ([updates] if updates.num_rows else []) + new_updates
            updates = pa.concat_tables(parts)
        return updates, deletes, (counts[0], counts[1])

    def _insert(self, source: pa.Table, matched: np.ndarray, merge: MergePlan[str]) -> pa.Table | None:
        """The rows WHEN NOT MATCHED clauses insert, of the source rows ``matched`` (a mask)
        leaves out."""
        if not merge.not_matched:
            return None
        rows = source.filter(pa.array(~matched))
        s = self.source_alias
        env = pa.table({f"{s}.{n}": rows[n] for n in self.source.schema.names}) if rows.num_rows else None
        if env is None:
            return None
        out: list[pa.Table] = []
        identity = {c.name for c in identity_columns(self.target_schema)}
        for clause, chosen in self._rows_per_clause(merge.not_matched, env):
            cols: dict[str, Any] = {}
            for field in self.target_schema:
                expr = clause.assignments.get(field.name)
                if expr is None and field.name in identity:
                    continue  # generated below
                if expr is None:
                    cols[field.name] = pa.nulls(chosen.num_rows, field.type)
                else:
                    try:
                        cols[field.name] = pc.cast(ex.evaluate(expr, chosen, self._resolve), field.type)
                    except ARROW_ERRORS as exc:
                        raise InvalidInputError(f"cannot insert into column {field.name!r}: {exc}") from exc
            rows = self._out.generate_identity(pa.table(cols), self.target_schema, "MERGE")
            out.append(rows.select(self.target_schema.names))
        return pa.concat_tables(out) if out else None

    def _dropped(self, fid: int, updates: pa.Table, deletes: dict[int, set[int]]) -> np.ndarray:
        """Physical positions (ascending) of file ``fid``'s updated and deleted rows."""
        t = self.target_alias
        gone = set(deletes.get(fid, ()))
        if updates.num_rows:
            gone.update(updates[f"{t}.{ROW}"].to_pylist())
        return np.fromiter(sorted(gone), dtype=np.int64, count=len(gone))

    def _delete_by_dv(self, fid: int, f: AddFile, updates: pa.Table, deletes: dict[int, set[int]]) -> None:
        scan = self._scans[fid]
        self._out.delete_rows(f, self._dropped(fid, updates, deletes), scan.deleted, scan.num_rows)

    def _rewrite(self, fid: int, updates: pa.Table, deletes: dict[int, set[int]]) -> pa.Table:
        """Every live row of file ``fid`` but the updated and deleted ones (the rows copied)."""
        rows, live = self._whole_file(fid)
        gone = self._dropped(fid, updates, deletes)
        kept = pc.invert(pc.is_in(pa.array(live), pa.array(gone, pa.int64())))
        copied = live[kept.to_numpy(zero_copy_only=False)]
        return self._scans[fid].tracked(rows.filter(kept), copied, self._out.row_id_columns)

    def _new_images(self, updates: pa.Table) -> pa.Table:
        """The updated rows as written: the target's columns and, with row tracking, each
        row's stable id (its commit version left null: the commit's)."""
        rows = updates.select(self.target_schema.names)
        hidden = self._out.row_id_columns
        if hidden is None:
            return rows
        t = self.target_alias
        fids = updates[f"{t}.{FILE}"].to_numpy()
        positions = updates[f"{t}.{ROW}"].to_numpy()
        ids: list[pa.Table] = []
        for fid in np.unique(fids):
            at = np.flatnonzero(fids == fid)
            got, _ = self._scans[int(fid)].stable_row_ids(positions[at], hidden)
            ids.append(pa.table({"at": pa.array(at, pa.int64()), "id": got}))
        row_ids = pa.concat_tables(ids).sort_by("at").column("id")
        return row_tracking.attach(rows, hidden, row_ids, pa.nulls(rows.num_rows, pa.int64()))


class MergeBuilder(_MergeClauses):
    """A MERGE staged in an explicit transaction (``txn.merge(...)``)."""

    def execute(self) -> None:
        """Stage the merge: plan it, write its files and record its reads. Nothing is
        visible until ``txn.commit()``, which checks it against every newer commit."""
        self.txn.run(self.plan_merge)


class TableMergeBuilder(_MergeClauses):
    """A MERGE in its own transaction (``Table.merge(...)``): ``execute()`` commits it."""

    def execute(self) -> CommitResult:
        """Stage the merge, then commit its transaction; returns the commit's result."""
        self.txn.run(self.plan_merge)
        return self.txn.commit()


@dataclasses.dataclass
class _Counts:
    """What a MERGE changed in the target files so far (its metrics)."""

    files: int = 0
    updated: int = 0
    deleted: int = 0
    by_source_updated: int = 0
    by_source_deleted: int = 0


def _repeated(joined: pa.Table, t: str) -> int:
    """How many target rows of ``joined`` more than one source row matched."""
    ids = pc.add(pc.multiply(joined[f"{t}.{FILE}"], 1 << 32), joined[f"{t}.{ROW}"])
    counts = pc.value_counts(ids).field("counts")
    return int(pc.sum(pc.greater(counts, 1)).as_py() or 0)
