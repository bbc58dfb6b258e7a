"""OPTIMIZE on a clustered table (liquid clustering) in Spark jobs, planned as
:func:`eventlog.ops.optimize_clustered.optimize_clustered` with its helpers: the operation
(``begin_clustering``), the files rewritten (``clustering_candidates``) and their tags
(``clustered_adds``: ``clusteringProvider: "liquid"``, ``ZCUBE_ID``, ``ZCUBE_ZORDER_BY``).

The candidates are rewritten in Z-order over the clustering columns, in output groups of
about the table's target file size, one Spark task per group:

* candidates that fit one group: one task reads them all and orders the rows with the
  engine's :func:`~eventlog.ops.optimize.zorder_permutation` (the engine's result);
* more: a first job samples the clustering columns of every candidate; the driver turns the
  sample into per-column rank boundaries (quantiles) and cuts the curve into groups of equal
  sampled rows; a second job reads each candidate once, gives each row its curve value
  (:func:`curve_values`, the engine's bit interleaving over sampled ranks) and sends it to its
  group (a shuffle); each group's task sorts its rows along the curve and writes them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from eventlog import expr as ex
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files
from eventlog.ops.optimize import scan_files
from eventlog.ops.optimize_clustered import begin_clustering, clustered_adds, clustering_candidates
from eventlog.ops.transaction import Transaction
from spark_adapter.errors import typed_task_errors
from spark_adapter.ops.jobs import (
    RESULT,
    JobContext,
    PendingCommit,
    StagedFiles,
    TaskOutput,
    adds_of,
    parallelize,
    run_planned,
    stage_adds,
)
from spark_adapter.ops.optimize import compact_task, live_rows
from spark_adapter.session import default_parallelism, is_connect, spread

__all__ = ["curve_values", "plan_optimize_clustered", "rank_boundaries"]

SAMPLE_ROWS = 200_000  # clustering-column values sampled over all candidates
MAX_BITS = 16  # bits of rank per column: at most 2**16 - 1 boundaries per column
_CURVE = "__eventlog_curve"


def plan_optimize_clustered(
    spark: SparkSession, txn: Transaction, columns: Sequence[str], partition_filter: str | None
) -> PendingCommit:
    """Cluster the candidate files of a table clustered by ``columns`` (see the module)."""
    pred = begin_clustering(txn, columns, partition_filter)

    def plan(ctx: JobContext, staged: StagedFiles) -> None:
        txn.scan(pred)  # the read set, as the engine records it: the filter and every file it selects
        candidates = _candidates(txn, pred, ctx.target_file_size)
        txn.remove_files(candidates, data_change=False)
        groups = math.ceil(sum(f.size for f in candidates) / ctx.target_file_size)
        if not candidates:
            written: list[AddFile] = []
        elif groups <= 1:
            written = _cluster_one(spark, ctx, candidates, columns)
        else:
            written = _cluster_shuffled(spark, ctx, candidates, columns, groups)
        adds = list(clustered_adds(written, columns))
        txn.add_metrics(numRemovedFiles=len(candidates), numAddedFiles=len(adds))
        stage_adds(txn, staged, adds)

    return run_planned(spark, txn, "OPTIMIZE", plan)


def _candidates(txn: Transaction, pred: ex.Expr | None, target: int) -> list[AddFile]:
    """The files the engine's clustering OPTIMIZE would rewrite (:func:`clustering_candidates`)."""
    scanned = scan_files(txn, pred)
    if scanned is None:
        return []
    files = scanned[1]
    rows = clustering_candidates(files, target)
    return add_files(files.take(pa.array(rows))) if len(rows) else []


def _cluster_one(
    spark: SparkSession, ctx: JobContext, files: Sequence[AddFile], columns: Sequence[str]
) -> list[AddFile]:
    """One group: one task Z-orders all the rows, as the engine does."""
    records = [(0, orjson.dumps([f.to_json() for f in files]).decode())]
    task = functools.partial(compact_task, ctx, list(columns), False)
    return adds_of(parallelize(spark, records, one_per_task=True).mapInArrow(task, RESULT).collect())


def _cluster_shuffled(
    spark: SparkSession, ctx: JobContext, files: Sequence[AddFile], columns: Sequence[str], groups: int
) -> list[AddFile]:
    """``groups`` output groups along the curve: sample, route (shuffle), sort and write.

    On a classic session the jobs are RDD jobs (one task per group, by an identity
    partitioner); on Spark Connect, which has no RDDs, DataFrame jobs with the same tasks:
    ``mapInArrow`` over the spread file records, and a repartition on the group number, whose
    tasks write each group they receive separately (a hash may send two groups to one task)."""
    connect = is_connect(spark)
    records = [(i, orjson.dumps(f.to_json()).decode()) for i, f in enumerate(files)]
    slices = max(1, min(len(records), 2 * default_parallelism(spark)))
    per_file = max(16, math.ceil(SAMPLE_ROWS / len(files)))
    sample_task = functools.partial(_sample_task, ctx, list(columns), per_file)
    if connect:
        frame = spread(spark, records, _RECORDS, slices).mapInArrow(_arrow_task(sample_task, _BLOB), _BLOB)
        blobs: list[bytes] = [bytes(r.data) for r in frame.collect()]
    else:
        blobs = spark.sparkContext.parallelize(records, slices).mapPartitions(sample_task).collect()
    sample = pa.concat_tables([_from_ipc(b) for b in blobs])
    bits = max(1, min(MAX_BITS, 63 // len(columns)))
    bounds = {c: rank_boundaries(sample.column(c), 2**bits - 1) for c in columns}
    z = np.sort(curve_values(sample, columns, bounds, bits))
    # Groups of equal sampled rows: cut the curve at the sample's quantiles.
    at = [len(z) * i // groups for i in range(1, groups)] if len(z) else []
    cuts = np.unique(z[at]) if at else np.zeros(0, np.uint64)
    route = functools.partial(_route_task, ctx, list(columns), bounds, bits, cuts)
    write = functools.partial(_write_group_task, ctx)
    if connect:
        routed = spread(spark, records, _RECORDS, slices).mapInArrow(_arrow_task(route, _ROUTED), _ROUTED)
        shuffled = routed.repartition(len(cuts) + 1, "grp")
        per_group = functools.partial(_write_groups_task, write)
        written = [
            str(r.payload) for r in shuffled.mapInArrow(_arrow_task(per_group, _WRITTEN), _WRITTEN).collect()
        ]
    else:
        sc = spark.sparkContext
        shuffled_rdd = (
            sc.parallelize(records, slices).mapPartitions(route).partitionBy(len(cuts) + 1, _group_of)
        )
        written = shuffled_rdd.mapPartitions(write).collect()
    return [AddFile.from_json(orjson.loads(text)) for text in written]


def rank_boundaries(values: pa.ChunkedArray | pa.Array, levels: int) -> pa.Array:
    """At most ``levels`` distinct values of ``values`` (nulls left out), evenly spaced in
    sorted order: a value's rank is the number of boundaries at or below it."""
    live = values.drop_null()
    if isinstance(live, pa.ChunkedArray):
        live = live.combine_chunks()
    if len(live) == 0:
        return live
    ordered = live.take(pc.sort_indices(live))
    picks = np.unique(np.linspace(0, len(ordered) - 1, min(levels, len(ordered))).round().astype(np.int64))
    return pc.unique(ordered.take(pa.array(picks)))  # first occurrences: stays sorted


def _ranks(values: pa.ChunkedArray | pa.Array, bounds: pa.Array) -> np.ndarray:
    """Each value's number of ``bounds`` at or below it (nulls: ``len(bounds)``), by one
    sort of both (any sortable Arrow type)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    m, n = len(bounds), len(values)
    both = pa.table(
        {
            "v": pa.concat_arrays([bounds.cast(values.type), values]),
            "value": pa.array(np.r_[np.zeros(m, bool), np.ones(n, bool)]),
        }
    )
    order = pc.sort_indices(both, sort_keys=[("v", "ascending"), ("value", "ascending")]).to_numpy()
    is_value = order >= m
    below = np.cumsum(~is_value)  # bounds sorted at or before each position
    out = np.empty(n, dtype=np.uint64)
    out[order[is_value] - m] = below[is_value]
    return out


def curve_values(
    rows: pa.Table, columns: Sequence[str], bounds: Mapping[str, pa.Array], bits: int
) -> np.ndarray:
    """Each row's Z-order value: the bits of its rank in every column (:func:`_ranks`
    against ``bounds``) interleaved, as :func:`~eventlog.ops.optimize.zorder_permutation`
    interleaves dense ranks."""
    k = len(columns)
    z = np.zeros(rows.num_rows, dtype=np.uint64)
    for i, col in enumerate(columns):
        r = _ranks(rows.column(col), bounds[col])
        for b in range(bits):
            z |= ((r >> np.uint64(b)) & np.uint64(1)) << np.uint64(b * k + i)
    return z


def _group_of(group: int) -> int:
    return group


_RECORDS = StructType([StructField("fid", IntegerType()), StructField("payload", StringType())])
_BLOB = StructType([StructField("data", BinaryType())])
_ROUTED = StructType([StructField("grp", IntegerType()), StructField("data", BinaryType())])
_WRITTEN = StructType([StructField("payload", StringType())])


def _arrow_task(
    task: Callable[[Iterator[Any]], Iterator[Any]], out: StructType
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An RDD-style task (rows as tuples in, values or tuples out) as a ``mapInArrow`` task
    with the output schema ``out`` (Spark Connect)."""
    schema = to_arrow_schema(out, timezone="UTC")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def rows() -> Iterator[tuple[Any, ...]]:
            for batch in batches:
                yield from zip(*(c.to_pylist() for c in batch.columns), strict=True)

        single = len(schema) == 1
        for item in task(rows()):
            values = (item,) if single else item
            yield pa.RecordBatch.from_arrays(
                [pa.array([v], f.type) for v, f in zip(values, schema, strict=True)], schema=schema
            )

    return run


def _write_groups_task(
    write: Callable[[Iterator[tuple[int, bytes]]], Iterator[str]], parts: Iterator[tuple[int, bytes]]
) -> Iterator[str]:
    """:func:`_write_group_task` for each group of a task's input separately (on Connect, a
    hash repartition may give one task several groups)."""
    by_group: dict[int, list[tuple[int, bytes]]] = {}
    for group, data in parts:
        by_group.setdefault(group, []).append((group, data))
    for group in sorted(by_group):
        yield from write(iter(by_group[group]))


def _to_ipc(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return bytes(sink.getvalue())


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _files(records: Iterator[tuple[int, str]]) -> Iterator[AddFile]:
    for _, text in records:
        yield AddFile.from_json(orjson.loads(text))


def _sample_task(
    ctx: JobContext, columns: list[str], per_file: int, records: Iterator[tuple[int, str]]
) -> Iterator[bytes]:
    """Up to ``per_file`` rows of each file's clustering columns (a seeded random sample)."""
    fs, root = ctx.location.files()
    rng = np.random.default_rng(0)
    with typed_task_errors():
        for add in _files(records):
            rows = live_rows(ctx, fs, root, [add], columns)
            if rows.num_rows > per_file:
                rows = rows.take(pa.array(np.sort(rng.choice(rows.num_rows, per_file, replace=False))))
            yield _to_ipc(rows)


def _route_task(
    ctx: JobContext,
    columns: list[str],
    bounds: Mapping[str, pa.Array],
    bits: int,
    cuts: np.ndarray,
    records: Iterator[tuple[int, str]],
) -> Iterator[tuple[int, bytes]]:
    """Each file's live rows with their curve value, split by output group."""
    fs, root = ctx.location.files()
    with typed_task_errors():
        for add in _files(records):
            rows = live_rows(ctx, fs, root, [add])  # row tracking: with the stable ids, which the write keeps
            z = curve_values(rows, columns, bounds, bits)
            group = np.searchsorted(cuts, z, side="right")
            rows = rows.append_column(_CURVE, pa.array(z, pa.uint64()))
            for g in np.unique(group).tolist():
                yield int(g), _to_ipc(rows.filter(pa.array(group == g)))


def _write_group_task(ctx: JobContext, parts: Iterator[tuple[int, bytes]]) -> Iterator[str]:
    """One output group: its rows in curve order, written as files of the target size."""
    tables = [_from_ipc(data) for _, data in parts]
    if not tables:
        return
    rows = pa.concat_tables(tables)
    rows = rows.take(pc.sort_indices(rows.column(_CURVE))).drop_columns([_CURVE])
    out = TaskOutput(ctx)
    try:
        with typed_task_errors():
            adds = out.write(rows, data_change=False)
    except BaseException:
        out.discard()
        raise
    for add in adds:
        yield orjson.dumps(add.to_json()).decode()
