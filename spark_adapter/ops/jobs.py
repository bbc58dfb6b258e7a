"""Shared machinery of the Spark jobs behind :class:`spark_adapter.table.EventlogTable`.

The driver plans like the plain-Python operations (:mod:`eventlog.ops`): one eventlog
transaction, ``txn.scan(predicate)`` for the read set, then the same actions. The data work
runs in Spark tasks: :func:`read_files` turns the scanned files into a DataFrame of live
rows tagged with their file id and *physical* row position (deletion vectors applied by
:mod:`eventlog.files.scan`); conditions and SET expressions are evaluated by Spark; tasks
write new Parquet files with :func:`eventlog.files.datafiles.write_data_files` and send
``AddFile`` JSON back to the driver, which stages everything in the transaction
(:func:`run_planned`, :func:`stage_adds`, :class:`PendingCommit`).

Files written by tasks of an operation that then fails are deleted (best effort): each
task lists what it wrote in a manifest under ``_eventlog/spark-staging/<job id>/`` and the
driver deletes the listed files when a job or the planning fails (:class:`StagedFiles`).

Durable mode: the context's location is the table handle's (:meth:`TableLocation.from_store
<eventlog.log.location.TableLocation.from_store>`), durable when the handle is, so each task
fsyncs the data and change files it writes, and their directories, before it reports them;
the driver's deletion vectors and commit go through the durable handle itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

from eventlog import expr as ex
from eventlog.errors import (
    EventlogError,
    InvalidInputError,
    PredicateError,
    UnknownColumnError,
)
from eventlog.files import row_tracking
from eventlog.files.change_data import CHANGE_TYPE_COLUMN, ChangeRecorder
from eventlog.files.constraints import WriteRules
from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE, delete_files, write_data_files
from eventlog.files.enforce import conform
from eventlog.files.reader import physical_row_count
from eventlog.files.scan import FileScan, file_deletes, read_file_positions
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import AddCDCFile, AddFile
from eventlog.log.location import TableLocation
from eventlog.ops.alter import TARGET_FILE_SIZE_KEY
from eventlog.ops.transaction import Transaction
from eventlog.table.identity import TaskIdentity, ranges_from_json, ranges_to_json
from eventlog.txn.identity import IdentityRange
from eventlog.txn.transaction import CommitResult
from spark_adapter.errors import recover_error, typed_task_errors
from spark_adapter.native import tagged_rows
from spark_adapter.session import connect_column_sql, default_parallelism, is_connect, job_description, spread

log = logging.getLogger(__name__)

FILE_COL = "__eventlog_file"  # index of the row's file in the operation's scan result
CHANGE_COL = "__eventlog_change"  # a written row's change type for the change data (or null)
POS_COL = "__eventlog_pos"  # physical row position in that file (what a DV addresses)
STAGING_DIR = "_eventlog/spark-staging"
_BATCH_ROWS = 65_536
_WRITE_BUFFER_BYTES = 128 * 1024 * 1024
# What tasks send back: ("add", group, AddFile JSON), ("file", file id, matched rows, copied
# rows, DV positions), ("source", bin, index in bin, live rows) or ("identity", -1, JSON of
# the identity ranges the task reserved).
RESULT = StructType(
    [
        StructField("kind", StringType()),
        StructField("fid", IntegerType()),
        StructField("payload", StringType()),
        StructField("n1", LongType()),
        StructField("n2", LongType()),
        StructField("positions", ArrayType(LongType())),
    ]
)
RESULT_ARROW = to_arrow_schema(RESULT, timezone="UTC")
_RECORDS = StructType([StructField("fid", IntegerType()), StructField("payload", StringType())])
Result = tuple[str, int, str | None, int, int, list[int] | None]


# --------------------------------------------------------------------------- context


@dataclass(frozen=True)
class JobContext:
    """What tasks need to read and write the table (picklable, shipped with each task; the
    location carries the table's storage options)."""

    location: TableLocation
    schema_string: str
    partition_columns: tuple[str, ...]
    target_file_size: int
    job_id: str
    rules: WriteRules = field(default_factory=WriteRules)  # CHECK constraints, generated columns
    regenerate: tuple[str, ...] = ()  # generated columns recomputed from the new values
    # Row tracking's hidden columns (eventlog.files.row_tracking) when the table tracks
    # rows: rows read for a rewrite carry their stable ids there, and writes keep them.
    hidden: tuple[str, str] | None = None

    @staticmethod
    def of(txn: Transaction, regenerate: Sequence[str] = ()) -> JobContext:
        meta = txn.metadata
        size = int(meta.configuration.get(TARGET_FILE_SIZE_KEY, DEFAULT_TARGET_FILE_SIZE))
        return JobContext(
            TableLocation.from_store(txn.table.log),
            meta.schema_string,
            tuple(meta.partition_columns),
            size,
            uuid.uuid4().hex,
            WriteRules.of(txn.schema, meta.configuration),
            tuple(regenerate),
            txn.row_id_columns,
        )

    def conform(self, rows: pa.Table, context: str, *, check: bool = True) -> pa.Table:
        """Rows as the table stores them: schema, NOT NULL, generated columns, constraints
        (``check=False``: the schema only, for rows the table already holds). Row tracking's
        hidden columns pass through."""
        rows, kept = row_tracking.split(rows, self.hidden or ())
        if not check:
            return row_tracking.rejoin(conform(rows, self.arrow_schema, context=context), kept)
        stale = [c for c in self.regenerate if c in rows.column_names]
        out = self.rules.conform(rows.drop_columns(stale), self.arrow_schema, context=context)
        return row_tracking.rejoin(out, kept)

    @property
    def hidden_fields(self) -> list[StructField]:
        """Row tracking's hidden columns as Spark fields (none without row tracking)."""
        return [StructField(n, LongType()) for n in self.hidden or ()]

    @property
    def uri(self) -> str:
        return self.location.uri

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
    if is_connect(spark):  # no analyzed plan on this side: SQL rendered from the Connect expression
        return connect_column_sql(condition)
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


# --------------------------------------------------------------------------- staged files


class StagedFiles:
    """Driver side of the task manifests: deletes what tasks wrote unless it is kept."""

    def __init__(self, ctx: JobContext) -> None:
        self.fs, self.root = ctx.location.files()
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


class TaskOutput:
    """Task side: writes data files and keeps this task's manifest up to date."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.fs, self.root = ctx.location.files()  # durable mode: data files fsynced here
        # The manifest only serves the cleanup of a failed job: never fsynced.
        self._manifest_fs = replace(ctx.location, durable=False).files()[0]
        self.manifest = f"{ctx.staging_dir(self.root)}/{uuid.uuid4().hex}.json"
        self.paths: list[str] = []

    def write(
        self, rows: pa.Table, *, data_change: bool, target_file_size: int | None = None
    ) -> list[AddFile]:
        if rows.num_rows == 0:
            return []
        rows, hidden = row_tracking.file_layout(rows, self.ctx.arrow_schema, self.ctx.hidden or ())
        adds = write_data_files(
            self.fs,
            self.root,
            rows,
            partition_columns=self.ctx.partition_columns,
            data_change=data_change,
            target_file_size=target_file_size or self.ctx.target_file_size,
            hidden=hidden,
        )
        self._record([a.path for a in adds])
        return adds

    def write_changes(self, rows: pa.Table) -> list[AddCDCFile]:
        """Change data rows (the table's columns and ``_change_type``) as change files."""
        if rows.num_rows == 0:
            return []
        schema = self.ctx.arrow_schema
        cdc = ChangeRecorder.write_rows(
            self.fs, self.root, schema, self.ctx.partition_columns, rows, self.ctx.target_file_size
        )
        self._record([c.path for c in cdc])
        return cdc

    def _record(self, paths: Sequence[str]) -> None:
        """Recorded right after writing so the driver finds these files even if another
        task fails the job after this one finished."""
        self.paths.extend(paths)
        self._manifest_fs.makedirs(self.manifest.rsplit("/", 1)[0], exist_ok=True)
        with self._manifest_fs.open(self.manifest, "wb") as f:
            f.write(orjson.dumps(self.paths))

    def discard(self) -> None:
        delete_files(self.fs, self.root, self.paths)


def result_batch(rows: Sequence[Result]) -> pa.RecordBatch:
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(RESULT_ARROW)
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), f.type) for c, f in zip(cols, RESULT_ARROW, strict=True)], schema=RESULT_ARROW
    )


def add_results(fid: int, adds: Sequence[AddFile]) -> list[Result]:
    return [("add", fid, orjson.dumps(a.to_json()).decode(), 0, 0, None) for a in adds]


def adds_of(rows: Sequence[Any]) -> list[AddFile]:
    return [AddFile.from_json(orjson.loads(r.payload)) for r in rows if r.kind == "add"]


# --------------------------------------------------------------------------- reading


def parallelize(spark: SparkSession, records: list[tuple[int, str]], *, one_per_task: bool) -> DataFrame:
    """(id, JSON payload) records as a DataFrame, spread over the cluster's cores
    (:func:`spark_adapter.session.spread`: one record per task with ``one_per_task``, on
    classic and Connect sessions alike)."""
    if one_per_task:
        return spread(spark, records, _RECORDS, len(records))
    return spread(spark, records, _RECORDS, min(len(records), 2 * default_parallelism(spark)))


def read_files(spark: SparkSession, ctx: JobContext, files: Sequence[tuple[int, AddFile]]) -> DataFrame:
    """Live rows of ``files`` (id, file) with FILE_COL and POS_COL, read in Spark tasks.

    All rows of one file come from one task, so per-file logic may run in a narrow stage
    after this one without a shuffle.
    """
    schema = ctx.spark_schema
    out = StructType(
        [
            *schema.fields,
            *ctx.hidden_fields,
            StructField(FILE_COL, IntegerType()),
            StructField(POS_COL, LongType()),
        ]
    )
    records = [(fid, orjson.dumps(add.to_json()).decode()) for fid, add in files]
    task = functools.partial(_read_task, ctx, to_arrow_schema(out, timezone="UTC"))
    return parallelize(spark, records, one_per_task=False).mapInArrow(task, out)


def scan_files(
    spark: SparkSession, ctx: JobContext, txn: Transaction, files: Sequence[tuple[int, AddFile]]
) -> DataFrame:
    """The rows :func:`read_files` gives, read by Spark's own Parquet reader when it can
    open the table (:func:`spark_adapter.native.tagged_rows`). Rows of one file may be
    spread over several tasks here."""
    if ctx.hidden is not None:  # row tracking: the Python read gives each row's stable id
        return read_files(spark, ctx, files)
    df = tagged_rows(spark, ctx.location, txn.snapshot, ctx.schema_string, files, FILE_COL, POS_COL)
    return df if df is not None else read_files(spark, ctx, files)


def _read_task(
    ctx: JobContext, out: pa.Schema, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    fs, root = ctx.location.files()
    schema = ctx.arrow_schema
    for batch in batches:
        for fid, text in zip(
            batch.column("fid").to_pylist(), batch.column("payload").to_pylist(), strict=True
        ):
            add = AddFile.from_json(orjson.loads(text))
            rows, positions, _, _ = read_file_positions(fs, root, add, schema, ctx.partition_columns)
            if ctx.hidden is not None:  # row tracking: each row's stable id rides along
                rows = FileScan(fs, root, add, schema, ctx.partition_columns).tracked(
                    rows, positions, ctx.hidden
                )
            rows = rows.append_column(FILE_COL, pa.array(np.full(rows.num_rows, fid, dtype=np.int32)))
            rows = rows.append_column(POS_COL, pa.array(positions, pa.int64()))
            # mapInArrow needs Spark's exact Arrow types (tz string, child names).
            yield from rows.cast(out).to_batches(max_chunksize=_BATCH_ROWS)


def physical_rows(txn: Transaction, add: AddFile) -> int:
    """Physical row count of a file (stats, else the Parquet footer)."""
    return physical_row_count(txn.table.log.fs, txn.table.log.root, add)


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
    return write_rows_generating(spark, ctx, rows, None, data_change=data_change)[0]


@dataclass(frozen=True)
class IdentityFlags:
    """Identity values the write tasks generate: ``flags`` maps an identity column to the
    boolean column of ``rows`` that says which rows get a value (the flag columns are not
    written); ``slots`` names the table's slot store for the tasks (None: the default)."""

    slots: str | None
    flags: Mapping[str, str]


def write_rows_generating(
    spark: SparkSession,
    ctx: JobContext,
    rows: DataFrame,
    identity: IdentityFlags | None,
    *,
    data_change: bool = True,
) -> tuple[list[AddFile], list[IdentityRange], list[AddCDCFile]]:
    """:func:`write_rows`, the tasks also reserving identity values for the flagged rows
    (:meth:`eventlog.table.identity.TaskIdentity.fill_flagged`: one range per task and
    column); the ranges, for the driver's ``txn.record_identity``. Rows whose CHANGE_COL
    (when ``rows`` has it) is not null are also written as change data, as written: the
    change files, for the driver's ``txn.add_change_files``."""
    names = ctx.arrow_schema.names
    extra = list(identity.flags.values()) if identity is not None else []
    if CHANGE_COL in rows.columns:
        extra.append(CHANGE_COL)
    extra += [c for c in ctx.hidden or () if c in rows.columns]  # rows a rewrite copies keep their ids
    task = functools.partial(_write_task, ctx, data_change, identity)
    out = rows.select(*[quoted(n) for n in (*names, *extra)]).mapInArrow(task, RESULT).collect()
    ranges = [r for row in out if row.kind == "identity" for r in ranges_from_json(orjson.loads(row.payload))]
    return adds_of(out), ranges, change_files_of(out)


def change_files_of(rows: Sequence[Any]) -> list[AddCDCFile]:
    """The change files tasks reported (``("cdc", -1, AddCDCFile JSON)`` results)."""
    return [AddCDCFile.from_json(orjson.loads(r.payload)) for r in rows if r.kind == "cdc"]


def _write_task(
    ctx: JobContext, data_change: bool, identity: IdentityFlags | None, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    out = TaskOutput(ctx)
    ids = TaskIdentity(ctx.uri, identity.slots, ctx.location.storage_options) if identity else None
    results: list[Result] = []
    buffer: list[pa.RecordBatch] = []
    size = 0

    def flush() -> list[Result]:
        rows = pa.Table.from_batches(buffer)
        kinds = None
        if CHANGE_COL in rows.column_names:  # each row's change type (null: not a change)
            kinds = rows.column(CHANGE_COL)
            rows = rows.drop_columns([CHANGE_COL])
        if ids is not None and identity is not None:
            rows = ids.fill_flagged(rows, ctx.arrow_schema, identity.flags)
        rows = ctx.conform(rows, "write")
        results = add_results(-1, out.write(rows, data_change=data_change))
        if kinds is not None:  # the change data of these rows, as written (identity values too)
            changed = pc.is_valid(kinds)
            changes = row_tracking.split(rows, ctx.hidden or ())[0]
            changes = changes.append_column(CHANGE_TYPE_COLUMN, kinds).filter(changed)
            cdc = out.write_changes(changes)
            results += [("cdc", -1, orjson.dumps(c.to_json()).decode(), 0, 0, None) for c in cdc]
        return results

    try:
        with typed_task_errors():
            for batch in batches:
                buffer.append(batch)
                size += batch.nbytes
                if size >= _WRITE_BUFFER_BYTES:
                    results += flush()
                    buffer, size = [], 0
            if buffer:
                results += flush()
    except BaseException:
        out.discard()
        raise
    finally:
        if ids is not None:
            ids.close()
    if ids is not None and ids.ranges:
        results.append(("identity", -1, orjson.dumps(ranges_to_json(ids.ranges)).decode(), 0, 0, None))
    if results:
        yield result_batch(results)


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
    spark: SparkSession,
    txn: Transaction,
    name: str,
    plan: Callable[[JobContext, StagedFiles], None],
    *,
    regenerate: Sequence[str] = (),
) -> PendingCommit:
    """Run ``plan`` (Spark jobs + staging) for ``txn``; on any failure nothing stays behind.
    A typed error a task raised (ConstraintViolationError...) is raised as itself."""
    ctx = JobContext.of(txn, regenerate)
    staged = StagedFiles(ctx)
    try:
        with job_description(spark, f"eventlog {name} {txn.table.uri}"):
            plan(ctx, staged)
    except BaseException as exc:
        staged.fail()
        txn.abort()
        typed = None if isinstance(exc, EventlogError) else recover_error(exc)
        if typed is not None:
            raise typed from exc
        raise
    return PendingCommit(txn)


def stage_adds(txn: Transaction, staged: StagedFiles, adds: Sequence[AddFile]) -> None:
    """Hand the tasks' files to the transaction (which deletes them if the commit fails);
    change files the tasks wrote are already staged (:meth:`PlanBuilder.add_change_files`)."""
    txn.add_files(adds)
    staged.finish({a.path for a in adds} | {c.path for c in txn.change_files})
