"""MERGE INTO an eventlog table from a Spark DataFrame; the join and rewrite run in Spark.

Planned as :class:`eventlog.ops.merge.MergeBuilder` plans it: the ON condition is split by
eventlog's own rules, and its target-only conjuncts are the transaction's read predicate
(``txn.scan``), so MERGEs with disjoint explicit partition predicates do not conflict.
Spark then joins the source with the scanned target rows on the whole ON condition (the
target-only part included), picks the first clause whose condition holds per row, applies
Delta's cardinality rule, and writes the updated, inserted and (without deletion vectors)
copied rows of the touched files in its tasks. One eventlog transaction commits it all.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from eventlog import Table
from eventlog import expr as ex
from eventlog.errors import InvalidInputError, MergeCardinalityError, PredicateError, UnknownColumnError
from eventlog.log.actions import AddFile
from eventlog.ops.common import check_append_only
from eventlog.ops.merge import MergeBuilder
from eventlog.ops.transaction import Transaction
from eventlog.txn.transaction import CommitResult
from spark_adapter.dml import (
    FILE_COL,
    POS_COL,
    JobContext,
    PendingCommit,
    StagedFiles,
    quoted,
    read_files,
    run_planned,
    stage_adds,
    stage_dv_deletes,
    to_column,
    write_rows,
)

_KIND = "__eventlog_kind"  # U(pdate), D(elete), I(nsert), or null (matched, no clause applies)
_MATCHED = "__eventlog_matched_clause"
_INSERT = "__eventlog_insert_clause"
_SRC = "__eventlog_source_row"


@dataclass(frozen=True)
class _Clause:
    kind: str  # "update", "delete", "insert"
    condition: str | Column | None
    values: Mapping[str, str | Column] | None  # None: every column from the source (*All)


def dataframe_alias(df: DataFrame) -> str | None:
    """The name given with ``df.alias(name)``, if that is the DataFrame's last step."""
    try:
        plan = df._jdf.queryExecution().logical()
        if plan.getClass().getSimpleName() == "SubqueryAlias":
            return str(plan.alias())
    except Exception:
        return None
    return None


def _sql(value: str | Column | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    try:
        return str(cast(Any, value)._jc.node().sql())
    except Exception:
        return None


class SparkMergeBuilder:
    """delta-spark's ``DeltaMergeBuilder``: add clauses, then ``execute()`` (or ``plan()``)."""

    def __init__(
        self,
        spark: SparkSession,
        table: Table,
        source: DataFrame,
        condition: str | Column,
        target_alias: str | None,
    ) -> None:
        self._spark = spark
        self._table = table
        self._source = source
        self._on = condition
        self._target_alias = target_alias or "target"
        self._source_alias = dataframe_alias(source) or "source"
        self._matched: list[_Clause] = []
        self._not_matched: list[_Clause] = []

    # ------------------------------------------------------------------ clauses

    def whenMatchedUpdate(
        self, condition: str | Column | None = None, set: Mapping[str, str | Column] | None = None
    ) -> SparkMergeBuilder:
        if not set:
            raise InvalidInputError("whenMatchedUpdate needs a non-empty set mapping")
        self._matched.append(_Clause("update", condition, dict(set)))
        return self

    def whenMatchedUpdateAll(self, condition: str | Column | None = None) -> SparkMergeBuilder:
        self._matched.append(_Clause("update", condition, None))
        return self

    def whenMatchedDelete(self, condition: str | Column | None = None) -> SparkMergeBuilder:
        self._matched.append(_Clause("delete", condition, {}))
        return self

    def whenNotMatchedInsert(
        self, condition: str | Column | None = None, values: Mapping[str, str | Column] | None = None
    ) -> SparkMergeBuilder:
        if not values:
            raise InvalidInputError("whenNotMatchedInsert needs a non-empty values mapping")
        self._not_matched.append(_Clause("insert", condition, dict(values)))
        return self

    def whenNotMatchedInsertAll(self, condition: str | Column | None = None) -> SparkMergeBuilder:
        self._not_matched.append(_Clause("insert", condition, None))
        return self

    # ------------------------------------------------------------------ execution

    def execute(self) -> CommitResult:
        """Run the merge and commit it as one transaction."""
        return self.plan().commit()

    def plan(self) -> PendingCommit:
        """Run the Spark jobs and stage the actions without committing (two-phase use:
        ``pending.commit()`` then validates against whatever committed meanwhile)."""
        if not self._matched and not self._not_matched:
            raise InvalidInputError("MERGE needs at least one WHEN clause")
        txn = self._table.transaction()
        on_sql = _sql(self._on)
        txn.set_operation(
            "MERGE",
            {
                "predicate": on_sql,
                "matchedPredicates": [
                    {"actionType": c.kind, "predicate": _sql(c.condition)} for c in self._matched
                ],
                "notMatchedPredicates": [
                    {"actionType": c.kind, "predicate": _sql(c.condition)} for c in self._not_matched
                ],
            },
        )
        if self._matched:
            check_append_only(txn, "MERGE with WHEN MATCHED")
        target_pred = self._read_predicate(txn, on_sql)

        def plan(ctx: JobContext, staged: StagedFiles) -> None:
            files = txn.scan(target_pred)
            self._run(ctx, staged, txn, files)

        return run_planned(self._spark, txn, "MERGE", plan)

    def _read_predicate(self, txn: Transaction, on_sql: str | None) -> ex.Expr | None:
        """The target-only conjuncts of ON, unqualified (None: the whole table is read)."""
        if on_sql is None:
            return None
        ta, sa = self._target_alias, self._source_alias
        source_schema = to_arrow_schema(self._source.schema, timezone="UTC")
        qualifiers = {ta: txn.schema, sa: source_schema}
        try:
            ex.parse_predicate(on_sql, txn.schema, qualifiers=qualifiers, context="merge ON")
        except UnknownColumnError:
            if isinstance(self._on, str):
                raise
            return None
        except PredicateError:
            # Spark-only syntax: Spark evaluates it; reading everything keeps conflicts exact.
            return None
        # eventlog's own split, so the read set is exactly the plain-Python MERGE's.
        builder = MergeBuilder(txn, source_schema.empty_table(), on_sql, source_alias=sa, target_alias=ta)
        return builder.target_predicate()

    def _values(self, clause: _Clause, names: list[str]) -> dict[str, Column]:
        """Target column -> value (a Spark Column) for an update or insert clause."""
        sa = self._source_alias
        if clause.values is None:
            source_names = {n.lower(): n for n in self._source.columns}
            out = {n: quoted(source_names[n.lower()], sa) for n in names if n.lower() in source_names}
            if not out:
                raise InvalidInputError("the merge source shares no column with the target")
            extra = sorted(set(source_names) - {n.lower() for n in names})
            if extra:
                raise InvalidInputError(f"merge source columns not in the target: {extra}")
            return out
        by_lower = {n.lower(): n for n in names}
        resolved: dict[str, Column] = {}
        for column, value in clause.values.items():
            name = by_lower.get(column.split(".")[-1].lower())
            if name is None:
                raise UnknownColumnError(column, names, "merge SET")
            resolved[name] = to_column(value)
        return resolved

    def _run(self, ctx: JobContext, staged: StagedFiles, txn: Transaction, files: list[AddFile]) -> None:
        spark, ta = self._spark, self._target_alias
        schema = ctx.spark_schema
        names = [f.name for f in schema.fields]
        types = {f.name: f.dataType for f in schema.fields}
        matched_values = [self._values(c, names) if c.kind == "update" else {} for c in self._matched]
        insert_values = [self._values(c, names) for c in self._not_matched]

        target = read_files(spark, ctx, list(enumerate(files))).alias(ta)
        # Left outer keeps every source row: unmatched ones feed the insert clauses, and the
        # row ids let the same job count the source rows (no extra pass over the source).
        source = self._source.withColumn(_SRC, F.monotonically_increasing_id()).alias(self._source_alias)
        joined = source.join(target, to_column(self._on), "left_outer")
        is_matched = quoted(FILE_COL, ta).isNotNull()
        joined = joined.withColumn(_MATCHED, _first(is_matched, [c.condition for c in self._matched]))
        joined = joined.withColumn(_INSERT, _first(~is_matched, [c.condition for c in self._not_matched]))

        def value(n: str) -> Column:
            out: Any = None
            for i, (c, vals) in enumerate(zip(self._matched, matched_values, strict=True)):
                if c.kind == "update":
                    out = _when(out, F.col(_MATCHED) == i, vals.get(n, quoted(n, ta)).cast(types[n]))
            for j, vals in enumerate(insert_values):
                if n in vals:
                    out = _when(out, F.col(_INSERT) == j, vals[n].cast(types[n]))
            return (out if out is not None else F.lit(None)).cast(types[n]).alias(n)

        updates = [i for i, c in enumerate(self._matched) if c.kind == "update"]
        deletes = [i for i, c in enumerate(self._matched) if c.kind == "delete"]
        kind: Any = None
        if updates:
            kind = _when(kind, F.col(_MATCHED).isin(updates), F.lit("U"))
        if deletes:
            kind = _when(kind, F.col(_MATCHED).isin(deletes), F.lit("D"))
        kind = _when(kind, F.col(_INSERT).isNotNull(), F.lit("I"))
        tagged = joined.select(
            kind.alias(_KIND),
            quoted(_SRC, self._source_alias).alias(_SRC),
            quoted(FILE_COL, ta).alias(FILE_COL),
            quoted(POS_COL, ta).alias(POS_COL),
            *[value(n) for n in names],
        )
        # Two jobs read the joined rows: compute the join once (and see one consistent
        # version of a non-deterministic source).
        tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._stage(ctx, staged, txn, files, tagged, names)
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
        ]
        if use_dv:
            aggs.append(F.collect_set(F.when(changed, F.col(POS_COL))).alias("positions"))
        # Per file, plus one grand-total row (grouping = 1) for the distinct source rows.
        grouped = tagged.rollup(FILE_COL).agg(*aggs, F.grouping(FILE_COL).alias("total")).collect()
        summary = [r for r in grouped if not r.total]
        sources = sum(r.sources for r in grouped if r.total)  # no row at all for an empty source
        delete_only = (
            len(self._matched) == 1
            and self._matched[0].kind == "delete"
            and self._matched[0].condition is None
        )
        if self._matched and not delete_only and any(r.matches > r.rows for r in summary):
            # Delta's cardinality rule; counting the offending rows takes one more job.
            dup = (
                tagged.where(F.col(FILE_COL).isNotNull())
                .groupBy(FILE_COL, POS_COL)
                .count()
                .where(F.col("count") > 1)
                .count()
            )
            raise MergeCardinalityError(
                f"MERGE matched {dup} target rows with more than one source row; a target row "
                "can be updated or deleted by at most one source row",
                rows=dup,
            )
        per_file = {r[FILE_COL]: r for r in summary if r[FILE_COL] is not None and r.u + r.d > 0}
        touched = sorted(per_file)
        updated = sum(r.u for r in summary)
        inserted = sum(r.i for r in summary)
        parts: list[DataFrame] = []
        if updated or inserted:
            parts.append(tagged.where(k.isin("U", "I")).select(*[quoted(n) for n in names]))
        if touched and not use_dv:
            keys = tagged.where(changed).select(FILE_COL, POS_COL).distinct()
            kept = read_files(spark, ctx, [(fid, files[fid]) for fid in touched])
            parts.append(
                kept.join(keys, [FILE_COL, POS_COL], "left_anti").select(*[quoted(n) for n in names])
            )
        adds = write_rows(spark, ctx, functools.reduce(DataFrame.unionByName, parts)) if parts else []
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
            numTargetFilesRemoved=len(touched),
            numTargetRowsUpdated=updated,
            numTargetRowsDeleted=sum(r.d for r in summary),
            numTargetRowsInserted=inserted,
            numSourceRows=sources,
        )
        stage_adds(txn, staged, adds)


def _when(chain: Any, test: Column, value: Column) -> Column:
    return F.when(test, value) if chain is None else chain.when(test, value)


def _first(base: Column, conditions: list[str | Column | None]) -> Column:
    """Index of the first clause whose condition holds where ``base`` holds (else null)."""
    out: Any = None
    for i, cond in enumerate(conditions):
        test = base if cond is None else base & to_column(cond)
        out = _when(out, test, F.lit(i))
    return out if out is not None else F.lit(None).cast("int")
