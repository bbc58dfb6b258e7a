"""Change data feed reads in Spark: ``option("readChangeFeed", "true")`` on
``spark.read.format("eventlog")`` and on ``spark.readStream.format("eventlog")``, the rows
of ``Table.changes`` (Delta's ``table_changes``) with Delta's options:

=====================  ===============================================================
``readChangeFeed``     ``true``: read the change data feed (``readChangeData`` too, as Delta)
``startingVersion``    first version (batch: this or ``startingTimestamp`` is required;
                       streaming: also ``latest``)
``startingTimestamp``  the first version committed at or after this time (ISO 8601)
``endingVersion``      batch: last version (default: latest)
``endingTimestamp``    batch: the last version committed at or before this time
=====================  ===============================================================

Batch: the range and its files are planned once on the driver (:func:`plan_changes`, the
version pinned by ``DataSource.schema``); tasks read groups of files
(:func:`eventlog.snapshot.changes.read_changes`); a range over a schema change the end
version's schema cannot read raises :class:`~eventlog.errors.ChangeDataSchemaChangeError`.
Streaming: offsets are ``{"version": N}``, every change up to version N emitted, with
``"index": i`` when the first i change files of version N + 1 were emitted too; a
micro-batch reads the changes between its offsets. Without a starting version or timestamp
the stream begins, as Delta's does, with the table's rows at its latest version as
``insert`` rows of that version (``{"version": -1, "snapshot": true}``, with
``snapshot_version`` and ``index`` while it is read in parts), then the changes of later
versions. ``maxFilesPerTrigger`` (default 1000) and ``maxBytesPerTrigger`` limit the change
files of a micro-batch as Delta's do (:class:`ChangeFeedStreamReader`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from eventlog.errors import InvalidInputError
from eventlog.files.change_rows import ChangeFile
from eventlog.log.actions import Metadata
from eventlog.log.location import TableLocation
from eventlog.snapshot.changes import ChangePlan, commit_timestamps, output_schema, plan_changes, read_changes
from eventlog.snapshot.changes import resolve_range as resolve_change_range
from eventlog.table import Table
from spark_adapter.reader import pack_files, split_bytes
from spark_adapter.stream_reader import admission_for, default_read_limit
from spark_adapter.types import (
    arrow_to_spark_schema,
    option,
    option_bool,
    spark_arrow_schema,
    table_location,
    to_spark_arrow,
)
from streaming.source import Budget, SourceOptions

__all__ = [
    "ChangeFeedReader",
    "ChangeFeedStreamReader",
    "ChangesPartition",
    "batch_reader",
    "change_feed_schema",
    "is_change_feed_read",
    "pin_schema",
    "resolve_range",
    "stream_reader",
]

log = logging.getLogger("spark_adapter.change_feed")

_BATCH_ROWS = 64 * 1024
_DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024
_PLAN_VERSIONS = 128  # a stream's admission plans this many versions at a time


def is_change_feed_read(options: Mapping[str, str]) -> bool:
    """Whether the read's options ask for the change data feed."""
    return option_bool(options, "readChangeFeed") or option_bool(options, "readChangeData")


def _version(options: Mapping[str, str], key: str) -> int | None:
    return _as_version(option(options, key), key)


def _as_version(value: str | None, key: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidInputError(f"option {key} must be a version number, not {value!r}") from None


def resolve_range(table: Table, options: Mapping[str, str]) -> tuple[int, int]:
    """(start, end) versions of a batch change data feed read (see the module docstring)."""
    latest = table.refresh().version
    return resolve_change_range(
        table.commitlog,
        latest,
        _version(options, "startingVersion"),
        _version(options, "endingVersion"),
        start_timestamp=option(options, "startingTimestamp"),
        end_timestamp=option(options, "endingTimestamp"),
    )


def change_feed_schema(metadata: Metadata) -> StructType:
    """The Spark schema of a change data feed read with the table ``metadata``."""
    return arrow_to_spark_schema(output_schema(ChangePlan(0, -1, metadata, (), {})))


def _open(options: Mapping[str, str]) -> Table:
    location = table_location(options)
    return Table.open(location.uri, slots=option(options, "slots"), storage_options=location.storage_options)


def pin_schema(options: Mapping[str, str]) -> tuple[int, Metadata]:
    """(the version whose schema a change data feed read returns, its metadata): the end
    version of a batch read (``endingVersion``/``endingTimestamp``), else the latest."""
    with _open(options) as table:
        latest = table.refresh().version
        end = latest
        if option(options, "endingVersion") is not None or option(options, "endingTimestamp") is not None:
            _, end = resolve_change_range(
                table.commitlog,
                latest,
                0,
                _version(options, "endingVersion"),
                end_timestamp=option(options, "endingTimestamp"),
            )
        return end, table.snapshot(end).metadata


def batch_reader(options: Mapping[str, str], output: StructType, pinned: int | None) -> ChangeFeedReader:
    """The reader of a batch change data feed read, its range resolved and planned now; the
    end is ``pinned`` (the version ``DataSource.schema`` read the schema at) when not given."""
    with _open(options) as table:
        start, end = resolve_range(table, options)
        if (
            pinned is not None
            and option(options, "endingVersion") is None
            and option(options, "endingTimestamp") is None
        ):
            end = min(end, pinned)
        plan = plan_changes(table.commitlog, start, end, table.snapshot(pinned).metadata)
    return ChangeFeedReader(table_location(options), plan, output)


class ChangesPartition(InputPartition):  # type: ignore[misc]
    """One task's files of a change data feed read (as JSON)."""

    def __init__(self, files: list[dict[str, Any]]) -> None:
        super().__init__(files)

    @property
    def files(self) -> tuple[ChangeFile, ...]:
        return tuple(ChangeFile.from_json(d) for d in self.value)


def _partitions(plan: ChangePlan) -> list[InputPartition]:
    """The plan's files packed into input partitions by size (a commit may span two); one
    empty partition when there are none (a batch read of a range without changes)."""
    if not plan.files:
        return [ChangesPartition([])]
    adds = [f.file for f in plan.files]
    groups = pack_files(adds, split_bytes(adds, _DEFAULT_SPLIT_BYTES))
    out: list[InputPartition] = []
    first = 0
    for group in groups:
        out.append(ChangesPartition([f.to_json() for f in plan.files[first : first + len(group)]]))
        first += len(group)
    return out


def _read(
    location: TableLocation, header: ChangePlan, partition: InputPartition, output: StructType
) -> Iterator[pa.RecordBatch]:
    """A task's rows: its files read as the plan's changes, in Spark's Arrow schema."""
    if not isinstance(partition, ChangesPartition):
        return
    fs, root = location.files()
    rows = read_changes(
        fs, root, dataclasses.replace(header, files=partition.files), columns=output.fieldNames()
    )
    yield from to_spark_arrow(rows, spark_arrow_schema(output)).to_batches(max_chunksize=_BATCH_ROWS)


class ChangeFeedReader(DataSourceReader):  # type: ignore[misc]
    """A batch change data feed read of a planned range; pickled to the tasks without files."""

    def __init__(self, location: TableLocation, plan: ChangePlan, output: StructType) -> None:
        self.location = location
        self.plan = plan
        self.header = dataclasses.replace(plan, files=())
        self.output = output

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["plan"] = self.header  # tasks need only their partition's files
        return state

    def partitions(self) -> list[InputPartition]:
        parts = _partitions(self.plan)
        log.info(
            "change data feed of %s, versions %d to %d: %d files in %d input partitions",
            self.location.uri, self.plan.start, self.plan.end, len(self.plan.files), len(parts),
        )  # fmt: skip
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.location, self.header, partition, self.output)


def stream_reader(
    options: Mapping[str, str], output: StructType, pinned: int | None
) -> ChangeFeedStreamReader:
    """The stream reader of a change data feed, reading with the metadata of ``pinned``."""
    with _open(options) as table:
        metadata = table.snapshot(pinned).metadata
    return ChangeFeedStreamReader(options, table_location(options), metadata, output)


@dataclasses.dataclass(frozen=True)
class _Position:
    """Where a change data feed stream is (its offset): every change up to ``version`` emitted,
    and the first ``index`` files of the next version's (a commit split by the read limit).
    In the initial snapshot (``snapshot``: its version, -1 before it is chosen): the first
    ``index`` of its files emitted, nothing after it."""

    version: int
    index: int = 0
    snapshot: int | None = None

    @staticmethod
    def of(offset: Mapping[str, Any]) -> _Position:
        index = int(offset.get("index", 0))
        if offset.get("snapshot"):
            return _Position(-1, index, int(offset.get("snapshot_version", -1)))
        return _Position(int(offset["version"]), index)

    def to_json(self) -> dict[str, Any]:
        if self.snapshot is not None:
            out: dict[str, Any] = {"version": -1, "snapshot": True}
            if self.snapshot >= 0:
                out |= {"snapshot_version": self.snapshot, "index": self.index}
            return out
        return {"version": self.version, "index": self.index} if self.index else {"version": self.version}


def _whole(files: Sequence[ChangeFile]) -> bool:
    """Whether a commit's change files are admitted all or none (Delta's CDC stream: change
    data files, so that an update's pre- and post-images stay together, and deletion
    vectors, whose adds and removes pair up); other commits file by file."""
    return any(f.kind in ("cdc", "dv") or f.file.deletion_vector is not None for f in files)


class ChangeFeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """The change data feed as a stream (see the module docstring). ``metadata``: the table
    metadata the query reads with (the version ``DataSource.schema`` pinned).

    Admission as Delta's change data feed stream: ``maxFilesPerTrigger`` (default 1000) and
    ``maxBytesPerTrigger`` count change files; the initial snapshot and the commits of only
    added and removed files without deletion vectors are admitted file by file, a commit with
    change data files or deletion vectors whole (the first of a batch always, a later one
    only when it fits in what is left). A batch that finishes the initial snapshot ends there.
    """

    def __init__(
        self, options: Mapping[str, str], location: TableLocation, metadata: Metadata, output: StructType
    ) -> None:
        self.location = location
        self.slots = option(options, "slots")
        self.starting_version = option(options, "startingVersion")
        self.starting_timestamp = option(options, "startingTimestamp")
        self.source_options = SourceOptions.parse(options)
        self.metadata = metadata
        self.output = output
        self._table: Table | None = None
        self._target: int | None = None  # availableNow: the last version of the run
        self._snapshot: tuple[int, tuple[ChangeFile, ...]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_table"] = state["_snapshot"] = None
        return state

    @property
    def table(self) -> Table:
        if self._table is None:
            loc = self.location
            self._table = Table.open(loc.uri, slots=self.slots, storage_options=loc.storage_options)
        return self._table

    def initialOffset(self) -> dict[str, Any]:
        latest = self.table.refresh().version
        if self.starting_version is not None and self.starting_version.strip().lower() == "latest":
            return {"version": latest}
        if self.starting_version is None and self.starting_timestamp is None:
            return _Position(-1, 0, -1).to_json()  # the latest rows first, as inserts
        start, _ = resolve_change_range(
            self.table.commitlog,
            latest,
            _as_version(self.starting_version, "startingVersion"),
            start_timestamp=self.starting_timestamp,
        )
        return {"version": start - 1}

    def getDefaultReadLimit(self) -> ReadLimit:
        return default_read_limit(self.source_options)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.table.refresh().version

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        latest = self.table.refresh().version if self._target is None else self._target
        budget = Budget(admission_for(limit, self.source_options))
        at = _Position.of(start)
        if at.snapshot is not None:
            version = at.snapshot if at.snapshot >= 0 else latest
            files = self._snapshot_files(version)
            taken = at.index + budget.take([f.file for f in files[at.index :]])
            return (_Position(-1, taken, version) if taken < len(files) else _Position(version)).to_json()
        version = at.version + 1
        while version <= latest and budget.open:
            last = min(latest, version + _PLAN_VERSIONS - 1)
            by_version = self._changes(version, last)
            for v in range(version, last + 1):
                if not budget.open:
                    return at.to_json()
                changed = by_version.get(v, [])
                rest = [f.file for f in changed[at.index :]]
                if _whole(changed):
                    if not budget.take_whole(rest):
                        return at.to_json()
                else:
                    taken = budget.take(rest)
                    if taken < len(rest):
                        return _Position(v - 1, at.index + taken).to_json()
                at = _Position(v)
            version = last + 1
        return at.to_json()

    def _changes(self, first: int, last: int) -> dict[int, list[ChangeFile]]:
        """The change files of versions ``first..last``, by version."""
        plan = plan_changes(self.table.commitlog, first, last, self.metadata, check_schema=False)
        out: dict[int, list[ChangeFile]] = {}
        for f in plan.files:
            out.setdefault(f.version, []).append(f)
        return out

    def _snapshot_files(self, version: int) -> tuple[ChangeFile, ...]:
        """The table's files at ``version`` as that version's inserts (kept for the snapshot)."""
        if self._snapshot is None or self._snapshot[0] != version:
            adds = self.table.snapshot(version).add_files
            self._snapshot = (version, tuple(ChangeFile(version, "insert", add) for add in adds))
        return self._snapshot[1]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = _Position.of(start), _Position.of(end)
        plan = (
            self._snapshot_plan(first, last)
            if first.snapshot is not None
            else self._commits_plan(first, last)
        )
        if plan is None:
            return []
        header = dataclasses.replace(plan, files=(), metadata=self.metadata)
        return [_StreamPartition(p.value, header) for p in _partitions(plan)]

    def _commits_plan(self, first: _Position, last: _Position) -> ChangePlan | None:
        """The changes after ``first`` up to ``last`` (both possibly within a commit)."""
        start = first.version + 1
        end = last.version + 1 if last.index else last.version
        if end < start:
            return None
        # Delta checks schema changes so in batch reads only (a stream has its own rules).
        plan = plan_changes(self.table.commitlog, start, end, self.metadata, check_schema=False)
        files: list[ChangeFile] = []
        seen: dict[int, int] = {}
        for f in plan.files:
            n = seen[f.version] = seen.get(f.version, -1) + 1  # its index in its commit
            if f.version == start and n < first.index:
                continue  # emitted by the batch before
            if last.index and f.version == end and n >= last.index:
                continue  # left for the next batch
            files.append(f)
        return dataclasses.replace(plan, files=tuple(files))

    def _snapshot_plan(self, first: _Position, last: _Position) -> ChangePlan:
        """The initial snapshot's rows (its version's inserts) from ``first`` to ``last``."""
        version = last.snapshot if last.snapshot is not None and last.snapshot >= 0 else last.version
        every = self._snapshot_files(version)
        files = every[first.index : last.index if last.snapshot is not None else len(every)]
        commit = self.table.commits_between(version, version)
        timestamps = commit_timestamps(self.table.commitlog, commit)
        return ChangePlan(version, version, self.metadata, files, timestamps)

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("change data feed stream over %s committed up to %s", self.location.uri, end)

    def stop(self) -> None:
        table, self._table = self._table, None
        if table is not None:
            table.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, _StreamPartition):
            return iter(())
        return _read(self.location, partition.header, partition, self.output)


class _StreamPartition(ChangesPartition):
    """A micro-batch's input partition: its files and the range they belong to."""

    def __init__(self, files: list[dict[str, Any]], header: ChangePlan) -> None:
        super().__init__(files)
        self.header = header
