"""Rewriting the rows a condition matches, in one Spark job: shared by DELETE and UPDATE.

Spark evaluates the condition (and UPDATE's SET values) on the live rows of the scanned
files; each task sees every row of its files and, per file with a matching row, writes
the surviving (DELETE) or rewritten (UPDATE) rows, or reports the matched positions for a
deletion vector (:mod:`eventlog.ops.rows` and :mod:`eventlog.ops.dml` do the same with
pyarrow).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from eventlog.files.change_data import CHANGE_TYPE_COLUMN, DELETE, UPDATE_POSTIMAGE, UPDATE_PREIMAGE
from eventlog.log.actions import AddFile
from eventlog.ops.transaction import Transaction
from spark_adapter.errors import typed_task_errors
from spark_adapter.native import tagged_rows
from spark_adapter.ops.jobs import (
    FILE_COL,
    POS_COL,
    RESULT,
    JobContext,
    Result,
    TaskOutput,
    add_results,
    adds_of,
    change_files_of,
    quoted,
    read_files,
    result_batch,
    stage_dv_deletes,
    write_rows,
)

MATCH_COL = "__eventlog_match"


def rewrite_matching(
    spark: SparkSession,
    ctx: JobContext,
    txn: Transaction,
    files: Sequence[AddFile],
    match: Column | None,
    values: Mapping[str, Column] | None,
) -> tuple[list[AddFile], list[AddFile], tuple[int, int]]:
    """One Spark job: read ``files``, evaluate ``match`` (and the SET values), and per file
    with a matching row write the rewritten rows (or record DV positions).

    Returns (touched files, new files, (matched rows, copied rows)); stages the removes.
    """
    if not files:
        return [], [], (0, 0)
    hit = F.coalesce(match, F.lit(False)) if match is not None else F.lit(True)
    ids = list(enumerate(files))
    native = None
    if ctx.hidden is None:  # row tracking reads in Python tasks, which give stable ids
        native = tagged_rows(spark, ctx.location, txn.snapshot, ctx.schema_string, ids, FILE_COL, POS_COL)
    if native is not None:
        return _rewrite_natively(spark, ctx, txn, files, native.withColumn(MATCH_COL, hit), values)
    use_dv = txn.deletion_vectors_enabled
    names = ctx.arrow_schema.names
    rows = read_files(spark, ctx, list(enumerate(files)))
    rows = source = rows.withColumn(MATCH_COL, hit)
    if values is not None:
        m = F.col(MATCH_COL)
        rows = rows.select(
            *[
                F.when(m, values[n]).otherwise(quoted(n)).alias(n) if n in values else quoted(n)
                for n in names
            ],
            *updated_ids(ctx, m),
            FILE_COL,
            POS_COL,
            MATCH_COL,
        )
    mode = "delete" if values is None else "update"
    # Only narrow steps since read_files: each task sees every row of its files.
    task = functools.partial(_rewrite_task, ctx, mode, use_dv)
    results = rows.mapInArrow(task, RESULT).collect()
    by_id = dict(enumerate(files))
    per_file = sorted((r for r in results if r.kind == "file"), key=lambda r: r.fid)
    touched = [by_id[r.fid] for r in per_file]
    if use_dv:
        # Old images become DV-deleted rows (eventlog.ops.dml does the same).
        stage_dv_deletes(txn, by_id, {r.fid: list(r.positions) for r in per_file})
    else:
        txn.remove_files(touched)
    counts = (sum(r.n1 for r in per_file), sum(r.n2 for r in per_file))
    if per_file:
        stage_changes(spark, ctx, txn, source, values)
    return touched, adds_of(results), counts


def _rewrite_natively(
    spark: SparkSession,
    ctx: JobContext,
    txn: Transaction,
    files: Sequence[AddFile],
    rows: DataFrame,
    values: Mapping[str, Column] | None,
) -> tuple[list[AddFile], list[AddFile], tuple[int, int]]:
    """:func:`rewrite_matching` on rows read by Spark's Parquet reader, where one file's rows
    may be split over tasks: a first job finds the touched files (and, with deletion vectors,
    the matched positions), a second reads the touched files again and writes their rows."""
    use_dv = txn.deletion_vectors_enabled
    m = F.col(MATCH_COL)
    aggs = [F.count(F.lit(1)).alias("live"), F.count(F.when(m, 1)).alias("hits")]
    if use_dv:
        aggs.append(F.collect_list(F.when(m, F.col(POS_COL))).alias("positions"))
    hits = rows.groupBy(FILE_COL).agg(*aggs).where(F.col("hits") > 0)
    per_file = sorted(hits.collect(), key=lambda r: r[0])
    by_id = dict(enumerate(files))
    touched = [by_id[r[0]] for r in per_file]
    if not touched:
        return [], [], (0, 0)
    matched = sum(r.hits for r in per_file)
    names = ctx.arrow_schema.names
    again = rows.where(F.col(FILE_COL).isin([r[0] for r in per_file]))
    if use_dv:
        # Old images become DV-deleted rows; UPDATE writes the new images.
        stage_dv_deletes(txn, by_id, {r[0]: list(r.positions) for r in per_file})
        copied = 0
        new_rows = None
        if values is not None:
            new_rows = again.where(m).select(*[_value(n, values) for n in names])
    else:
        txn.remove_files(touched)
        copied = sum(r.live - r.hits for r in per_file)
        if values is None:
            new_rows = again.where(~m)
        else:
            new_rows = again.select(*[_value(n, values, unless=~m) for n in names])
    adds = write_rows(spark, ctx, new_rows) if new_rows is not None else []
    stage_changes(spark, ctx, txn, rows, values)
    return touched, adds, (matched, copied)


def updated_ids(ctx: JobContext, updated: Column) -> list[Column]:
    """Row tracking's hidden columns of rows an UPDATE writes: each keeps its stable id,
    and an updated row's commit version becomes null (the commit's); none without it."""
    if ctx.hidden is None:
        return []
    row_id, version = ctx.hidden
    return [
        quoted(row_id),
        F.when(updated, F.lit(None).cast("long")).otherwise(quoted(version)).alias(version),
    ]


def _value(name: str, values: Mapping[str, Column], *, unless: Column | None = None) -> Column:
    """Column ``name`` of a rewritten row: its SET value (kept as is where ``unless`` holds)."""
    if name not in values:
        return quoted(name)
    if unless is None:
        return values[name].alias(name)
    return F.when(unless, quoted(name)).otherwise(values[name]).alias(name)


def _split_by_file(batches: Iterator[pa.RecordBatch]) -> dict[int, list[pa.RecordBatch]]:
    """Rows grouped by file id (Spark re-batches rows, so a batch may span two files)."""
    groups: dict[int, list[pa.RecordBatch]] = {}
    for batch in batches:
        ids = batch.column(FILE_COL)
        distinct = pc.unique(ids).to_pylist()
        for fid in distinct:
            part = batch if len(distinct) == 1 else batch.filter(pc.equal(ids, fid))
            groups.setdefault(int(fid), []).append(part)
    return groups


def _rewrite_task(
    ctx: JobContext, mode: str, use_dv: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    names = ctx.arrow_schema.names
    out = TaskOutput(ctx)
    results: list[Result] = []
    pending: list[pa.Table] = []
    try:
        with typed_task_errors():
            for fid, parts in _split_by_file(batches).items():
                chunk = pa.Table.from_batches(parts)
                mask = pc.fill_null(chunk.column(MATCH_COL), False).combine_chunks()
                hits = int(pc.sum(mask).as_py() or 0)
                if hits == 0:
                    continue
                data = chunk.select([*names, *(c for c in ctx.hidden or () if c in chunk.column_names)])
                if use_dv:
                    if mode == "update":
                        pending.append(data.filter(mask))
                    positions = chunk.column(POS_COL).filter(mask).to_pylist()
                    results.append(("file", fid, None, hits, 0, positions))
                else:
                    pending.append(data.filter(pc.invert(mask)) if mode == "delete" else data)
                    results.append(("file", fid, None, hits, chunk.num_rows - hits, None))
            if pending:
                # DELETE keeps rows the table holds: nothing new to check
                rows = ctx.conform(
                    pa.concat_tables(pending, promote_options="default"), mode, check=mode != "delete"
                )
                results += add_results(-1, out.write(rows, data_change=True))
    except BaseException:
        out.discard()
        raise
    if results:
        yield result_batch(results)


# --------------------------------------------------------------------------- change data


def stage_changes(
    spark: SparkSession,
    ctx: JobContext,
    txn: Transaction,
    rows: DataFrame,
    values: Mapping[str, Column] | None,
) -> None:
    """The change data of a DELETE (``values`` None) or UPDATE on a table with the change data
    feed on, written by one Spark job from ``rows`` (the scanned rows with MATCH_COL, before
    any SET) and staged on ``txn``. A DELETE on a DV table needs none: readers take its
    deletes from the DVs (:mod:`eventlog.files.change_data`)."""
    if not txn.change_data_enabled or (values is None and txn.deletion_vectors_enabled):
        return
    names = ctx.arrow_schema.names
    matched = rows.where(F.col(MATCH_COL))
    old = [quoted(n) for n in names]
    if values is None:
        frame = matched.select(*old, F.lit(DELETE).alias(CHANGE_TYPE_COLUMN))
    else:
        pre = matched.select(*old, F.lit(UPDATE_PREIMAGE).alias(CHANGE_TYPE_COLUMN))
        post = matched.select(
            *[_value(n, values) for n in names], F.lit(UPDATE_POSTIMAGE).alias(CHANGE_TYPE_COLUMN)
        )
        frame = pre.unionByName(post)
    stage_change_rows(ctx, txn, frame)


def stage_change_rows(ctx: JobContext, txn: Transaction, frame: DataFrame) -> None:
    """Write change rows (the table's columns and ``_change_type``) as change files in
    Spark tasks, and stage them on ``txn``."""
    out = frame.mapInArrow(functools.partial(_change_task, ctx), RESULT).collect()
    txn.add_change_files(change_files_of(out))


def _change_task(ctx: JobContext, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write change rows as change files: new images are conformed as the UPDATE's written
    rows are (generated columns computed again, constraints checked), old ones as stored."""
    out = TaskOutput(ctx)
    results: list[Result] = []
    try:
        with typed_task_errors():
            table = pa.Table.from_batches(list(batches))
            if table.num_rows:
                kinds = table.column(CHANGE_TYPE_COLUMN)
                new = pc.equal(kinds, UPDATE_POSTIMAGE)
                parts = []
                for mask, check in ((new, True), (pc.invert(new), False)):
                    part = table.filter(mask)
                    if part.num_rows:
                        rows = ctx.conform(part.drop_columns([CHANGE_TYPE_COLUMN]), "update", check=check)
                        parts.append(rows.append_column(CHANGE_TYPE_COLUMN, part.column(CHANGE_TYPE_COLUMN)))
                cdc = out.write_changes(pa.concat_tables(parts, promote_options="default"))
                results += [("cdc", -1, orjson.dumps(c.to_json()).decode(), 0, 0, None) for c in cdc]
    except BaseException:
        out.discard()
        raise
    if results:
        yield result_batch(results)
