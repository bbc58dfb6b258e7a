"""The ``eventlog`` Python data source: ``format("eventlog")`` for batch reads and writes.

Registered automatically in every session through the top-level module
``pyspark_eventlog`` (Spark imports ``pyspark_*`` modules on its Python path and registers
their ``DefaultSource``). pyspark 4.2 finds Python data sources through the JVM thread's
*active* session only: a thread that did not create the session or call
``spark.createDataFrame`` must call :func:`activate` first (``spark.dataSource.register``
has the same limit).

A DataFrame from ``load(uri)`` reads the version resolved when it was created (schema and
rows from one snapshot); ``load`` again to see newer commits. Writes: only the
``append`` and ``overwrite`` modes exist, and Spark's own ``.partitionBy()`` is refused:
use the ``partitionBy`` option. ``memory://`` tables cannot be used (one per process).

Options (case-insensitive):

============================  ==========================================================
``path``                      the table location (``load(uri)`` / ``save(uri)``)
``storage.<name>``            an fsspec storage option of the table's file system, e.g.
                              ``storage.endpoint_url``, ``storage.key``, ``storage.secret``
                              for ``s3://`` (s3fs). Spark lower-cases option names;
                              ``true``/``false`` become booleans, other values are strings
``storageOptions``            a JSON object of fsspec storage options, for nested or typed
                              values (``{"client_kwargs": {"region_name": "eu-west-1"}}``)
                              and names with capitals; a name may not be given both ways.
                              The options reach every task and are never written to the
                              table's log
``slots``                     slot store URI, passed to ``Table.open(uri, slots=...)``
``versionAsOf``               read: time travel to a version
``timestampAsOf``             read: the latest version committed at or before an ISO time
                              (naive times are UTC)
``maxPartitionBytes``         read: most bytes of files one task reads (default 128 MB);
                              split like Spark's file sources, ``min(this, max(4 MB,
                              total / cores))``; ``1`` gives one task per file
``filterPushdown``            read: ``true`` prunes partitions and skips files by the
                              filters Spark pushes (needs the session conf
                              ``spark.sql.python.filterPushdown.enabled=true``; see
                              :mod:`spark_adapter.reader` for why it is off by default)
``partitionBy``               write: comma-separated partition columns of a new table
``clusterBy``                 write: comma-separated clustering columns (liquid
                              clustering) of a new table; on an existing one they must
                              be its own (``ClusteringError``, reason ``mismatch``).
                              Spark's ``DataFrameWriter.clusterBy`` does not reach
                              Python data sources
``replaceWhere``              overwrite: replace only the rows matching this predicate
``mergeSchema``               write: ``true`` lets new columns into the table schema
``txnAppId`` + ``txnVersion``  write: idempotent writes (a version already committed for
                              the app id is skipped)
``userMetadata``              write: stored in the commit's ``commitInfo``
``groupCommit``               append: ``true`` lets the commit share its version with
                              concurrent blind appends (:mod:`eventlog.txn.groupcommit`)
``durable``                   write: ``true`` fsyncs every data file in the task that
                              wrote it, and the commit, before the write returns
                              (``Table.open(..., durable=True)``; local disks); a value
                              other than ``true``/``false`` is ``InvalidInputError``
``rowIds``                    read: ``true`` adds each row's stable ``_row_id`` and
                              ``_row_commit_version`` (row tracking tables, Delta's
                              ``_metadata.row_id``/``row_commit_version``; else
                              ``RowTrackingNotEnabledError``)
``readChangeFeed``            read, readStream: ``true`` reads the change data feed, with
                              ``startingVersion``/``startingTimestamp`` and (batch)
                              ``endingVersion``/``endingTimestamp``
                              (:mod:`spark_adapter.change_feed`)
============================  ==========================================================
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from eventlog.errors import InvalidInputError, RowTrackingNotEnabledError
from eventlog.files import row_tracking
from eventlog.snapshot import Snapshot
from eventlog.table import Table
from spark_adapter.change_feed import (
    ChangeFeedStreamReader,
    batch_reader,
    change_feed_schema,
    is_change_feed_read,
    pin_schema,
    stream_reader,
)
from spark_adapter.errors import typed_task_errors
from spark_adapter.reader import (
    DEFAULT_MAX_PARTITION_BYTES,
    EventlogReader,
    PruningReader,
    ScanSource,
    row_id_schema,
)
from spark_adapter.stream_reader import EventlogStreamReader
from spark_adapter.stream_writer import EventlogStreamWriter, create_stream_writer
from spark_adapter.types import (
    activate_session,
    arrow_to_spark_schema,
    option,
    option_bool,
    option_int,
    table_location,
)
from spark_adapter.writer import EventlogWriter, plan_write

__all__ = ["EventlogDataSource", "activate"]


class EventlogDataSource(DataSource):  # type: ignore[misc]
    """``format("eventlog")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "eventlog"

    def schema(self) -> StructType:
        # Runs when Spark resolves the read (not when a user schema is given). The version
        # found here is pinned: the DataSource is pickled and reused by reader(), so the
        # schema and the rows always come from the same snapshot.
        if is_change_feed_read(self.options):  # readChangeFeed: see spark_adapter.change_feed
            self._pinned_version, metadata = pin_schema(self.options)
            return change_feed_schema(metadata)
        snap = self._snapshot()
        self._pinned_version = snap.version
        if option_bool(self.options, "rowIds"):
            if not row_tracking.enabled(snap.protocol, snap.metadata):
                raise RowTrackingNotEnabledError(
                    version=snap.version, supported=row_tracking.supported(snap.protocol)
                )
            return arrow_to_spark_schema(row_id_schema(snap.schema))
        return arrow_to_spark_schema(snap.schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        if is_change_feed_read(self.options):
            return batch_reader(self.options, schema, getattr(self, "_pinned_version", None))
        snap = self._snapshot(getattr(self, "_pinned_version", None))
        source = ScanSource(
            location=table_location(self.options),
            slots=option(self.options, "slots"),
            version=snap.version,
            schema_json=snap.metadata.schema_string,
            partition_columns=snap.partition_columns,
            max_partition_bytes=option_int(self.options, "maxPartitionBytes", minimum=1)
            or DEFAULT_MAX_PARTITION_BYTES,
            row_ids=row_tracking.materialized_columns(snap.metadata.configuration)
            if option_bool(self.options, "rowIds")
            else None,
        )
        if option_bool(self.options, "filterPushdown"):
            return PruningReader(source, schema, snap)
        return EventlogReader(source, schema, snap)

    def writer(self, schema: StructType, overwrite: bool) -> EventlogWriter:
        with typed_task_errors():  # a planning error reaches the caller recoverable (recover_error)
            return EventlogWriter(plan_write(self.options, schema, overwrite))

    def streamReader(self, schema: StructType) -> EventlogStreamReader | ChangeFeedStreamReader:
        """``spark.readStream.format("eventlog")``: see :mod:`spark_adapter.stream_reader`
        (:mod:`spark_adapter.change_feed` with ``readChangeFeed``). The stream reads with
        the metadata of the version ``schema()`` pinned."""
        if is_change_feed_read(self.options):
            return stream_reader(self.options, schema, getattr(self, "_pinned_version", None))
        return EventlogStreamReader(self.options, schema, read_version=getattr(self, "_pinned_version", None))

    def streamWriter(self, schema: StructType, overwrite: bool) -> EventlogStreamWriter:
        """``df.writeStream.format("eventlog")``: see :mod:`spark_adapter.stream_writer`
        (append and complete output modes; ``overwrite`` is complete mode)."""
        return create_stream_writer(self.options, schema, overwrite)

    def _snapshot(self, pinned: int | None = None) -> Snapshot:
        """The snapshot a read sees: ``pinned``, else the time-travel options, else latest."""
        options = self.options
        location = table_location(options)
        with Table.open(
            location.uri, slots=option(options, "slots"), storage_options=location.storage_options
        ) as table:
            if pinned is not None:
                return table.snapshot(pinned)
            version = option_int(options, "versionAsOf")
            timestamp = option(options, "timestampAsOf")
            if version is not None and timestamp is not None:
                raise InvalidInputError("Cannot specify both versionAsOf and timestampAsOf; use one")
            return table.snapshot(version, timestamp=timestamp)


def activate(spark: Any) -> None:
    """Make ``spark`` the JVM's active session in the calling thread.

    pyspark 4.2 looks Python data sources up in the *active* session only, a JVM
    thread-local that a new Python thread lacks until it calls ``spark.createDataFrame``;
    this sets it (the same as ``SparkSession.setActiveSession`` on the JVM side).
    """
    activate_session(spark)
