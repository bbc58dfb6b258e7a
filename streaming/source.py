"""Change selection for streaming reads: which data files a stream emits, in what order.

A :class:`ChangeSource` walks one table's log for one run of a streaming query (any engine;
:mod:`spark_adapter.stream_reader` is the Spark glue). Positions are
:class:`~streaming.offsets.SourceOffset` values.

What a stream emits:

1. Without ``startingVersion``/``startingTimestamp``, first the **snapshot** the stream
   starts from (every live file, deletion vectors applied), ordered by modification time
   and path. A batch that reads the snapshot ends at the snapshot's end at the latest, so
   its end offset always says which snapshot it read (restarts replay it exactly).
2. Then **every later commit, in order**: the ``add`` actions with ``dataChange = true``
   of blind appends, in the order the commit lists them.

Commits that cannot be streamed as appends:

* ``dataChange = false`` commits (OPTIMIZE, auto-compaction) only rearrange rows that were
  already emitted: skipped silently, their files are never emitted.
* A commit that removes rows (``remove`` with ``dataChange = true``: DELETE, UPDATE, MERGE,
  overwrite, RESTORE) fails with :class:`ChangeCommitError`, unless ``skipChangeCommits``
  (skip the whole commit) or, for commits that only delete whole files (a DELETE of whole
  partitions), ``ignoreDeletes``: Delta's rules.
* A commit that changes the metadata (schema, table properties, partitioning or protocol)
  after the version whose metadata the run started with fails with
  :class:`SourceMetadataChangedError`. Everything before it is emitted first: the error
  comes when the stream stands right at that commit, so a restarted query (which takes the
  new metadata) resumes there and loses or repeats no row.
* Commits or data files removed under the stream (log cleanup, VACUUM) fail with
  :class:`DataLossError`; with ``failOnDataLoss=false`` they are skipped with a warning in
  the ``streaming.source`` log.

Admission (rate limits) counts files and bytes, as Delta does: a batch takes files while
both budgets are positive, so it holds at least one file and may pass ``maxBytesPerTrigger``
by its last file. ``maxFilesPerTrigger`` defaults to 1000 when neither limit is set.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from eventlog.errors import InvalidInputError, VersionNotFoundError
from eventlog.files.scan import read_live_rows
from eventlog.log.actions import AddFile, Metadata, Protocol
from eventlog.log.commit import Commit
from eventlog.log.filetable import add_files
from eventlog.log.storage import LogStore
from eventlog.snapshot import Snapshot
from eventlog.snapshot.timeline import timestamp_ms
from eventlog.table import Table
from eventlog.txn.identity import schema_without_marks
from streaming.errors import ChangeCommitError, DataLossError, InvalidOffsetError, SourceMetadataChangedError
from streaming.offsets import SourceOffset

__all__ = [
    "DEFAULT_MAX_FILES_PER_TRIGGER",
    "Admission",
    "Budget",
    "ChangeSource",
    "SourceFile",
    "SourceOptions",
    "lost_file",
    "read_source_files",
]

log = logging.getLogger("streaming.source")

DEFAULT_MAX_FILES_PER_TRIGGER = 1000
_BYTE_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Admission:
    """How much one batch may take: files and bytes (None: no limit)."""

    max_files: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class SourceOptions:
    """The options of a streaming read (Delta's names; see :meth:`parse`)."""

    starting_version: int | None = None
    starting_latest: bool = False
    starting_timestamp: str | None = None
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    skip_change_commits: bool = False
    ignore_deletes: bool = False
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Options from a string map with any key case (Spark lower-cases them).

        ``startingVersion`` (a version or ``latest``), ``startingTimestamp`` (ISO 8601;
        naive times are UTC), ``maxFilesPerTrigger``, ``maxBytesPerTrigger`` (bytes, or
        with a unit: ``10m``, ``1g``), ``skipChangeCommits``, ``ignoreDeletes``,
        ``failOnDataLoss`` (default true). InvalidInputError for bad values.
        """
        lowered = {str(k).lower(): v for k, v in options.items()}

        def get(key: str) -> str | None:
            value = lowered.get(key.lower())
            return None if value is None or str(value).strip() == "" else str(value).strip()

        if get("ignoreChanges") is not None:
            raise InvalidInputError(
                "option ignoreChanges is not supported (it re-emits every row of rewritten files); "
                "use skipChangeCommits=true to skip commits that change existing rows"
            )
        starting = get("startingVersion")
        timestamp = get("startingTimestamp")
        if starting is not None and timestamp is not None:
            raise InvalidInputError("set either startingVersion or startingTimestamp, not both")
        latest = starting is not None and starting.lower() == "latest"
        version = None if starting is None or latest else _int_option("startingVersion", starting, 0)
        if timestamp is not None:
            timestamp_ms(timestamp)  # InvalidInputError now rather than at the first batch
        max_files = get("maxFilesPerTrigger")
        max_bytes = get("maxBytesPerTrigger")
        return cls(
            starting_version=version,
            starting_latest=latest,
            starting_timestamp=timestamp,
            max_files_per_trigger=_int_option("maxFilesPerTrigger", max_files, 1) if max_files else None,
            max_bytes_per_trigger=_byte_size("maxBytesPerTrigger", max_bytes) if max_bytes else None,
            skip_change_commits=_bool_option("skipChangeCommits", get("skipChangeCommits"), False),
            ignore_deletes=_bool_option("ignoreDeletes", get("ignoreDeletes"), False),
            fail_on_data_loss=_bool_option("failOnDataLoss", get("failOnDataLoss"), True),
        )

    def default_admission(self) -> Admission:
        """The per-batch limit: the options, or 1000 files when neither limit is set."""
        if self.max_files_per_trigger is None and self.max_bytes_per_trigger is None:
            return Admission(max_files=DEFAULT_MAX_FILES_PER_TRIGGER)
        return Admission(self.max_files_per_trigger, self.max_bytes_per_trigger)


def _int_option(key: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidInputError(f"option {key} must be an integer, got {value!r}") from None
    if number < minimum:
        raise InvalidInputError(f"option {key} must be at least {minimum}, got {number}")
    return number


def _bool_option(key: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise InvalidInputError(f"option {key} must be true or false, got {value!r}")
    return value.lower() == "true"


def _byte_size(key: str, value: str) -> int:
    text = value.lower().removesuffix("b") if value.lower() not in ("b",) else value
    unit = 1
    if text and text[-1] in _BYTE_UNITS:
        unit, text = _BYTE_UNITS[text[-1]], text[:-1]
    return _int_option(key, text.strip(), 1) * unit


class Budget:
    """What is left of one batch's admission while files are taken (Delta's
    ``AdmissionLimits``): a file is taken while there is room for it before it is taken;
    a commit taken whole (:meth:`take_whole`, the change data feed's commits with change
    data files or deletion vectors) only when all of it fits, or when it comes first."""

    def __init__(self, admission: Admission) -> None:
        self.files = admission.max_files
        self.bytes = admission.max_bytes
        self.taken = 0

    @property
    def open(self) -> bool:
        return (self.files is None or self.files > 0) and (self.bytes is None or self.bytes > 0)

    def take(self, files: Sequence[AddFile]) -> int:
        """How many of ``files`` (a prefix) the batch takes."""
        n = 0
        for f in files:
            if not self.open:
                break
            n += 1
            self._spend(1, max(f.size, 1))
        self.taken += n
        return n

    def take_whole(self, files: Sequence[AddFile]) -> bool:
        """Whether the batch takes all of ``files`` (one commit's): yes when nothing was
        taken before it, else when they fit in what is left. The budget is spent either way
        (as Delta's), so nothing after a refused commit is taken."""
        if not files:
            return True
        size = sum(max(f.size, 1) for f in files)
        fits = (self.files is None or self.files >= len(files)) and (self.bytes is None or self.bytes >= size)
        admit = self.taken == 0 or fits
        self._spend(len(files), size)
        if admit:
            self.taken += len(files)
        return admit

    def _spend(self, files: int, size: int) -> None:
        if self.files is not None:
            self.files -= files
        if self.bytes is not None:
            self.bytes -= size


# --------------------------------------------------------------------------- the source


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One data file a stream emits, at its position (``version``, ``index``)."""

    version: int
    index: int
    add: AddFile


class ChangeSource:
    """The changes one run of a streaming query reads from one table (see the module docstring).

    ``read_version``: the version whose metadata (schema, properties, protocol) the run
    reads with, normally the latest when the query resolved its schema (default: latest
    now). Metadata changes up to it are already reflected; a later one stops the run.
    The table handle stays the caller's to close.
    """

    def __init__(self, table: Table, options: SourceOptions, *, read_version: int | None = None) -> None:
        self.table = table
        self.options = options
        self.read_snapshot: Snapshot = table.snapshot(read_version)
        self._initial: SourceOffset | None = None
        self._until: int | None = None
        self._snapshot_files: tuple[int, tuple[AddFile, ...]] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def uri(self) -> str:
        return self.table.uri

    @property
    def table_id(self) -> str:
        return self.read_snapshot.table_id

    @property
    def read_version(self) -> int:
        return self.read_snapshot.version

    @property
    def schema(self) -> pa.Schema:
        """The schema every emitted row has (files without a column read it as null)."""
        return self.read_snapshot.schema

    def parse_offset(self, data: Mapping[str, Any] | str) -> SourceOffset:
        return SourceOffset.from_json(data, uri=self.uri, table_id=self.table_id)

    # ------------------------------------------------------------------ positions

    def initial_offset(self) -> SourceOffset:
        """Where this stream starts (computed once per run; see :class:`SourceOffset`)."""
        if self._initial is None:
            self._initial = self._compute_initial()
            log.info("stream over %s starts at %s", self.uri, self._initial)
        return self._initial

    def _compute_initial(self) -> SourceOffset:
        opts = self.options
        tid = self.table_id
        if opts.starting_latest:
            return SourceOffset(tid, self.table.latest_version() + 1)
        if opts.starting_version is not None:
            latest = self.table.latest_version()
            if opts.starting_version > latest:
                raise VersionNotFoundError(
                    f"{self.uri}: startingVersion {opts.starting_version} does not exist "
                    f"(latest is {latest})",
                    requested=opts.starting_version,
                    earliest=0,
                    latest=latest,
                )
            return SourceOffset(tid, opts.starting_version)
        if opts.starting_timestamp is not None:
            return SourceOffset(tid, self._first_version_at_or_after(opts.starting_timestamp))
        return SourceOffset(tid, self.read_version, 0, initial_snapshot=True)

    def _first_version_at_or_after(self, timestamp: str) -> int:
        """The first commit at or after ``timestamp`` (the next version to come if none)."""
        ts = timestamp_ms(timestamp)
        try:
            # Versions are dated strictly increasing (as time travel dates them): the first
            # at or after ``ts`` is the one after the last dated before it.
            return self.table.version_at(ts - 1) + 1
        except VersionNotFoundError:
            bounds = LogStore.commit_version_bounds(self.table.log.list_log())
            return bounds[0] if bounds else 0  # before the first commit: from the first one

    def prepare_available_now(self) -> int:
        """Fix the last version this run reads (``Trigger.AvailableNow``): the latest now."""
        self._until = self.table.latest_version()
        log.info("stream over %s reads up to version %d (availableNow)", self.uri, self._until)
        return self._until

    def latest_offset(self, start: SourceOffset, admission: Admission) -> SourceOffset:
        """The end of the next batch from ``start`` under ``admission`` (``start`` when there
        is nothing new). Raises the errors of the module docstring when ``start`` stands at a
        commit that cannot be streamed."""
        budget = Budget(admission)
        if start.initial_snapshot:
            snapshot = self._snapshot(start.version)
            taken = budget.take(snapshot[start.index :])
            if start.index + taken < len(snapshot):
                return dataclasses.replace(start, index=start.index + taken)
            return SourceOffset(start.table_id, start.version + 1)  # a batch ends with its snapshot
        latest = self._latest()
        version, index = start.version, start.index
        while version <= latest and budget.open:
            commit = self._commit(version, latest)
            if commit is None:  # lost and skipped (failOnDataLoss=false): resume after the gap
                version, index = self._skip_lost(version, latest), 0
                continue
            try:
                files = self._commit_files(commit)
            except (SourceMetadataChangedError, ChangeCommitError):
                if budget.taken == 0:
                    raise
                break  # emit what comes before first; the next batch starts at this commit
            rest = files[index:]
            taken = budget.take(rest)
            if taken < len(rest):
                return SourceOffset(start.table_id, version, index + taken)
            version, index = version + 1, 0
        return SourceOffset(start.table_id, version, index)

    def files_between(self, start: SourceOffset, end: SourceOffset) -> list[SourceFile]:
        """The files of the batch ``start`` → ``end`` (what :meth:`latest_offset` admitted)."""
        if start.initial_snapshot:
            return self._snapshot_slice(start, end)
        out: list[SourceFile] = []
        version = start.version
        while version < end.version or (version == end.version and end.index > 0):
            commit = self._commit(version, end.version)
            if commit is None:
                version = self._skip_lost(version, end.version)
                continue
            files = self._commit_files(commit)
            first = start.index if version == start.version else 0
            last = end.index if version == end.version else len(files)
            out.extend(SourceFile(version, i, files[i]) for i in range(first, min(last, len(files))))
            version += 1
        return out

    def _snapshot_slice(self, start: SourceOffset, end: SourceOffset) -> list[SourceFile]:
        # A batch from the snapshot ends within it or right after it (end = version + 1, 0).
        version = end.version if end.initial_snapshot else end.version - 1
        if version != start.version:
            if start.index != 0 or (not end.initial_snapshot and end.index != 0):
                raise self._bad_range(start, end)
            # The first batch was planned by an earlier run, whose snapshot was another
            # version than this run's initial offset: replay that run's snapshot.
            log.info("replaying the snapshot at version %d of %s (an earlier run's)", version, self.uri)
        files = self._snapshot(version)
        last = end.index if end.initial_snapshot else len(files)
        return [SourceFile(version, i, files[i]) for i in range(start.index, min(last, len(files)))]

    def _bad_range(self, start: SourceOffset, end: SourceOffset) -> InvalidOffsetError:
        return InvalidOffsetError(
            uri=self.uri, offset=end.to_json(), reason=f"it cannot follow {start.to_json()}"
        )

    # ------------------------------------------------------------------ the log

    def _latest(self) -> int:
        latest = self.table.latest_version()
        return latest if self._until is None else min(latest, self._until)

    def _snapshot(self, version: int) -> tuple[AddFile, ...]:
        """The snapshot's files in stream order: modification time, then path (oldest first)."""
        cached = self._snapshot_files
        if cached is not None and cached[0] == version:
            return cached[1]
        snap = self.read_snapshot if version == self.read_version else self._load_snapshot(version)
        if version > self.read_version:
            self._check_metadata(version, "snapshot", snap.metadata, snap.protocol)
        order = [("modificationTime", "ascending"), ("path", "ascending")]
        files = tuple(add_files(snap.live_files.sort_by(order)))  # sorted as columns
        self._snapshot_files = (version, files)
        return files

    def _load_snapshot(self, version: int) -> Snapshot:
        try:
            return self.table.snapshot(version)
        except VersionNotFoundError as exc:  # its commits were cleaned up, no checkpoint covers it
            raise DataLossError(
                uri=self.uri, kind="commits", first_version=0, last_version=exc.earliest - 1
            ) from exc

    def _commit(self, version: int, latest: int) -> Commit | None:
        """Commit ``version`` (known to exist up to ``latest``). When it was cleaned up:
        DataLossError, or None when ``failOnDataLoss`` is false (see :meth:`_skip_lost`)."""
        commit = self.table.commitlog.read_commit(version, required=False)
        if commit is None and self.options.fail_on_data_loss:
            last = self._first_listed_after(version, latest) - 1
            raise DataLossError(uri=self.uri, kind="commits", first_version=version, last_version=last)
        return commit

    def _first_listed_after(self, version: int, latest: int) -> int:
        listed = LogStore.commit_versions(self.table.log.list_log())
        return next((v for v in listed if v > version), latest + 1)

    def _skip_lost(self, version: int, latest: int) -> int:
        """The first version after the missing commits from ``version`` on; logs the loss."""
        resume = self._first_listed_after(version, latest)
        log.warning(
            "data loss in the stream over %s: commits %d..%d were removed before the stream read "
            "them; their rows are skipped (failOnDataLoss=false)",
            self.uri,
            version,
            resume - 1,
        )
        return resume

    def _commit_files(self, commit: Commit) -> list[AddFile]:
        """The files ``commit`` contributes to the stream; raises for commits it cannot stream."""
        changes_metadata = commit.metadata is not None or commit.protocol is not None
        if changes_metadata and commit.version > self.read_version:
            info = commit.commit_info
            operation = info.operation if info is not None else "UNKNOWN"
            self._check_metadata(commit.version, operation, commit.metadata, commit.protocol)
        adds = [a for a in commit.adds if a.data_change]
        removes = [r for r in commit.removes if r.data_change]
        if not removes:
            return adds
        info = commit.commit_info
        operation = info.operation if info is not None else "UNKNOWN"
        opts = self.options
        if opts.skip_change_commits or (opts.ignore_deletes and not adds):
            option = "skipChangeCommits" if opts.skip_change_commits else "ignoreDeletes"
            log.info(
                "stream over %s skips version %d (%s, removes %d files) by %s",
                self.uri, commit.version, operation, len(removes), option,
            )  # fmt: skip
            return []
        raise ChangeCommitError(
            uri=self.uri,
            version=commit.version,
            operation=operation,
            removed_files=len(removes),
            added_files=len(adds),
        )

    def _check_metadata(
        self, version: int, operation: str, metadata: Metadata | None, protocol: Protocol | None
    ) -> None:
        """SourceMetadataChangedError if ``metadata``/``protocol`` differ from the run's."""
        old_meta = self.read_snapshot.metadata
        old_proto = self.read_snapshot.protocol
        new_meta = metadata or old_meta
        new_proto = protocol or old_proto
        changed = []
        if _schema_differs(old_meta, new_meta):
            changed.append("schema")
        if dict(new_meta.configuration) != dict(old_meta.configuration):
            changed.append("properties")
        if new_proto != old_proto:
            changed.append("protocol")
        if not changed:
            return
        raise SourceMetadataChangedError(
            uri=self.uri,
            version=version,
            operation=operation,
            changed=changed,
            old_schema=old_meta.schema_string,
            new_schema=new_meta.schema_string,
            old_properties=dict(old_meta.configuration),
            new_properties=dict(new_meta.configuration),
            old_protocol=old_proto.to_json(),
            new_protocol=new_proto.to_json(),
            read_version=self.read_version,
        )

    # ------------------------------------------------------------------ reading rows

    def read(self, files: Sequence[SourceFile]) -> pa.Table:
        """The rows of ``files`` (deletion vectors applied) with :attr:`schema`, in order."""
        snap = self.read_snapshot
        parts = [
            rows
            for _, rows in read_source_files(
                self.table.log,
                files,
                snap.schema,
                snap.partition_columns,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
        ]
        return pa.concat_tables(parts) if parts else snap.schema.empty_table()


def _schema_differs(old: Metadata, new: Metadata) -> bool:
    """Whether the schema or partitioning differ (not just the JSON text of the schema)."""
    if old.partition_columns != new.partition_columns:
        return True
    # identity high-water marks move with every insert: not a schema change (nor in Delta)
    return old.schema_string != new.schema_string and bool(
        schema_without_marks(old.schema_string) != schema_without_marks(new.schema_string)
    )


def lost_file(uri: str, file: SourceFile, *, fail_on_data_loss: bool) -> None:
    """A data (or deletion-vector) file of ``file`` is gone: DataLossError, or (when
    ``fail_on_data_loss`` is false) a warning in the ``streaming.source`` log."""
    if fail_on_data_loss:
        raise DataLossError(
            uri=uri, kind="file", first_version=file.version, last_version=file.version, path=file.add.path
        )
    log.warning(
        "data loss in the stream over %s: data file %s added at version %d was removed (VACUUM) "
        "before the stream read it; its rows are skipped (failOnDataLoss=false)",
        uri,
        file.add.path,
        file.version,
    )


def read_source_files(
    store: LogStore,
    files: Sequence[SourceFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    *,
    fail_on_data_loss: bool,
) -> Iterator[tuple[SourceFile, pa.Table]]:
    """Each file's live rows with ``schema``, one file at a time; a missing file is
    :func:`lost_file`."""
    for f in files:
        try:
            rows = read_live_rows(store.fs, store.root, [f.add], schema, partition_columns)
        except FileNotFoundError:
            lost_file(store.uri, f, fail_on_data_loss=fail_on_data_loss)
            continue
        yield f, rows
