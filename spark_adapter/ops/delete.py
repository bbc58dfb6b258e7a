"""DELETE in Spark jobs, planned as :func:`eventlog.ops.dml.delete`: the same operation,
read predicate and actions; whole files are removed unread when the condition covers them
(:func:`eventlog.ops.rows.removes_whole_files`), other matching rows are deleted by one
Spark job (:func:`spark_adapter.ops.rows.rewrite_matching`)."""

from __future__ import annotations

import orjson
from pyspark.sql import Column, SparkSession
from pyspark.sql.types import StructType

from eventlog.ops.dml import begin_dml
from eventlog.ops.rows import remove_whole_files, removes_whole_files
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


def plan_delete(spark: SparkSession, txn: Transaction, condition: str | Column | None) -> PendingCommit:
    """DELETE, planned as eventlog.ops.dml.delete (same read predicate and actions)."""
    sql = condition_sql(spark, StructType.fromJson(orjson.loads(txn.metadata.schema_string)), condition)
    begin_dml(txn, "DELETE", sql)
    pred, exact = read_predicate(txn, sql, strict=isinstance(condition, str))

    def plan(ctx: JobContext, staged: StagedFiles) -> None:
        files = txn.scan(pred)
        if condition is None or (exact and pred is not None and removes_whole_files(txn, pred)):
            removed, live, _ = remove_whole_files(txn, files)
            txn.add_metrics(numRemovedFiles=removed, numDeletedRows=live, numCopiedRows=0)
            return
        touched, adds, counts = rewrite_matching(spark, ctx, txn, files, to_column(condition), None)
        txn.add_metrics(numRemovedFiles=len(touched), numDeletedRows=counts[0], numCopiedRows=counts[1])
        stage_adds(txn, staged, adds)

    return run_planned(spark, txn, "DELETE", plan)
