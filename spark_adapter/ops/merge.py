"""MERGE INTO an eventlog table from a Spark DataFrame: the Spark executor of the shared
MERGE plan.

The plan comes from :mod:`eventlog.ops.mergeplan`, as for the pyarrow MERGE
(:mod:`eventlog.ops.merge`): the ON split and its target predicate (the transaction's read
set, so MERGEs with disjoint explicit partition predicates do not conflict), the clauses
(kinds, SET columns, ``*All``), the choice rule, the cardinality rule and commitInfo.
Spark Columns are planned by their SQL text; an ON eventlog cannot parse (Spark-only
syntax, a Column without SQL) is evaluated by Spark alone and the MERGE reads the whole
target. Clause conditions and values are evaluated by Spark, never parsed by eventlog.

This module owns the Spark jobs: it joins the source with the scanned target rows on the
whole ON condition (the target-only part included), tags each joined row with the clause
that applies, checks cardinality, and writes the updated, inserted and (without deletion
vectors) copied rows of the touched files in its tasks. Identity values of inserted rows
whose clause leaves the column out are reserved in the writing tasks, as the batch writer
does (:class:`eventlog.table.identity.TaskIdentity`; the driver records the ranges, so the
commit moves the high-water marks). One eventlog transaction commits it all.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from eventlog import Table
from eventlog.errors import IdentityColumnError, PredicateError
from eventlog.files.change_data import CHANGE_TYPE_COLUMN, DELETE, INSERT, UPDATE_POSTIMAGE, UPDATE_PREIMAGE
from eventlog.files.generated import generated_columns
from eventlog.files.identity import check_no_explicit_values, check_not_assigned, identity_columns
from eventlog.log.actions import AddFile
from eventlog.log.commitlog import SlotsSpec
from eventlog.ops.mergeplan import (
    ClauseSpec,
    MergeClause,
    MergePlan,
    MergeScope,
    begin_merge,
    cardinality_error,
    clause_cases,
    merge_metrics,
    require_clauses,
)
from eventlog.ops.transaction import Transaction
from eventlog.txn.transaction import CommitResult
from spark_adapter.ops.jobs import (
    CHANGE_COL,
    FILE_COL,
    POS_COL,
    IdentityFlags,
    JobContext,
    PendingCommit,
    StagedFiles,
    quoted,
    run_planned,
    scan_files,
    stage_adds,
    stage_dv_deletes,
    to_column,
    write_rows_generating,
)
from spark_adapter.ops.rows import stage_change_rows
from spark_adapter.session import connect_alias, connect_column_sql, is_connect, is_connect_column

_KIND = "__eventlog_kind"  # U(pdate), D(elete), I(nsert), or null (matched, no clause applies)
_MATCHED = "__eventlog_matched_clause"
_INSERT = "__eventlog_insert_clause"
_BY_SOURCE = "__eventlog_by_source_clause"
_SRC = "__eventlog_source_row"

Value = str | Column  # a condition or SET value: SQL text or a Spark Column


def dataframe_alias(df: DataFrame) -> str | None:
    """The name given with ``df.alias(name)``, if that is the DataFrame's last step."""
    if is_connect(df.sparkSession):
        return connect_alias(df)
    try:
        plan = df._jdf.queryExecution().logical()
        if plan.getClass().getSimpleName() == "SubqueryAlias":
            return str(plan.alias())
    except Exception:
        return None
    return None


def _sql(value: Value | None) -> str | None:
    """SQL text of a condition (None: no SQL for this Column)."""
    if value is None or isinstance(value, str):
        return value
    if is_connect_column(value):
        return connect_column_sql(value)
    try:
        return str(cast(Any, value)._jc.node().sql())
    except Exception:
        return None


def _source_schema(df: DataFrame, *, required: bool) -> pa.Schema:
    """The source's Arrow schema; when it has none and ON is not planned (``required``
    false), its column names (all ``*All`` needs)."""
    try:
        return to_arrow_schema(df.schema, timezone="UTC")
    except Exception:
        if required:
            raise
        return pa.schema([pa.field(n, pa.null()) for n in df.columns])


class SparkMergeBuilder:
    """delta-spark's ``DeltaMergeBuilder``: add clauses, then ``execute()`` (or ``plan()``)."""

    def __init__(
        self,
        spark: SparkSession,
        table: Table,
        source: DataFrame,
        condition: str | Column,
        target_alias: str | None,
        slots: SlotsSpec = None,
    ) -> None:
        self._spark = spark
        self._table = table
        self._slots = slots  # how the tasks reach the slot store (identity values)
        self._generate: dict[str, list[int]] = {}  # identity column -> insert clauses leaving it out
        self._source = source
        self._on = condition
        self._target_alias = target_alias or "target"
        self._source_alias = dataframe_alias(source) or "source"
        self._matched: list[ClauseSpec[Value]] = []
        self._not_matched: list[ClauseSpec[Value]] = []
        self._by_source: list[ClauseSpec[Value]] = []

    # ------------------------------------------------------------------ clauses

    def whenMatchedUpdate(
        self, condition: Value | None = None, set: Mapping[str, Value] | None = None
    ) -> SparkMergeBuilder:
        self._matched.append(ClauseSpec.update(condition, set, method="whenMatchedUpdate"))
        return self

    def whenMatchedUpdateAll(self, condition: Value | None = None) -> SparkMergeBuilder:
        self._matched.append(ClauseSpec.update_all(condition))
        return self

    def whenMatchedDelete(self, condition: Value | None = None) -> SparkMergeBuilder:
        self._matched.append(ClauseSpec.delete(condition))
        return self

    def whenNotMatchedInsert(
        self, condition: Value | None = None, values: Mapping[str, Value] | None = None
    ) -> SparkMergeBuilder:
        self._not_matched.append(ClauseSpec.insert(condition, values, method="whenNotMatchedInsert"))
        return self

    def whenNotMatchedInsertAll(self, condition: Value | None = None) -> SparkMergeBuilder:
        self._not_matched.append(ClauseSpec.insert_all(condition))
        return self

    def whenNotMatchedBySourceUpdate(
        self, condition: Value | None = None, set: Mapping[str, Value] | None = None
    ) -> SparkMergeBuilder:
        """WHEN NOT MATCHED BY SOURCE [AND condition] THEN UPDATE SET ...: target rows no
        source row matches (their condition and values read target columns only)."""
        self._by_source.append(ClauseSpec.update(condition, set, method="whenNotMatchedBySourceUpdate"))
        return self

    def whenNotMatchedBySourceDelete(self, condition: Value | None = None) -> SparkMergeBuilder:
        """WHEN NOT MATCHED BY SOURCE [AND condition] THEN DELETE."""
        self._by_source.append(ClauseSpec.delete(condition))
        return self

    # ------------------------------------------------------------------ execution

    def execute(self) -> CommitResult:
        """Run the merge and commit it as one transaction."""
        return self.plan().commit()

    def plan(self) -> PendingCommit:
        """Run the Spark jobs and stage the actions without committing (two-phase use:
        ``pending.commit()`` then validates against whatever committed meanwhile)."""
        require_clauses(self._matched, self._not_matched, self._by_source)
        txn = self._table.transaction()
        on_sql = _sql(self._on)
        source_schema = _source_schema(self._source, required=on_sql is not None)
        scope = MergeScope(txn.schema, source_schema, self._target_alias, self._source_alias)
        on = scope.parse_on_if_possible(on_sql, strict_columns=isinstance(self._on, str))
        matched = [scope.resolve(c, parse=False, sql=_sql) for c in self._matched]
        not_matched = [scope.resolve(c, parse=False, sql=_sql) for c in self._not_matched]
        by_source = [_resolve_by_source(scope, c) for c in self._by_source]
        merge = begin_merge(txn, scope, on_sql, on, matched, not_matched, by_source)
        self._generate = _check_identity(txn.schema, matched, not_matched)
        if self._generate and not (self._slots is None or isinstance(self._slots, str)):
            column = next(iter(self._generate))
            raise IdentityColumnError(
                f"MERGE through Spark: identity column {column} needs values reserved in the "
                "Spark tasks, which reach the slot store by its spec: open the table with "
                "slots=<spec string> (or use Table.merge)",
                column=column,
                reason="not supported",
                operation="MERGE",
            )

        def plan(ctx: JobContext, staged: StagedFiles) -> None:
            files = txn.scan(merge.target_predicate)
            self._run(ctx, staged, txn, files, merge)

        # generated columns no clause assigns are computed from the rows' new values
        assigned = {
            name.lower()
            for c in (*matched, *not_matched, *by_source)
            for name in (c.from_source or c.values or {})
        }
        regenerate = [c for c in generated_columns(txn.schema) if c.lower() not in assigned]
        return run_planned(self._spark, txn, "MERGE", plan, regenerate=regenerate)

    def _values(self, clause: MergeClause[Value]) -> dict[str, Column]:
        """Target column -> value (a Spark Column) for an update or insert clause."""
        if clause.from_source:
            return {t: quoted(s, self._source_alias) for t, s in clause.from_source.items()}
        return {name: to_column(value) for name, value in clause.values.items()}

    def _run(
        self,
        ctx: JobContext,
        staged: StagedFiles,
        txn: Transaction,
        files: list[AddFile],
        merge: MergePlan[str | Column],
    ) -> None:
        spark, ta = self._spark, self._target_alias
        schema = ctx.spark_schema
        names = [f.name for f in schema.fields]
        types = {f.name: f.dataType for f in schema.fields}
        matched_values = [self._values(c) if c.kind == "update" else {} for c in merge.matched]
        insert_values = [self._values(c) for c in merge.not_matched]
        by_source_values = [
            self._values(c) if c.kind == "update" else {} for c in merge.not_matched_by_source
        ]

        target = scan_files(spark, ctx, txn, list(enumerate(files))).alias(ta)
        # Left outer keeps every source row: unmatched ones feed the insert clauses, and the
        # row ids let the same job count the source rows (no extra pass over the source).
        source = self._source.withColumn(_SRC, F.monotonically_increasing_id()).alias(self._source_alias)
        # WHEN NOT MATCHED BY SOURCE needs the target rows no source row matches too: a full
        # outer join (the MERGE then reads the whole target: merge.target_predicate is None).
        how = "full_outer" if merge.not_matched_by_source else "left_outer"
        joined = source.join(target, to_column(self._on), how)
        has_target = quoted(FILE_COL, ta).isNotNull()
        has_source = quoted(_SRC, self._source_alias).isNotNull()
        joined = joined.withColumn(_MATCHED, _first(has_target & has_source, merge.matched))
        joined = joined.withColumn(_INSERT, _first(~has_target, merge.not_matched))
        joined = joined.withColumn(_BY_SOURCE, _first(has_target & ~has_source, merge.not_matched_by_source))

        def value(n: str) -> Column:
            out: Any = None
            for i, (c, vals) in enumerate(zip(merge.matched, matched_values, strict=True)):
                if c.kind == "update":
                    out = _when(out, F.col(_MATCHED) == i, vals.get(n, quoted(n, ta)).cast(types[n]))
            for j, vals in enumerate(insert_values):
                if n in vals:
                    out = _when(out, F.col(_INSERT) == j, vals[n].cast(types[n]))
            for k, (c, vals) in enumerate(zip(merge.not_matched_by_source, by_source_values, strict=True)):
                if c.kind == "update":
                    out = _when(out, F.col(_BY_SOURCE) == k, vals.get(n, quoted(n, ta)).cast(types[n]))
            return (out if out is not None else F.lit(None)).cast(types[n]).alias(n)

        updates = [i for i, c in enumerate(merge.matched) if c.kind == "update"]
        deletes = [i for i, c in enumerate(merge.matched) if c.kind == "delete"]
        kind: Any = None
        if updates:
            kind = _when(kind, F.col(_MATCHED).isin(updates), F.lit("U"))
        if deletes:
            kind = _when(kind, F.col(_MATCHED).isin(deletes), F.lit("D"))
        kind = _when(kind, F.col(_INSERT).isNotNull(), F.lit("I"))
        for k, c in enumerate(merge.not_matched_by_source):
            kind = _when(kind, F.col(_BY_SOURCE) == k, F.lit("U" if c.kind == "update" else "D"))
        # Inserted rows whose clause leaves an identity column out: the writing tasks
        # reserve their values (the column is null in them until then).
        flags = [
            F.coalesce(F.col(_INSERT).isin(clauses), F.lit(False)).alias(_flag(i))
            for i, clauses in enumerate(self._generate.values())
        ]
        # With the change data feed on, the target's old values ride along (old images).
        old = [quoted(n, ta).alias(_old(i)) for i, n in enumerate(names)] if txn.change_data_enabled else []
        # Row tracking: an updated row keeps its stable id (an inserted one has none yet), and
        # takes the commit's version (null).
        ids = []
        if ctx.hidden is not None:
            ids = [
                quoted(ctx.hidden[0], ta).alias(ctx.hidden[0]),
                F.lit(None).cast("long").alias(ctx.hidden[1]),
            ]
        tagged = joined.select(
            kind.alias(_KIND),
            F.col(_BY_SOURCE).isNotNull().alias(_BY_SOURCE),
            quoted(_SRC, self._source_alias).alias(_SRC),
            quoted(FILE_COL, ta).alias(FILE_COL),
            quoted(POS_COL, ta).alias(POS_COL),
            *[value(n) for n in names],
            *ids,
            *flags,
            *old,
        )
        # Two jobs read the joined rows: compute the join once (and see one consistent
        # version of a non-deterministic source).
        tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._stage(ctx, staged, txn, files, tagged, names, merge)
        finally:
            tagged.unpersist()

    def _stage(
        self,
        ctx: JobContext,
        staged: StagedFiles,
        txn: Transaction,
        files: list[AddFile],
        tagged: DataFrame,
        names: list[str],
        merge: MergePlan[str | Column],
    ) -> None:
        spark = self._spark
        use_dv = txn.deletion_vectors_enabled
        k = F.col(_KIND)
        changed = k.isin("U", "D")
        aggs = [
            F.count(F.when(k == "U", 1)).alias("u"),
            # An unconditional delete may match a target row several times: count rows once.
            F.size(F.collect_set(F.when(k == "D", F.col(POS_COL)))).alias("d"),
            F.count(F.when(k == "I", 1)).alias("i"),
            F.count(F.col(POS_COL)).alias("matches"),
            F.countDistinct(F.col(POS_COL)).alias("rows"),
            F.countDistinct(F.col(_SRC)).alias("sources"),
            F.count(F.when((k == "U") & F.col(_BY_SOURCE), 1)).alias("bu"),
            F.count(F.when((k == "D") & F.col(_BY_SOURCE), 1)).alias("bd"),
        ]
        if use_dv:
            aggs.append(F.collect_set(F.when(changed, F.col(POS_COL))).alias("positions"))
        # Per file, plus one grand-total row (grouping = 1) for the distinct source rows.
        grouped = tagged.rollup(FILE_COL).agg(*aggs, F.grouping(FILE_COL).alias("total")).collect()
        summary = [r for r in grouped if not r.total]
        sources = sum(r.sources for r in grouped if r.total)  # no row at all for an empty source
        if merge.checks_cardinality and any(r.matches > r.rows for r in summary):
            # Counting the offending rows takes one more job.
            dup = (
                tagged.where(F.col(FILE_COL).isNotNull())
                .groupBy(FILE_COL, POS_COL)
                .count()
                .where(F.col("count") > 1)
                .count()
            )
            raise cardinality_error(dup)
        per_file = {r[FILE_COL]: r for r in summary if r[FILE_COL] is not None and r.u + r.d > 0}
        touched = sorted(per_file)
        updated = sum(r.u for r in summary)
        inserted = sum(r.i for r in summary)
        flags = {column: _flag(i) for i, column in enumerate(self._generate)}
        deleted = sum(r.d for r in summary)
        # Change files when a change is row-level (Delta's rule, eventlog.files.change_data):
        # the write tasks record the new and inserted rows as written, one more job the old.
        changes = txn.change_data_enabled and bool(updated or (deleted and not use_dv))
        tag = []
        if changes:
            tag = [F.when(k == "U", F.lit(UPDATE_POSTIMAGE)).otherwise(F.lit(INSERT)).alias(CHANGE_COL)]
        parts: list[DataFrame] = []
        hidden = list(ctx.hidden or ())  # row tracking: written rows keep their stable ids
        if updated or inserted:
            parts.append(
                tagged.where(k.isin("U", "I")).select(
                    *[quoted(n) for n in (*names, *hidden, *flags.values())], *tag
                )
            )
        if touched and not use_dv:
            keys = tagged.where(changed).select(FILE_COL, POS_COL).distinct()
            kept = scan_files(spark, ctx, txn, [(fid, files[fid]) for fid in touched])
            copied = [F.lit(None).cast("string").alias(CHANGE_COL)] if changes else []
            parts.append(
                kept.join(keys, [FILE_COL, POS_COL], "left_anti").select(
                    *[quoted(n) for n in (*names, *hidden)],
                    *[F.lit(False).alias(f) for f in flags.values()],
                    *copied,
                )
            )
        if changes:
            old_images = tagged.where(changed).dropDuplicates([FILE_COL, POS_COL])
            stage_change_rows(
                ctx,
                txn,
                old_images.select(
                    *[quoted(_old(i)).alias(n) for i, n in enumerate(names)],
                    F.when(k == "U", F.lit(UPDATE_PREIMAGE))
                    .otherwise(F.lit(DELETE))
                    .alias(CHANGE_TYPE_COLUMN),
                ),
            )
        adds: list[AddFile] = []
        if parts:
            identity = IdentityFlags(cast(str | None, self._slots), flags) if flags else None
            rows = functools.reduce(DataFrame.unionByName, parts)
            adds, ranges, cdc = write_rows_generating(spark, ctx, rows, identity)
            txn.record_identity(ranges)  # the commit moves the marks and records the ranges
            txn.add_change_files(cdc)
        if use_dv:
            # Old images of updated rows and deleted rows become DV deletes.
            stage_dv_deletes(
                txn,
                {fid: files[fid] for fid in touched},
                {fid: list(per_file[fid].positions) for fid in touched},
            )
        else:
            txn.remove_files([files[fid] for fid in touched])
        txn.add_metrics(
            **merge_metrics(
                files_removed=len(touched),
                updated=updated,
                deleted=sum(r.d for r in summary),
                inserted=inserted,
                source_rows=sources,
                by_source_updated=sum(r.bu for r in summary),
                by_source_deleted=sum(r.bd for r in summary),
            )
        )
        stage_adds(txn, staged, adds)


def _check_identity(
    schema: pa.Schema, matched: Sequence[MergeClause[Any]], not_matched: Sequence[MergeClause[Any]]
) -> dict[str, list[int]]:
    """Identity columns, as Delta: no update clause may set one, ``UPDATE SET *`` with a
    source that has the column included (``DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED``),
    and no insert may supply a ``GENERATED ALWAYS`` one. Returns, per identity column, the
    insert clauses (indices) that leave it to be generated."""
    for clause in matched:
        if clause.kind == "update":
            check_not_assigned(schema, clause.from_source or clause.values, "MERGE")
    columns = identity_columns(schema)
    generate: dict[str, list[int]] = {}
    for index, clause in enumerate(not_matched):
        given = {n.lower() for n in (clause.from_source or clause.values or {})}
        check_no_explicit_values(columns, given, "MERGE")
        for column in columns:
            if column.name.lower() not in given:
                generate.setdefault(column.name, []).append(index)
    return generate


def _old(index: int) -> str:
    """The column holding target column ``index``'s old value (change data)."""
    return f"__eventlog_old_{index}"


def _flag(index: int) -> str:
    """The flag column of the ``index``-th identity column to generate values for."""
    return f"__eventlog_identity_{index}"


def _resolve_by_source(scope: MergeScope, spec: ClauseSpec[Value]) -> MergeClause[Value]:
    """A BY SOURCE clause: given as SQL text, its columns are checked as the engine checks
    them (target columns only); Spark Columns are left to Spark."""
    texts = [spec.condition, *(spec.values or {}).values()]
    checked: MergeClause[str] | None = None
    if all(isinstance(t, str) or t is None for t in texts):
        try:
            checked = scope.resolve_by_source(cast(ClauseSpec[str], spec))
        except PredicateError:
            checked = None  # Spark-only syntax: Spark evaluates it
    if checked is not None:
        return cast(MergeClause[Value], checked)
    return scope.resolve(spec, parse=False, sql=_sql)


def _when(chain: Any, test: Column, value: Column) -> Column:
    return F.when(test, value) if chain is None else chain.when(test, value)


def _first(base: Column, clauses: Sequence[MergeClause[str | Column]]) -> Column:
    """Index of the clause that applies where ``base`` holds (else null): the planner's
    choice rule (:func:`eventlog.ops.mergeplan.clause_cases`) as a CASE WHEN."""
    out: Any = None
    for i, clause in clause_cases(clauses):
        cond = clause.condition
        test = base if cond is None else base & to_column(cond)
        out = _when(out, test, F.lit(i))
    return out if out is not None else F.lit(None).cast("int")
