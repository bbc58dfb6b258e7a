"""UPDATE in Spark jobs, planned as :func:`eventlog.ops.dml.update`: the same operation,
read predicate and actions; Spark evaluates the condition and the SET values, one job
rewrites the matching rows (:func:`spark_adapter.ops.rows.rewrite_matching`)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from pyspark.sql import Column, SparkSession
from pyspark.sql.types import StructType

from eventlog.files.generated import generated_columns
from eventlog.files.identity import check_not_assigned
from eventlog.ops.dml import begin_dml, resolve_set_columns
from eventlog.ops.transaction import Transaction
from spark_adapter.ops.jobs import (
    JobContext,
    PendingCommit,
    StagedFiles,
    condition_sql,
    read_predicate,
    run_planned,
    stage_adds,
    to_column,
)
from spark_adapter.ops.rows import rewrite_matching


def plan_update(
    spark: SparkSession,
    txn: Transaction,
    condition: str | Column | None,
    assignments: Mapping[str, str | Column],
) -> PendingCommit:
    """UPDATE, planned as eventlog.ops.dml.update; SET values are evaluated by Spark."""
    schema = StructType.fromJson(orjson.loads(txn.metadata.schema_string))
    sql = condition_sql(spark, schema, condition)
    begin_dml(txn, "UPDATE", sql)
    names = resolve_set_columns([f.name for f in schema.fields], assignments)
    check_not_assigned(txn.schema, names.values(), "UPDATE")  # identity columns (Delta)
    types = {f.name: f.dataType for f in schema.fields}
    values: dict[str, Column] = {
        names[column]: to_column(value).cast(types[names[column]]) for column, value in assignments.items()
    }
    pred, _ = read_predicate(txn, sql, strict=isinstance(condition, str))

    def plan(ctx: JobContext, staged: StagedFiles) -> None:
        files = txn.scan(pred)
        match = to_column(condition) if condition is not None else None
        touched, adds, counts = rewrite_matching(spark, ctx, txn, files, match, values)
        txn.add_metrics(numRemovedFiles=len(touched), numUpdatedRows=counts[0], numCopiedRows=counts[1])
        stage_adds(txn, staged, adds)

    # generated columns not assigned are computed from the new values (as in Delta)
    regenerate = [c for c in generated_columns(txn.schema) if c not in values]
    return run_planned(spark, txn, "UPDATE", plan, regenerate=regenerate)
