"""Spark jobs behind :class:`spark_adapter.table.EventlogTable`: shared machinery, DELETE,
UPDATE and OPTIMIZE.

The driver plans like the plain-Python operations (:mod:`eventlog.ops`): one
eventlog transaction, ``txn.scan(predicate)`` for the read set, then the same actions.
The data work runs in Spark tasks: :func:`read_files` turns the scanned files into a
DataFrame of live rows tagged with their file id and *physical* row position (deletion
vectors applied by :mod:`eventlog.files.scan`); conditions and SET expressions are evaluated by
Spark; tasks write new Parquet files with :func:`eventlog.files.datafiles.write_data_files`
and send ``AddFile`` JSON back to the driver, which stages everything in the transaction.

Files written by tasks of an operation that then fails are deleted (best effort): each
task lists what it wrote in a manifest under ``_eventlog/spark-staging/<job id>/`` and the
driver deletes the listed files when a job or the planning fails (:class:`StagedFiles`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

from eventlog import expr as ex
from eventlog.errors import InvalidInputError, PredicateError, UnknownColumnError
from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE, delete_files, write_data_files
from eventlog.files.enforce import conform
from eventlog.files.scan import file_deletes, read_file_positions, read_live_rows
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import AddFile
from eventlog.log.storage import normalize_uri
from eventlog.ops.alter import TARGET_FILE_SIZE_KEY
from eventlog.ops.common import check_append_only
from eventlog.ops.optimize import begin_optimize, plan_bins, zorder_permutation
from eventlog.ops.rows import remove_whole_files, removes_whole_files
from eventlog.ops.transaction import Transaction
from eventlog.txn.rowlevel import CompactionSource, compaction_tag
from eventlog.txn.transaction import CommitResult

log = logging.getLogger("spark_adapter.dml")

FILE_COL = "__eventlog_file"  # index of the row's file in the operation's scan result
POS_COL = "__eventlog_pos"  # physical row position in that file (what a DV addresses)
MATCH_COL = "__eventlog_match"
STAGING_DIR = "_eventlog/spark-staging"
_BATCH_ROWS = 65_536
_WRITE_BUFFER_BYTES = 128 * 1024 * 1024
# What tasks send back: ("add", group, AddFile JSON), ("file", file id, matched rows, copied
# rows, DV positions) or ("source", bin, index in bin, live rows).
_RESULT = StructType(
    [
        StructField("kind", StringType()),
        StructField("fid", IntegerType()),
        StructField("payload", StringType()),
        StructField("n1", LongType()),
        StructField("n2", LongType()),
        StructField("positions", ArrayType(LongType())),
    ]
)
_RESULT_ARROW = to_arrow_schema(_RESULT, timezone="UTC")
_RECORDS = StructType([StructField("fid", IntegerType()), StructField("payload", StringType())])
Result = tuple[str, int, str | None, int, int, list[int] | None]


# --------------------------------------------------------------------------- context


@dataclass(frozen=True)
class JobContext:
    """What tasks need to read and write the table (picklable, shipped with each task)."""

    uri: str
    schema_string: str
    partition_columns: tuple[str, ...]
    target_file_size: int
    job_id: str

    @staticmethod
    def of(txn: Transaction) -> JobContext:
        meta = txn.metadata
        size = int(meta.configuration.get(TARGET_FILE_SIZE_KEY, DEFAULT_TARGET_FILE_SIZE))
        return JobContext(
            txn.table.uri, meta.schema_string, tuple(meta.partition_columns), size, uuid.uuid4().hex
        )

    @property
    def arrow_schema(self) -> pa.Schema:
        return from_spark_schema_json(self.schema_string)

    @property
    def spark_schema(self) -> StructType:
        return StructType.fromJson(orjson.loads(self.schema_string))

    def staging_dir(self, root: str) -> str:
        return f"{root}/{STAGING_DIR}/{self.job_id}"


def quoted(name: str, qualifier: str | None = None) -> Column:
    """A column by its exact name (dots and backticks are not parsed)."""
    part = "`" + name.replace("`", "``") + "`"
    if qualifier is None:
        return F.col(part)
    return F.col("`" + qualifier.replace("`", "``") + "`." + part)


def to_column(value: str | Column) -> Column:
    return F.expr(value) if isinstance(value, str) else value


def condition_sql(spark: SparkSession, schema: StructType, condition: str | Column | None) -> str | None:
    """SQL text of a condition: the string itself, or a Column's analyzed SQL (None if unknown)."""
    if condition is None or isinstance(condition, str):
        return condition
    try:
        # Resolving against an empty DataFrame of the table's schema yields Catalyst's SQL
        # rendering, e.g. "(x > CAST(5 AS BIGINT))", which eventlog's parser understands.
        plan = spark.createDataFrame([], schema).select(condition.alias("c"))._jdf.queryExecution().analyzed()
        return str(plan.projectList().apply(0).child().sql())
    except Exception:
        try:
            return str(cast(Any, condition)._jc.node().sql())
        except Exception:
            return None


def read_predicate(txn: Transaction, sql: str | None, *, strict: bool) -> tuple[ex.Expr | None, bool]:
    """(the predicate to scan with, whether it is exactly the condition).

    A condition eventlog cannot parse (Spark-only syntax) is evaluated by Spark alone and
    the scan reads the whole table: a wider read set, so conflicts stay detectable.
    ``strict`` (a SQL string from the user): unknown columns still raise.
    """
    if sql is None:
        return None, True
    try:
        return txn.parse_predicate(sql), True
    except UnknownColumnError:
        if strict:
            raise
        return None, False
    except (PredicateError, InvalidInputError):
        return None, False


def describe(spark: SparkSession, text: str | None) -> None:
    """Label the following Spark jobs in the UI (cleared with None)."""
    # pyspark's stub says str, but None is what clears the JVM-side local property.
    cast(Any, spark.sparkContext).setJobDescription(text)


# --------------------------------------------------------------------------- staged files


class StagedFiles:
    """Driver side of the task manifests: deletes what tasks wrote unless it is kept."""

    def __init__(self, ctx: JobContext) -> None:
        self.fs, self.root, _ = normalize_uri(ctx.uri)
        self.dir = ctx.staging_dir(self.root)

    def _listed(self) -> set[str]:
        out: set[str] = set()
        try:
            names = self.fs.ls(self.dir, detail=False)
        except FileNotFoundError:
            return out
        for name in names:
            try:
                out.update(orjson.loads(self.fs.cat_file(name)))
            except (FileNotFoundError, orjson.JSONDecodeError):
                continue  # a manifest being rewritten; its files are listed again or orphaned
        return out

    def finish(self, kept: set[str]) -> None:
        """The operation's adds are staged: delete the rest (duplicate task attempts)."""
        delete_files(self.fs, self.root, sorted(self._listed() - kept))
        self._drop_dir()

    def fail(self) -> None:
        """The operation failed: delete every file its tasks reported."""
        try:
            delete_files(self.fs, self.root, sorted(self._listed()))
        finally:
            self._drop_dir()

    def _drop_dir(self) -> None:
        try:
            with contextlib.suppress(FileNotFoundError):  # no task listed anything: nothing to drop
                self.fs.rm(self.dir, recursive=True)
        except Exception as exc:  # cleanup must never mask the operation's own error
            log.warning("could not remove staging directory %s: %s", self.dir, exc)


class _TaskOutput:
    """Task side: writes data files and keeps this task's manifest up to date."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.fs, self.root, _ = normalize_uri(ctx.uri)
        self.manifest = f"{ctx.staging_dir(self.root)}/{uuid.uuid4().hex}.json"
        self.paths: list[str] = []

    def write(
        self, rows: pa.Table, *, data_change: bool, target_file_size: int | None = None
    ) -> list[AddFile]:
        if rows.num_rows == 0:
            return []
        adds = write_data_files(
            self.fs,
            self.root,
            rows,
            partition_columns=self.ctx.partition_columns,
            data_change=data_change,
            target_file_size=target_file_size or self.ctx.target_file_size,
        )
        self.paths.extend(a.path for a in adds)
        # Recorded right after writing so the driver finds these files even if another
        # task fails the job after this one finished.
        self.fs.makedirs(self.manifest.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(self.manifest, "wb") as f:
            f.write(orjson.dumps(self.paths))
        return adds

    def discard(self) -> None:
        delete_files(self.fs, self.root, self.paths)


def _result_batch(rows: Sequence[Result]) -> pa.RecordBatch:
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(_RESULT_ARROW)
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), f.type) for c, f in zip(cols, _RESULT_ARROW, strict=True)], schema=_RESULT_ARROW
    )


def _add_results(fid: int, adds: Sequence[AddFile]) -> list[Result]:
    return [("add", fid, orjson.dumps(a.to_json()).decode(), 0, 0, None) for a in adds]


def adds_of(rows: Sequence[Any]) -> list[AddFile]:
    return [AddFile.from_json(orjson.loads(r.payload)) for r in rows if r.kind == "add"]


# --------------------------------------------------------------------------- reading


def _parallelize(spark: SparkSession, records: list[tuple[int, str]], *, one_per_task: bool) -> DataFrame:
    """(id, JSON payload) records as a DataFrame, spread over the cluster's cores."""
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    slices = len(records) if one_per_task else min(len(records), 2 * cores)
    rdd = spark.sparkContext.parallelize(records, max(1, slices))
    return spark.createDataFrame(rdd, _RECORDS)


def read_files(spark: SparkSession, ctx: JobContext, files: Sequence[tuple[int, AddFile]]) -> DataFrame:
    """Live rows of ``files`` (id, file) with FILE_COL and POS_COL, read in Spark tasks.

    All rows of one file come from one task, so per-file logic may run in a narrow stage
    after this one without a shuffle.
    """
    schema = ctx.spark_schema
    out = StructType([*schema.fields, StructField(FILE_COL, IntegerType()), StructField(POS_COL, LongType())])
    records = [(fid, orjson.dumps(add.to_json()).decode()) for fid, add in files]
    task = functools.partial(_read_task, ctx, to_arrow_schema(out, timezone="UTC"))
    return _parallelize(spark, records, one_per_task=False).mapInArrow(task, out)


def _read_task(
    ctx: JobContext, out: pa.Schema, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    fs, root, _ = normalize_uri(ctx.uri)
    schema = ctx.arrow_schema
    for batch in batches:
        for fid, text in zip(
            batch.column("fid").to_pylist(), batch.column("payload").to_pylist(), strict=True
        ):
            add = AddFile.from_json(orjson.loads(text))
            rows, positions, _, _ = read_file_positions(fs, root, add, schema, ctx.partition_columns)
            rows = rows.append_column(FILE_COL, pa.array(np.full(rows.num_rows, fid, dtype=np.int32)))
            rows = rows.append_column(POS_COL, pa.array(positions, pa.int64()))
            # mapInArrow needs Spark's exact Arrow types (tz string, child names).
            yield from rows.cast(out).to_batches(max_chunksize=_BATCH_ROWS)


def physical_rows(txn: Transaction, add: AddFile) -> int:
    """Physical row count of a file (stats, else the Parquet footer)."""
    if add.num_records is not None:
        return add.num_records
    fs, root = txn.table.log.fs, txn.table.log.root
    with fs.open(f"{root}/{unquote(add.path)}", "rb") as f:
        return int(pq.ParquetFile(f).metadata.num_rows)


def stage_dv_deletes(
    txn: Transaction, files: Mapping[int, AddFile], positions: Mapping[int, list[int]]
) -> None:
    """Mark the given physical rows deleted, as deletion vectors (one DV file per commit)."""
    fs, root = txn.table.log.fs, txn.table.log.root
    for fid in sorted(positions):
        add = files[fid]
        rows = np.fromiter(sorted(positions[fid]), dtype=np.int64)
        txn.delete_rows(add, rows, file_deletes(fs, root, add), physical_rows(txn, add))
    txn.flush_deletes()


# --------------------------------------------------------------------------- writing


def write_rows(
    spark: SparkSession, ctx: JobContext, rows: DataFrame, *, data_change: bool = True
) -> list[AddFile]:
    """Write a DataFrame of table rows as new data files in Spark tasks."""
    names = ctx.arrow_schema.names
    task = functools.partial(_write_task, ctx, data_change)
    return adds_of(rows.select(*[quoted(n) for n in names]).mapInArrow(task, _RESULT).collect())


def _write_task(
    ctx: JobContext, data_change: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    out = _TaskOutput(ctx)
    schema = ctx.arrow_schema
    results: list[Result] = []
    buffer: list[pa.RecordBatch] = []
    size = 0
    try:
        for batch in batches:
            buffer.append(batch)
            size += batch.nbytes
            if size >= _WRITE_BUFFER_BYTES:
                rows = conform(pa.Table.from_batches(buffer), schema, context="write")
                results += _add_results(-1, out.write(rows, data_change=data_change))
                buffer, size = [], 0
        if buffer:
            rows = conform(pa.Table.from_batches(buffer), schema, context="write")
            results += _add_results(-1, out.write(rows, data_change=data_change))
    except BaseException:
        out.discard()
        raise
    if results:
        yield _result_batch(results)


# --------------------------------------------------------------------------- pending commits


class PendingCommit:
    """A planned operation: files written, actions staged; :meth:`commit` publishes it."""

    def __init__(self, txn: Transaction) -> None:
        self.txn = txn

    @property
    def read_version(self) -> int:
        return self.txn.read_version

    def commit(self) -> CommitResult:
        """Validate against concurrent commits and publish (conflicts raise Delta's exceptions)."""
        return self.txn.commit()

    def abort(self) -> None:
        """Give up: delete the files this operation wrote."""
        self.txn.abort()


def run_planned(
    spark: SparkSession, txn: Transaction, name: str, plan: Callable[[JobContext, StagedFiles], None]
) -> PendingCommit:
    """Run ``plan`` (Spark jobs + staging) for ``txn``; on any failure nothing stays behind."""
    ctx = JobContext.of(txn)
    staged = StagedFiles(ctx)
    describe(spark, f"eventlog {name} {txn.table.uri}")
    try:
        plan(ctx, staged)
    except BaseException:
        staged.fail()
        txn.abort()
        raise
    finally:
        describe(spark, None)
    return PendingCommit(txn)


def stage_adds(txn: Transaction, staged: StagedFiles, adds: Sequence[AddFile]) -> None:
    """Hand the tasks' files to the transaction (which deletes them if the commit fails)."""
    txn.add_files(adds)
    staged.finish({a.path for a in adds})


# --------------------------------------------------------------------------- DELETE / UPDATE


def plan_delete(spark: SparkSession, txn: Transaction, condition: str | Column | None) -> PendingCommit:
    """DELETE, planned as eventlog.ops.dml.delete (same read predicate and actions)."""
    sql = condition_sql(spark, StructType.fromJson(orjson.loads(txn.metadata.schema_string)), condition)
    txn.set_operation("DELETE", {"predicate": [sql] if sql else []})
    check_append_only(txn, "DELETE")
    pred, exact = read_predicate(txn, sql, strict=isinstance(condition, str))

    def plan(ctx: JobContext, staged: StagedFiles) -> None:
        files = txn.scan(pred)
        if condition is None or (exact and pred is not None and removes_whole_files(txn, pred)):
            removed, live, _ = remove_whole_files(txn, files)
            txn.add_metrics(numRemovedFiles=removed, numDeletedRows=live, numCopiedRows=0)
            return
        touched, adds, counts = _rewrite(spark, ctx, txn, files, to_column(condition), None)
        txn.add_metrics(numRemovedFiles=len(touched), numDeletedRows=counts[0], numCopiedRows=counts[1])
        stage_adds(txn, staged, adds)

    return run_planned(spark, txn, "DELETE", plan)


def plan_update(
    spark: SparkSession,
    txn: Transaction,
    condition: str | Column | None,
    assignments: Mapping[str, str | Column],
) -> PendingCommit:
    """UPDATE, planned as eventlog.ops.dml.update; SET values are evaluated by Spark."""
    schema = StructType.fromJson(orjson.loads(txn.metadata.schema_string))
    sql = condition_sql(spark, schema, condition)
    txn.set_operation("UPDATE", {"predicate": [sql] if sql else []})
    check_append_only(txn, "UPDATE")
    if not assignments:
        raise InvalidInputError("UPDATE needs at least one SET assignment")
    by_lower = {f.name.lower(): f for f in schema.fields}
    values: dict[str, Column] = {}
    for column, value in assignments.items():
        field = by_lower.get(column.lower())
        if field is None:
            raise UnknownColumnError(column, [f.name for f in schema.fields], "SET")
        values[field.name] = to_column(value).cast(field.dataType)
    pred, _ = read_predicate(txn, sql, strict=isinstance(condition, str))

    def plan(ctx: JobContext, staged: StagedFiles) -> None:
        files = txn.scan(pred)
        match = to_column(condition) if condition is not None else None
        touched, adds, counts = _rewrite(spark, ctx, txn, files, match, values)
        txn.add_metrics(numRemovedFiles=len(touched), numUpdatedRows=counts[0], numCopiedRows=counts[1])
        stage_adds(txn, staged, adds)

    return run_planned(spark, txn, "UPDATE", plan)


def _rewrite(
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
    use_dv = txn.deletion_vectors_enabled
    names = ctx.arrow_schema.names
    rows = read_files(spark, ctx, list(enumerate(files)))
    hit = F.coalesce(match, F.lit(False)) if match is not None else F.lit(True)
    rows = rows.withColumn(MATCH_COL, hit)
    if values is not None:
        m = F.col(MATCH_COL)
        rows = rows.select(
            *[
                F.when(m, values[n]).otherwise(quoted(n)).alias(n) if n in values else quoted(n)
                for n in names
            ],
            FILE_COL,
            POS_COL,
            MATCH_COL,
        )
    mode = "delete" if values is None else "update"
    # Only narrow steps since read_files: each task sees every row of its files.
    task = functools.partial(_rewrite_task, ctx, mode, use_dv)
    results = rows.mapInArrow(task, _RESULT).collect()
    by_id = dict(enumerate(files))
    per_file = sorted((r for r in results if r.kind == "file"), key=lambda r: r.fid)
    touched = [by_id[r.fid] for r in per_file]
    if use_dv:
        # Old images become DV-deleted rows (eventlog.ops.dml does the same).
        stage_dv_deletes(txn, by_id, {r.fid: list(r.positions) for r in per_file})
    else:
        txn.remove_files(touched)
    counts = (sum(r.n1 for r in per_file), sum(r.n2 for r in per_file))
    return touched, adds_of(results), counts


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
    out = _TaskOutput(ctx)
    results: list[Result] = []
    pending: list[pa.Table] = []
    try:
        for fid, parts in _split_by_file(batches).items():
            chunk = pa.Table.from_batches(parts)
            mask = pc.fill_null(chunk.column(MATCH_COL), False).combine_chunks()
            hits = int(pc.sum(mask).as_py() or 0)
            if hits == 0:
                continue
            data = chunk.select(names)
            if use_dv:
                if mode == "update":
                    pending.append(data.filter(mask))
                positions = chunk.column(POS_COL).filter(mask).to_pylist()
                results.append(("file", fid, None, hits, 0, positions))
            else:
                pending.append(data.filter(pc.invert(mask)) if mode == "delete" else data)
                results.append(("file", fid, None, hits, chunk.num_rows - hits, None))
        if pending:
            rows = conform(pa.concat_tables(pending), ctx.arrow_schema, context=mode)
            results += _add_results(-1, out.write(rows, data_change=True))
    except BaseException:
        out.discard()
        raise
    if results:
        yield _result_batch(results)


# --------------------------------------------------------------------------- OPTIMIZE


def plan_optimize(
    spark: SparkSession, txn: Transaction, partition_filter: str | None, zorder_by: Sequence[str]
) -> PendingCommit:
    """Bin-packing compaction (optionally Z-ordered), planned as eventlog.ops.optimize.optimize."""
    zorder, pred = begin_optimize(txn, zorder_by, partition_filter)
    parts = txn.metadata.partition_columns

    def plan(ctx: JobContext, staged: StagedFiles) -> None:
        files = txn.scan(pred)
        groups: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
        for f in files:
            groups.setdefault(tuple(sorted(f.partition_values.items())), []).append(f)
        bins = [
            b for g in groups.values() for b in plan_bins(g, ctx.target_file_size, rewrite_all=bool(zorder))
        ]
        # Same rule as eventlog: plain compactions on row-level tables record where rows went.
        mapped = not zorder and txn.deletion_vectors_enabled and not parts
        for bin_ in bins:
            txn.remove_files(bin_, data_change=False)
        results: list[Any] = []
        if bins:
            records = [(i, orjson.dumps([f.to_json() for f in b]).decode()) for i, b in enumerate(bins)]
            task = functools.partial(_compact_task, ctx, zorder, mapped)
            results = _parallelize(spark, records, one_per_task=True).mapInArrow(task, _RESULT).collect()
        adds = adds_of(results)
        if mapped:
            adds = _tag_compactions(txn, bins, results)
        txn.add_metrics(numRemovedFiles=sum(len(b) for b in bins), numAddedFiles=len(adds))
        stage_adds(txn, staged, adds)

    return run_planned(spark, txn, "OPTIMIZE", plan)


def _tag_compactions(
    txn: Transaction, bins: Sequence[Sequence[AddFile]], results: Sequence[Any]
) -> list[AddFile]:
    """Compacted files with tags saying where each source's live rows went."""
    fs, root = txn.table.log.fs, txn.table.log.root
    live = {(r.fid, r.n1): r.n2 for r in results if r.kind == "source"}
    out: list[AddFile] = []
    for r in results:
        if r.kind != "add":
            continue
        add = AddFile.from_json(orjson.loads(r.payload))
        sources, offset = [], 0
        for i, f in enumerate(bins[r.fid]):
            sources.append(
                CompactionSource(
                    f.path, f.key[1], file_deletes(fs, root, f), physical_rows(txn, f), add.path, offset
                )
            )
            offset += live[(r.fid, i)]
        out.append(dataclasses.replace(add, tags={**(add.tags or {}), **compaction_tag(sources)}))
        txn.record_compaction(sources)
    return out


def _compact_task(
    ctx: JobContext, zorder: list[str], mapped: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    fs, root, _ = normalize_uri(ctx.uri)
    schema = ctx.arrow_schema
    out = _TaskOutput(ctx)
    try:
        for batch in batches:
            for bin_id, text in zip(
                batch.column("fid").to_pylist(), batch.column("payload").to_pylist(), strict=True
            ):
                sources = [AddFile.from_json(d) for d in orjson.loads(text)]
                results: list[Result] = []
                if mapped:
                    parts = []
                    for i, f in enumerate(sources):
                        rows, _, _, _ = read_file_positions(fs, root, f, schema, ctx.partition_columns)
                        parts.append(rows)
                        results.append(("source", bin_id, None, i, rows.num_rows, None))
                    # Exactly one output file per bin: its tags map every source's rows.
                    adds = out.write(pa.concat_tables(parts), data_change=False, target_file_size=2**62)
                else:
                    rows = read_live_rows(fs, root, sources, schema, ctx.partition_columns)
                    if zorder:
                        rows = rows.take(zorder_permutation(rows, zorder))
                    adds = out.write(rows, data_change=False)
                yield _result_batch(results + _add_results(bin_id, adds))
    except BaseException:
        out.discard()
        raise
