"""A DeltaTable-like API for eventlog tables whose heavy work runs as Spark jobs.

```python
t = EventlogTable.forPath(spark, "/data/events")
t.delete("date = '2024-01-01'")                       # partition-only: whole files, unread
t.update("x > 5", set={"x": "x + 1"})
t.alias("t").merge(updates.alias("s"), "t.id = s.id") \\
    .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
t.optimize().where("date = '2024-01-01'").executeZOrderBy("x")
t.vacuum()                                            # 168 hours by default
t.restoreToVersion(3)
t.history().show()
```

Each DML/OPTIMIZE is one eventlog transaction, planned on the driver exactly like the
plain-Python operation (same read predicates through ``txn.scan``, same operation name and
parameters, same actions), so concurrent writers conflict, or not, exactly as in
:mod:`eventlog`. Scans, joins and rewrites run in Spark tasks (:mod:`spark_adapter.dml`,
:mod:`spark_adapter.merge`). ``merge(...).plan()`` runs the jobs but leaves the commit to
the caller (two-phase).
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql import Column, DataFrame, SparkSession

from eventlog import Table
from eventlog.datafiles import escape_path_name
from eventlog.errors import CorruptLogError, InvalidInputError
from eventlog.operations import DEFAULT_DELETED_FILE_RETENTION, DELETED_FILE_RETENTION_KEY, parse_interval_ms
from eventlog.storage import normalize_uri
from eventlog.transaction import CommitResult, dv_relative_path
from lockstore import SlotStore
from spark_adapter.dml import PendingCommit, plan_delete, plan_optimize, plan_update
from spark_adapter.merge import SparkMergeBuilder

__all__ = ["EventlogTable", "OptimizeBuilder", "PendingCommit", "SparkMergeBuilder"]

SlotsSpec = SlotStore | str | None  # as eventlog.Table.open takes it
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
_HISTORY_SCHEMA = (
    "version BIGINT, timestamp TIMESTAMP, operation STRING, operationParameters MAP<STRING, STRING>, "
    "readVersion BIGINT, isolationLevel STRING, isBlindAppend BOOLEAN, operationMetrics MAP<STRING, STRING>, "
    "userMetadata STRING, engineInfo STRING, txnId STRING"
)


class EventlogTable:
    """A handle on one eventlog table for Spark users (delta-spark's ``DeltaTable``)."""

    def __init__(self, spark: SparkSession, table: Table, alias: str | None = None) -> None:
        self._spark = spark
        self._table = table
        self._alias = alias

    @classmethod
    def forPath(cls, spark: SparkSession, uri: str, slots: SlotsSpec = None) -> EventlogTable:
        """Open the table at ``uri`` (TableNotFoundError if there is none)."""
        table = Table.open(uri, slots)
        protocol = table.log.fs.protocol
        if "memory" in (protocol if isinstance(protocol, tuple) else (protocol,)):
            # Spark tasks run in other processes, which cannot see this process's memory.
            raise InvalidInputError(f"{table.uri}: memory:// tables cannot be processed by Spark tasks")
        return cls(spark, table)

    @staticmethod
    def isEventlogTable(spark: SparkSession, uri: str) -> bool:
        return Table.exists(uri)

    def alias(self, name: str) -> EventlogTable:
        """The same table, referred to as ``name`` in MERGE conditions."""
        return EventlogTable(self._spark, self._table, name)

    @property
    def table(self) -> Table:
        """The underlying :class:`eventlog.Table` handle."""
        return self._table

    @property
    def version(self) -> int:
        return self._table.version

    # ------------------------------------------------------------------ reads

    def toDF(self) -> DataFrame:
        """The latest version as a DataFrame (the ``eventlog`` data source)."""
        try:
            # Python data sources are looked up through the JVM thread's active session,
            # which a thread that has not used the session yet does not have.
            jvm: Any = self._spark._jvm
            jvm.org.apache.spark.sql.SparkSession.setActiveSession(self._spark._jsparkSession)
        except Exception:
            pass  # not a classic session: nothing to do
        return self._spark.read.format("eventlog").load(self._table.uri)

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
        return SparkMergeBuilder(self._spark, self._table, source, condition, self._alias)

    def optimize(self) -> OptimizeBuilder:
        return OptimizeBuilder(self._spark, self._table)

    def restoreToVersion(self, version: int) -> CommitResult:
        """Make ``version``'s files live again, as a new version (RESTORE)."""
        return self._table.restore(version)

    def restoreToTimestamp(self, timestamp: dt.datetime | str | int) -> CommitResult:
        return self._table.restore(self._table.version_at(timestamp))

    # ------------------------------------------------------------------ vacuum

    def vacuum(self, retentionHours: float | None = None, *, dryRun: bool = False) -> list[str]:
        """Delete data files no version within the retention references; returns their paths.

        Retention defaults to ``delta.deletedFileRetentionDuration`` (1 week). A shorter one
        is refused unless ``spark.databricks.delta.retentionDurationCheck.enabled`` is false,
        as in Delta: readers of old versions and writers that have not committed yet may
        still need younger files. ``_delta_log``, ``_eventlog`` and hidden files are never
        touched. Listing and deleting run in Spark tasks.
        """
        snap = self._table.refresh()
        configured = parse_interval_ms(
            snap.properties.get(DELETED_FILE_RETENTION_KEY, DEFAULT_DELETED_FILE_RETENTION)
        )
        retention = configured if retentionHours is None else int(retentionHours * 3_600_000)
        if retention < 0:
            raise InvalidInputError(f"retentionHours must not be negative, got {retentionHours}")
        check = str(self._spark.conf.get(RETENTION_CHECK_CONF, "true")).lower() != "false"
        if check and retention < configured:
            raise InvalidInputError(
                "Are you sure you would like to vacuum files with such a low retention period? If you "
                "have writers that are currently writing to this table, there is a risk that you may "
                "corrupt the state of your table. If you are certain that there are no operations being "
                "performed on this table, such as insert/upsert/delete/optimize, then you may turn off "
                f"this check by setting: {RETENTION_CHECK_CONF} = false. The table retention is "
                f"{configured / 3_600_000:g} hours; {retention / 3_600_000:g} hours were requested."
            )
        horizon = int(time.time() * 1000) - retention
        valid = self._referenced_files(horizon)
        fs, root, canonical = normalize_uri(self._table.uri)
        parts = snap.partition_columns
        entries = [
            (e["name"].rsplit("/", 1)[-1], e.get("type") == "directory")
            for e in fs.ls(root, detail=True)
            if not _hidden(e["name"].rsplit("/", 1)[-1], parts)
        ]
        if not entries:
            return []
        sc = self._spark.sparkContext
        valid_bc = sc.broadcast(frozenset(valid))
        try:
            task = functools.partial(_vacuum_task, self._table.uri, parts, valid_bc, horizon, dryRun)
            slices = max(1, min(len(entries), 2 * int(sc.defaultParallelism)))
            deleted = sc.parallelize(entries, slices).mapPartitions(task).collect()
        finally:
            valid_bc.unpersist()
        return sorted(f"{canonical}/{rel}" for rel in deleted)

    def _referenced_files(self, horizon: int) -> set[str]:
        """Table-relative paths (data and DV files) a version within retention may read."""
        snap = self._table.refresh()
        valid: set[str] = set()

        def keep(path: str, dv: Any) -> None:
            if not urlparse(path).scheme:
                valid.add(unquote(path))
            if dv is not None and dv.storage_type == "u":
                valid.add(dv_relative_path(dv))

        for add in snap.add_files:
            keep(add.path, add.deletion_vector)
        for rm in snap.tombstones.values():
            if (rm.deletion_timestamp or 0) >= horizon:
                keep(rm.path, rm.deletion_vector)
        # Commits within retention: their removes cover tombstones a checkpoint may have
        # dropped under a shorter table retention than the one asked for here.
        version = snap.version
        while version >= 0:
            try:
                (commit,) = self._table.commits_between(version, version)
            except CorruptLogError:
                break  # older commits were cleaned up
            if (commit.timestamp or 0) < horizon:
                break
            for add in commit.adds:
                keep(add.path, add.deletion_vector)
            for rm in commit.removes:
                keep(rm.path, rm.deletion_vector)
            version -= 1
        return valid


def _hidden(name: str, partition_columns: Sequence[str]) -> bool:
    """Delta's rule: names starting with ``_`` or ``.`` are not data, except partition dirs."""
    if not name.startswith(("_", ".")):
        return False
    return not any(name.startswith(f"{escape_path_name(c)}=") for c in partition_columns)


def _mtime_ms(info: Mapping[str, Any]) -> int | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return int(value * 1000)
        if isinstance(value, dt.datetime):
            return int(value.timestamp() * 1000)
    return None


def _vacuum_task(
    uri: str,
    partition_columns: Sequence[str],
    valid: Any,
    horizon: int,
    dry_run: bool,
    entries: Iterator[tuple[str, bool]],
) -> Iterator[str]:
    """List the given top-level entries and delete unreferenced files older than ``horizon``."""
    fs, root, _ = normalize_uri(uri)
    keep = valid.value
    for name, is_dir in entries:
        path = f"{root}/{name}"
        found = fs.find(path, withdirs=False, detail=True) if is_dir else {path: fs.info(path)}
        for full, info in found.items():
            rel = full[len(root) + 1 :]
            if any(_hidden(part, partition_columns) for part in rel.split("/")) or rel in keep:
                continue
            mtime = _mtime_ms(info)
            if mtime is None or mtime >= horizon:
                continue  # unknown or too young: a writer may not have committed it yet
            if not dry_run:
                try:
                    fs.rm_file(full)
                except FileNotFoundError:
                    continue
            yield rel


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
        """Bin-pack small files per partition (``dataChange = false``)."""
        return plan_optimize(self._spark, self._table.transaction(), self._filter, ()).commit()

    def executeZOrderBy(self, *columns: str | Sequence[str]) -> CommitResult:
        """Rewrite each partition's files ordered along a Z-order curve of ``columns``."""
        cols: list[str] = []
        for c in columns:
            cols.extend([c] if isinstance(c, str) else c)
        return plan_optimize(self._spark, self._table.transaction(), self._filter, cols).commit()
