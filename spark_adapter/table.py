"""A DeltaTable-like API for eventlog tables whose heavy work runs as Spark jobs.

```python
t = EventlogTable.forPath(spark, "/data/events")
t.delete("date = '2024-01-01'")                       # partition-only: whole files, unread
t.update("x > 5", set={"x": "x + 1"})
t.alias("t").merge(updates.alias("s"), "t.id = s.id") \\
    .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
t.optimize().where("date = '2024-01-01'").executeZOrderBy("x")
t.clusterBy("x", "y")                                 # ALTER TABLE ... CLUSTER BY (x, y)
t.optimize().executeCompaction()                      # on a clustered table: clusters it
t.reorgPurge("date = '2024-01-01'")                  # REORG TABLE ... APPLY (PURGE)
t.vacuum()                                            # 168 hours by default
t.restoreToVersion(3)
t.history().show()

s3 = EventlogTable.forPath(spark, "s3://bucket/events", slots="zk://zk1:2181/eventlog",
                           storage_options={"endpoint_url": url, "key": key, "secret": secret})
```

``storage_options`` (fsspec options of the table's file system) reach every Spark task the
operations run: the handle's :class:`~eventlog.log.location.TableLocation` travels with them.
So does durable mode: ``EventlogTable.forPath(spark, uri, durable=True)`` (or a ``Table``
opened with ``durable=True``) makes every task fsync the data and change files it writes,
and the driver the deletion vectors and the commit, before an operation returns
(:mod:`eventlog.log.durable`).
``s3://`` tables are read by Spark's Parquet reader through S3A when ``hadoop-aws`` is on
the classpath, their storage options translated for each read (:mod:`spark_adapter.s3a`);
other tables with storage options, and options S3A cannot express, are read by Python tasks
(:mod:`spark_adapter.native`).

Each DML/OPTIMIZE is one eventlog transaction, planned on the driver exactly like the
plain-Python operation (same read predicates through ``txn.scan``, same operation name and
parameters, same actions), so concurrent writers conflict, or not, exactly as in
:mod:`eventlog`. Scans, joins and rewrites run in Spark tasks (:mod:`spark_adapter.ops`, one
module per operation, as in :mod:`eventlog.ops`). ``merge(...).plan()`` runs the jobs but
leaves the commit to the caller (two-phase).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.types import BooleanType, DataType, StringType, StructField, StructType

from eventlog import Table
from eventlog.errors import InvalidInputError
from eventlog.log.location import TableLocation
from eventlog.log.storage_clock import retention_now_ms
from eventlog.ops.transaction import Transaction
from eventlog.ops.vacuum import (
    RETENTION_CHECK_CONF,
    abandoned_staged_commits,
    referenced_files,
    retention_ms,
    sweep,
    top_level_entries,
)
from eventlog.snapshot.clustering import clustering_columns
from eventlog.txn.transaction import CommitResult
from lockstore import SlotStore
from spark_adapter.native import snapshot_dataframe
from spark_adapter.ops.delete import plan_delete
from spark_adapter.ops.jobs import PendingCommit
from spark_adapter.ops.merge import SparkMergeBuilder
from spark_adapter.ops.optimize import plan_optimize
from spark_adapter.ops.optimize_clustered import plan_optimize_clustered
from spark_adapter.ops.update import plan_update
from spark_adapter.session import default_parallelism, is_connect, spread
from spark_adapter.types import spark_to_arrow_schema

__all__ = ["EventlogTable", "OptimizeBuilder", "PendingCommit", "SparkMergeBuilder"]

SlotsSpec = SlotStore | str | None  # as eventlog.Table.open takes it
_HISTORY_SCHEMA = (
    "version BIGINT, timestamp TIMESTAMP, operation STRING, operationParameters MAP<STRING, STRING>, "
    "readVersion BIGINT, isolationLevel STRING, isBlindAppend BOOLEAN, operationMetrics MAP<STRING, STRING>, "
    "userMetadata STRING, engineInfo STRING, txnId STRING"
)

_ENTRIES = StructType([StructField("name", StringType()), StructField("is_dir", BooleanType())])
_DELETED = StructType([StructField("path", StringType())])


class EventlogTable:
    """A handle on one eventlog table for Spark users (delta-spark's ``DeltaTable``)."""

    def __init__(
        self, spark: SparkSession, table: Table, alias: str | None = None, *, slots: SlotsSpec = None
    ) -> None:
        self._spark = spark
        self._table = table
        self._alias = alias
        # The slot store as opened (the table's own spec by default): Spark tasks reserve
        # identity values there, so they must reach the store the driver commits through.
        self._slots = slots if slots is not None else table.slots_spec
        # How tasks reach the table: its URI and the options its file system was built with.
        self._location = TableLocation.from_store(table.log)

    @classmethod
    def forPath(
        cls,
        spark: SparkSession,
        uri: str,
        slots: SlotsSpec = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        durable: bool = False,
    ) -> EventlogTable:
        """Open the table at ``uri`` (TableNotFoundError if there is none).

        ``storage_options``: fsspec options of its file system (endpoint, credentials...),
        used here and in every Spark task of the handle's operations; InvalidInputError
        (nothing touched) for options the file system does not take. ``durable``: the
        handle's operations fsync what they write, in the tasks and on the driver, before
        they return (``Table.open(..., durable=True)``).
        """
        table = Table.open(uri, slots, storage_options=storage_options, durable=durable)
        protocol = table.log.fs.protocol
        if "memory" in (protocol if isinstance(protocol, tuple) else (protocol,)):
            # Spark tasks run in other processes, which cannot see this process's memory.
            table.close()
            raise InvalidInputError(f"{table.uri}: memory:// tables cannot be processed by Spark tasks")
        return cls(spark, table, slots=slots)

    @staticmethod
    def isEventlogTable(
        spark: SparkSession, uri: str, *, storage_options: Mapping[str, Any] | None = None
    ) -> bool:
        return Table.exists(uri, storage_options=storage_options)

    @property
    def location(self) -> TableLocation:
        """The table's URI with its storage options (the repr shows option names only)."""
        return self._location

    def alias(self, name: str) -> EventlogTable:
        """The same table, referred to as ``name`` in MERGE conditions."""
        return EventlogTable(self._spark, self._table, name, slots=self._slots)

    @property
    def table(self) -> Table:
        """The underlying :class:`eventlog.Table` handle."""
        return self._table

    @property
    def version(self) -> int:
        return self._table.version

    # ------------------------------------------------------------------ reads

    def toDF(self) -> DataFrame:
        """The latest version as a DataFrame, read by Spark's own Parquet reader
        (:func:`spark_adapter.native.read_table`)."""
        return snapshot_dataframe(self._spark, self._location, self._table.refresh())

    def history(self, limit: int | None = None) -> DataFrame:
        """One row per version, newest first (DESCRIBE HISTORY)."""
        rows = []
        for h in self._table.history(limit):
            ts = h.get("timestamp")
            rows.append(
                (
                    h["version"],
                    dt.datetime.fromtimestamp(ts / 1000, dt.UTC) if ts is not None else None,
                    h.get("operation"),
                    {k: str(v) for k, v in (h.get("operationParameters") or {}).items()},
                    h.get("readVersion"),
                    h.get("isolationLevel"),
                    h.get("isBlindAppend"),
                    {k: str(v) for k, v in (h.get("operationMetrics") or {}).items()},
                    h.get("userMetadata"),
                    h.get("engineInfo"),
                    h.get("txnId"),
                )
            )
        return self._spark.createDataFrame(rows, _HISTORY_SCHEMA)

    # ------------------------------------------------------------------ writes

    def delete(self, condition: str | Column | None = None) -> CommitResult:
        """Delete the rows matching ``condition`` (all rows when None)."""
        return plan_delete(self._spark, self._table.transaction(), condition).commit()

    def update(
        self, condition: str | Column | None = None, set: Mapping[str, str | Column] | None = None
    ) -> CommitResult:
        """Set columns (SQL expressions or Columns) on the rows matching ``condition``."""
        return plan_update(self._spark, self._table.transaction(), condition, set or {}).commit()

    def merge(self, source: DataFrame, condition: str | Column) -> SparkMergeBuilder:
        """Start a MERGE of ``source`` (aliased with ``source.alias(name)``) into this table."""
        return SparkMergeBuilder(self._spark, self._table, source, condition, self._alias, self._slots)

    def optimize(self) -> OptimizeBuilder:
        return OptimizeBuilder(self._spark, self._table)

    def clusterBy(self, *columns: str | Sequence[str]) -> CommitResult:
        """``ALTER TABLE ... CLUSTER BY (columns)`` (columns as ``"a", "b"`` or one list, as
        delta-spark's ``DeltaTableBuilder.clusterBy`` takes them); no column is ``CLUSTER BY
        NONE``. Metadata only (:meth:`eventlog.Table.cluster_by`; ``ClusteringError`` for a
        partitioned table or a column that cannot cluster): the next
        ``optimize().executeCompaction()`` clusters the files."""
        return self._table.cluster_by(_column_list(columns))

    def clusteringColumns(self) -> list[str]:
        """The table's clustering columns (empty when it is not clustered)."""
        return self._table.clustering_columns()

    def reorgPurge(self, condition: str | None = None) -> CommitResult:
        """``REORG TABLE ... [WHERE condition] APPLY (PURGE)``: rewrite the files with deletion
        vectors (in the partitions ``condition`` selects) so deleted rows are physically gone;
        recorded as ``REORG`` (:meth:`eventlog.Table.reorg_purge`; the rewrite runs on the
        driver, as RESTORE does)."""
        return self._table.reorg_purge(condition)

    def dropFeature(self, featureName: str, truncateHistory: bool = False) -> CommitResult:
        """``ALTER TABLE ... DROP FEATURE featureName [TRUNCATE HISTORY]``, as Delta's
        ``DeltaTable.dropFeatureSupport`` (:meth:`eventlog.Table.drop_feature`; refusals are
        ``FeatureDropError`` with ``feature`` and ``reason``)."""
        return self._table.drop_feature(featureName, truncate_history=truncateHistory)

    def restoreToVersion(self, version: int) -> CommitResult:
        """Make ``version``'s files live again, as a new version (RESTORE)."""
        return self._table.restore(version)

    def restoreToTimestamp(self, timestamp: dt.datetime | str | int) -> CommitResult:
        return self._table.restore(self._table.version_at(timestamp))

    # ------------------------------------------------------------------ schema

    def addConstraint(self, name: str, expression: str) -> CommitResult:
        """``ALTER TABLE ADD CONSTRAINT name CHECK (expression)`` (:meth:`eventlog.Table.add_constraint`):
        every existing row is checked first (``ConstraintViolationError``, nothing committed);
        every later write enforces it, in the Spark tasks too."""
        return self._table.add_constraint(name, expression)

    def dropConstraint(self, name: str, *, ifExists: bool = False) -> CommitResult:
        """``ALTER TABLE DROP CONSTRAINT [IF EXISTS] name``."""
        return self._table.drop_constraint(name, if_exists=ifExists)

    def changeColumnType(self, column: str, dataType: DataType | pa.DataType) -> CommitResult:
        """Widen a column's type (``ALTER TABLE ALTER COLUMN c TYPE t``), with the table
        property ``delta.enableTypeWidening = 'true'``: only metadata changes, older files read
        as the new type (:meth:`eventlog.Table.change_column_type`; ``TypeChangeError`` for a
        change Delta's type widening does not allow)."""
        if isinstance(dataType, DataType):
            dataType = spark_to_arrow_schema(StructType([StructField(column, dataType)])).field(0).type
        return self._table.change_column_type(column, dataType)

    def renameColumn(self, column: str, newName: str) -> CommitResult:
        """Rename a column, or a struct field given as ``"a.b"`` (``ALTER TABLE RENAME COLUMN``):
        metadata only, with column mapping on (:meth:`eventlog.Table.rename_column`;
        ``ColumnMappingError`` naming ``delta.columnMapping.mode`` without it)."""
        return self._table.rename_column(column, newName)

    def dropColumns(self, *columns: str) -> CommitResult:
        """Drop columns or struct fields (``ALTER TABLE DROP COLUMNS``): metadata only, with
        column mapping on (:meth:`eventlog.Table.drop_columns`)."""
        return self._table.drop_columns(list(columns))

    # ------------------------------------------------------------------ vacuum

    def vacuum(self, retentionHours: float | None = None, *, dryRun: bool = False) -> list[str]:
        """Delete data files no version within the retention references (and abandoned
        staged commits older than the retention); returns their paths.

        The rules are the engine's (:mod:`eventlog.ops.vacuum`); Spark only spreads the listing
        and deletion of the table's top-level entries over tasks. A retention shorter than
        the table's is refused unless ``spark.databricks.delta.retentionDurationCheck.enabled``
        is false, as in Delta.
        """
        snap = self._table.refresh()
        enforce = str(self._spark.conf.get(RETENTION_CHECK_CONF, "true")).lower() != "false"
        horizon = retention_now_ms(self._table.log) - retention_ms(snap, retentionHours, enforce=enforce)
        valid = referenced_files(self._table, horizon)
        fs, root = self._location.files()
        canonical = self._location.uri
        staged = abandoned_staged_commits(self._table, horizon, dryRun)  # few: on the driver
        parts = snap.partition_columns
        entries = top_level_entries(fs, root, parts)
        if not entries:
            return sorted(f"{canonical}/{rel}" for rel in staged)
        slices = max(1, min(len(entries), 2 * default_parallelism(self._spark)))
        if is_connect(self._spark):  # no broadcast or RDD: the valid set travels with each task
            arrow_task = functools.partial(
                _vacuum_arrow_task, self._location, parts, frozenset(valid), horizon, dryRun
            )
            df = spread(self._spark, entries, _ENTRIES, slices).mapInArrow(arrow_task, _DELETED)
            deleted = [str(r.path) for r in df.collect()]
            return sorted(f"{canonical}/{rel}" for rel in [*deleted, *staged])
        sc = self._spark.sparkContext
        valid_bc = sc.broadcast(frozenset(valid))
        try:
            task = functools.partial(_vacuum_task, self._location, parts, valid_bc, horizon, dryRun)
            deleted = sc.parallelize(entries, slices).mapPartitions(task).collect()
        finally:
            valid_bc.unpersist()
        return sorted(f"{canonical}/{rel}" for rel in [*deleted, *staged])


def _vacuum_task(
    location: TableLocation,
    partition_columns: Sequence[str],
    valid: Any,
    horizon: int,
    dry_run: bool,
    entries: Iterator[tuple[str, bool]],
) -> Iterator[str]:
    """One Spark task's share of :func:`eventlog.ops.vacuum.sweep`."""
    fs, root = location.files()
    yield from sweep(fs, root, entries, partition_columns, valid.value, horizon, dry_run)


def _vacuum_arrow_task(
    location: TableLocation,
    partition_columns: Sequence[str],
    valid: frozenset[str],
    horizon: int,
    dry_run: bool,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """:func:`_vacuum_task` as a ``mapInArrow`` task (Spark Connect): (name, is_dir) rows in,
    the deleted paths out."""
    fs, root = location.files()
    for batch in batches:
        entries = zip(batch.column("name").to_pylist(), batch.column("is_dir").to_pylist(), strict=True)
        gone = list(sweep(fs, root, entries, partition_columns, valid, horizon, dry_run))
        if gone:
            yield pa.RecordBatch.from_arrays([pa.array(gone, pa.string())], names=["path"])


class OptimizeBuilder:
    """delta-spark's ``DeltaOptimizeBuilder``."""

    def __init__(self, spark: SparkSession, table: Table) -> None:
        self._spark = spark
        self._table = table
        self._filter: str | None = None

    def where(self, partitionFilter: str) -> OptimizeBuilder:
        """Only compact partitions matching this predicate on partition columns."""
        self._filter = partitionFilter
        return self

    def executeCompaction(self) -> CommitResult:
        """Bin-pack small files per partition (``dataChange = false``); on a table with
        clustering columns, cluster it instead, as Delta's OPTIMIZE does
        (:mod:`spark_adapter.ops.optimize_clustered`)."""
        txn = self._table.transaction()
        columns = _clustering_columns(txn)
        if columns:
            return plan_optimize_clustered(self._spark, txn, columns, self._filter).commit()
        return plan_optimize(self._spark, txn, self._filter, ()).commit()

    def executeZOrderBy(self, *columns: str | Sequence[str]) -> CommitResult:
        """Rewrite each partition's files ordered along a Z-order curve of ``columns``;
        ``ClusteringError`` (reason ``zorder``, nothing run) on a clustered table, as the
        engine and Delta refuse it."""
        return plan_optimize(
            self._spark, self._table.transaction(), self._filter, _column_list(columns)
        ).commit()


def _column_list(columns: Sequence[str | Sequence[str]]) -> list[str]:
    """Column names given as ``"a", "b"`` or as lists of them."""
    out: list[str] = []
    for c in columns:
        out.extend([c] if isinstance(c, str) else c)
    return out


def _clustering_columns(txn: Transaction) -> list[str]:
    snap = txn.snapshot
    return clustering_columns(snap.protocol, snap.domains, txn.schema) if snap is not None else []
