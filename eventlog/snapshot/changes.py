"""The change data feed, read (Delta's ``table_changes`` and ``CDCReader``): the row-level
changes of versions ``start..end``, each row with ``_change_type`` (``insert``,
``update_preimage``, ``update_postimage``, ``delete``), ``_commit_version`` and
``_commit_timestamp``.

Three steps, so that Spark can run the first two on the driver and the last in tasks:

1. :func:`resolve_range`: the versions asked for, by version or by timestamp (a start
   timestamp names the first version committed at or after it, an end timestamp the last
   one at or before it), checked against the table's latest version.
2. :func:`plan_changes`: per commit, which files say what changed, exactly as Delta's
   ``CDCReader.changesToDF``: a commit with ``cdc`` actions is read from its change data
   files only; any other commit's ``add`` and ``remove`` actions with ``dataChange=true``
   are its inserted and deleted rows, except that a file removed and added again in one
   commit (a new deletion vector) changes only the rows the vectors differ in, and a MERGE
   whose metrics say it inserted, updated and deleted nothing changes nothing. The feed
   must be on (``delta.enableChangeDataFeed``) at the start version and stay on:
   :class:`~eventlog.errors.ChangeDataNotRecordedError` otherwise. And every schema
   committed after the start version must be read compatible with the end version's (the
   schema the rows are returned in), as Delta's batch read checks (``CDCReader``, schema
   mode ``endVersion``): no column renamed or dropped under column mapping, no change of
   the partition columns or of the mapping mode, no column missing, retyped or made NOT
   NULL; and so must the start version's.
   :class:`~eventlog.errors.ChangeDataSchemaChangeError` names the version of the change;
   a range that starts at or after it, or ends before it, reads fine.
3. :func:`read_changes`: the rows (:mod:`eventlog.files.change_rows`) in the schema of the
   end version, with the commit timestamps, a SQL filter and a projection applied.

Commit timestamps are Delta's: the commit's ``inCommitTimestamp`` when its commitInfo has one,
else its file's modification time, made strictly increasing over the versions before it
(Delta's ``monotonizeCommitTimestamps``, from up to 100 versions before the range).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

import fsspec
import numpy as np
import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import (
    ChangeDataNotRecordedError,
    ChangeDataSchemaChangeError,
    CorruptLogError,
    InvalidChangeRangeError,
    InvalidInputError,
    UnknownColumnError,
    VersionNotFoundError,
)
from eventlog.files import column_mapping as cm
from eventlog.files.change_data import cdf_enabled
from eventlog.files.change_rows import (
    COMMIT_VERSION,
    ChangeFile,
    change_columns,
    read_change_rows,
)
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import AddCDCFile, AddFile, CommitInfo, Metadata, RemoveFile
from eventlog.log.commit import Commit
from eventlog.log.commitlog import CommitLog
from eventlog.log.in_commit_timestamps import in_commit_timestamp
from eventlog.log.storage import LogStore
from eventlog.snapshot.loader import load_snapshot
from eventlog.snapshot.timeline import timestamp_ms
from eventlog.userinput import check_string_list

__all__ = [
    "ChangePlan",
    "commit_timestamps",
    "output_schema",
    "plan_changes",
    "read_changes",
    "resolve_range",
]

UNMONOTONIZED = 100  # Delta's DeltaHistoryManager.POTENTIALLY_UNMONOTONIZED_TIMESTAMPS
_MERGE_ROW_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")

Timestamp = dt.datetime | str | int


@dataclasses.dataclass(frozen=True)
class ChangePlan:
    """What a change data feed read of versions ``start..end`` reads: ``files`` (in commit
    order), ``timestamps`` (version -> commit time, epoch ms) and the end version's
    ``metadata`` (the schema the rows are returned in). ``files`` is empty, and ``end`` is
    ``start - 1``, when two timestamps fall between the same two commits."""

    start: int
    end: int
    metadata: Metadata
    files: tuple[ChangeFile, ...]
    timestamps: Mapping[int, int]

    @property
    def schema(self) -> pa.Schema:
        """The end version's table schema (column mapping metadata included)."""
        return cm.with_mode(from_spark_schema_json(self.metadata.schema_string), self.metadata.configuration)

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.metadata.partition_columns


# --------------------------------------------------------------------------- timestamps


def _commit_mtimes(log: LogStore, first: int, last: int) -> dict[int, int]:
    """Modification times of the commit files ``first..last`` that exist (one listing)."""
    return {v: t for v, t in log.commit_mtimes_ms().items() if first <= v <= last}


def commit_timestamps(commitlog: CommitLog, commits: Sequence[Commit]) -> dict[int, int]:
    """Commit time (epoch ms) of each of ``commits`` (consecutive versions), as Delta's change
    data feed dates them (see the module docstring)."""
    out = {c.version: ts for c in commits if (ts := in_commit_timestamp(c.commit_info)) is not None}
    undated = [c.version for c in commits if c.version not in out]
    if not undated:
        return out
    mtimes = _commit_mtimes(commitlog.log, max(undated[0] - UNMONOTONIZED, 0), undated[-1])
    wanted = set(undated)
    previous: int | None = None
    for version in sorted(mtimes):
        ts = mtimes[version]
        if previous is not None and ts <= previous:
            ts = previous + 1  # Delta's monotonizeCommitTimestamps
        previous = ts
        if version in wanted:
            out[version] = ts
    return out


# --------------------------------------------------------------------------- the range


def _dated_versions(commitlog: CommitLog, latest: int) -> list[tuple[int, int]]:
    """(version, commit time) of every version still in the log, ascending."""
    commits = [c for v in range(latest + 1) if (c := commitlog.read_commit(v, required=False)) is not None]
    times = commit_timestamps(commitlog, commits)
    return sorted(times.items())


def resolve_range(
    commitlog: CommitLog,
    latest: int,
    start_version: int | None = None,
    end_version: int | None = None,
    *,
    start_timestamp: Timestamp | None = None,
    end_timestamp: Timestamp | None = None,
) -> tuple[int, int]:
    """(start, end) versions of a change data feed read of a table whose latest version is
    ``latest``; ``end`` is ``start - 1`` when both timestamps fall between two commits (an
    empty read, as Delta). Exactly one of ``start_version``/``start_timestamp``; at most one
    of ``end_version``/``end_timestamp`` (default: latest). InvalidChangeRangeError for an
    end before the start or a start after ``latest``; VersionNotFoundError for a timestamp
    after the latest commit or (end) before the first."""
    if (start_version is None) == (start_timestamp is None):
        raise InvalidInputError(
            "a change data feed read needs exactly one of start_version and start_timestamp"
        )
    if end_version is not None and end_timestamp is not None:
        raise InvalidInputError("pass at most one of end_version and end_timestamp")
    for name, value in (("start_version", start_version), ("end_version", end_version)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidInputError(f"{name} must be a version number (an int >= 0), not {value!r}")
    by_time = start_timestamp is not None or end_timestamp is not None
    dated = _dated_versions(commitlog, latest) if by_time else []
    if start_version is not None:
        start = start_version
    else:
        assert start_timestamp is not None
        start = _version_from(commitlog, dated, start_timestamp)
    if start > latest:
        raise InvalidChangeRangeError(
            start=start, end=end_version, latest=latest, reason="start after latest"
        )
    end = latest if end_version is None else min(end_version, latest)
    if end_timestamp is not None:
        end = _version_until(commitlog, dated, end_timestamp, latest)
        if start_timestamp is not None:
            if timestamp_ms(start_timestamp) > timestamp_ms(end_timestamp):
                raise InvalidChangeRangeError(start=start, end=end, latest=latest, reason="end before start")
            if end == start - 1:
                return start, end  # both between the same two commits: nothing changed
    elif end_version is not None and end_version < start:
        raise InvalidChangeRangeError(start=start, end=end_version, latest=latest, reason="end before start")
    if end < start:
        raise InvalidChangeRangeError(start=start, end=end, latest=latest, reason="end before start")
    return start, end


def _version_from(commitlog: CommitLog, dated: list[tuple[int, int]], value: Timestamp) -> int:
    """The first version committed at or after ``value``."""
    ts = timestamp_ms(value)
    for version, when in dated:
        if when >= ts:
            return version
    latest = dated[-1][0] if dated else -1
    raise VersionNotFoundError(
        f"{commitlog.uri}: timestamp {value!r} is after the table's latest version ({latest}); "
        "use a timestamp at or before its commit time",
        requested=value,
        earliest=dated[0][0] if dated else 0,
        latest=latest,
    )


def _version_until(commitlog: CommitLog, dated: list[tuple[int, int]], value: Timestamp, latest: int) -> int:
    """The last version committed at or before ``value`` (not after the latest commit)."""
    ts = timestamp_ms(value)
    found = [version for version, when in dated if when <= ts]
    if not found or (found[-1] == latest and dated[-1][1] < ts):
        where = "before the earliest" if not found else "after the latest"
        raise VersionNotFoundError(
            f"{commitlog.uri}: timestamp {value!r} is {where} version available for change data",
            requested=value,
            earliest=dated[0][0] if dated else 0,
            latest=latest,
        )
    return found[-1]


# --------------------------------------------------------------------------- planning


def _skips_file_actions(info: CommitInfo | None) -> bool:
    """A MERGE known to have changed no row (Delta's ``shouldSkipFileActionsInCommit``)."""
    if info is None or info.operation != "MERGE":
        return False
    return all(info.operation_metrics.get(m) == "0" for m in _MERGE_ROW_METRICS)


def _removed_file(remove: RemoveFile, commitlog: CommitLog, version: int, partitioned: bool) -> AddFile:
    """A removed data file as a file to read: its path, partition values, deletion vector."""
    if remove.partition_values is None and partitioned:
        raise CorruptLogError(
            f"remove of {remove.path} has no partitionValues (no extended file metadata): its rows "
            "cannot be read as change data (Delta's DELTA_REMOVE_FILE_CDC_MISSING_EXTENDED_METADATA)",
            uri=commitlog.uri,
            version=version,
        )
    return AddFile(
        path=remove.path,
        partition_values=remove.partition_values or {},
        size=remove.size or 0,
        modification_time=0,
        stats=remove.stats,
        deletion_vector=remove.deletion_vector,
    )


def _commit_files(commit: Commit, commitlog: CommitLog, partitioned: bool) -> list[ChangeFile]:
    v = commit.version
    cdc = [a for a in commit.others if isinstance(a, AddCDCFile)]
    if cdc:
        return [ChangeFile(v, "cdc", AddFile(a.path, a.partition_values, a.size, 0, False)) for a in cdc]
    if _skips_file_actions(commit.commit_info):
        return []
    adds = {a.path: a for a in commit.adds if a.data_change}
    removes = {r.path: r for r in commit.removes if r.data_change}
    out = []
    for path, remove in removes.items():
        if path in adds:  # the same file with another deletion vector: the difference only
            out.append(ChangeFile(v, "dv", adds[path], remove.deletion_vector))
        else:
            out.append(ChangeFile(v, "delete", _removed_file(remove, commitlog, v, partitioned)))
    out.extend(ChangeFile(v, "insert", add) for path, add in adds.items() if path not in removes)
    return out


def plan_changes(
    commitlog: CommitLog, start: int, end: int, latest_metadata: Metadata, *, check_schema: bool = True
) -> ChangePlan:
    """The files and timestamps of a change data feed read of versions ``start..end`` (see the
    module docstring); ``latest_metadata`` is the schema of an empty read (``end < start``).
    ChangeDataNotRecordedError when the feed is off at ``start`` or turned off by then;
    ChangeDataSchemaChangeError (unless not ``check_schema``: a stream, which Delta does not
    check so) when a schema committed after ``start`` is not read compatible with ``end``'s."""
    if end < start:
        return ChangePlan(start, end, latest_metadata, (), {})
    commits = commitlog.commits_between(start, end)
    metadata = commits[0].metadata
    if metadata is None:
        metadata = load_snapshot(commitlog, start).metadata
    refusal = _schema_refusal(commits, start, end, metadata) if check_schema else None
    files: list[ChangeFile] = []
    for commit in commits:
        changed = commit.metadata
        if changed is not None:
            metadata = changed
        if not cdf_enabled(metadata.configuration):
            raise ChangeDataNotRecordedError(version=commit.version, start=start, end=end)
        if refusal is not None and refusal[0] == commit.version:
            raise refusal[1]  # where Delta's read meets it, so that the errors come in its order
        files.extend(_commit_files(commit, commitlog, bool(metadata.partition_columns)))
    if refusal is not None:
        raise refusal[1]
    return ChangePlan(start, end, metadata, tuple(files), commit_timestamps(commitlog, commits))


# --------------------------------------------------------------------------- schema changes


def _schema_refusal(
    commits: Sequence[Commit], start: int, end: int, first: Metadata
) -> tuple[int, ChangeDataSchemaChangeError] | None:
    """The error a read of ``commits`` (``start..end``; ``first``: the metadata at ``start``)
    raises for a schema the end version's cannot read, and the version to raise it at (after
    the last commit: -1); None when every schema reads as the end's.

    As Delta: the first later version whose schema is incompatible (``"schema change"``),
    else the start version's schema (``"data schema"``). The version named is the change
    that makes the read incompatible: the first schema after the last incompatible one, the
    version a read can start at."""
    read = next((c.metadata for c in reversed(commits) if c.metadata is not None), first)
    read_schema = from_spark_schema_json(read.schema_string)
    bad = [
        c.version
        for c in commits
        if c.version > start
        and c.metadata is not None
        and not _read_compatible(c.metadata, read, read_schema)
    ]
    if not bad and _read_compatible(first, read, read_schema):
        return None
    last = bad[-1] if bad else start
    change = next((c.version for c in commits if c.version > last and c.metadata is not None), last)
    reason = "schema change" if bad else "data schema"
    error = ChangeDataSchemaChangeError(start=start, end=end, version=change, read_version=end, reason=reason)
    return (bad[0] if bad else -1), error


def _read_compatible(old: Metadata, read: Metadata, read_schema: pa.Schema) -> bool:
    """Whether data written with ``old`` can be read in the schema of ``read`` (a later
    version): Delta's ``hasNoColumnMappingSchemaChanges(read, old)`` and
    ``SchemaUtils.isReadCompatible(old, read, forbidTightenNullability = true)``."""
    old_schema = from_spark_schema_json(old.schema_string)
    return _no_mapping_change(old, read, old_schema, read_schema) and _struct_compatible(
        list(old_schema), list(read_schema)
    )


def _no_mapping_change(old: Metadata, read: Metadata, old_schema: pa.Schema, read_schema: pa.Schema) -> bool:
    """No column renamed or dropped (same physical path, other name; a physical path gone),
    the same partition columns, no mapping turned off. Without mapping at ``old``, its
    columns' physical names are their names (what enabling mapping on a table assigns)."""
    old_mode, read_mode = cm.mode_of(old.configuration), cm.mode_of(read.configuration)
    if read_mode == "none":
        return old_mode == "none"
    read_paths = _physical_paths(list(read_schema), ())
    for path, name in _physical_paths(list(old_schema), ()).items():
        if read_paths.get(path, None) != name:  # dropped (None) or renamed
            return False
    return list(old.partition_columns) == list(read.partition_columns)


def _physical_paths(fields: list[pa.Field], parent: tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """Each field at any depth (inside structs, lists and maps) by its physical path, to its name."""
    out: dict[tuple[str, ...], str] = {}
    for f in fields:
        path = (*parent, cm.physical_name(f))
        out[path] = f.name
        out.update(_physical_paths(cm._children(f.type), path))
    return out


def _struct_compatible(old: list[pa.Field], read: list[pa.Field]) -> bool:
    """Every old field still there (names matched without case, then exactly), with a
    compatible type, and not nullable before but NOT NULL now; new fields are fine."""
    before = {f.name.lower(): f for f in old}
    if not set(before) <= {f.name.lower() for f in read}:
        return False
    for f in read:
        was = before.get(f.name.lower())
        if was is None:
            continue
        if was.name != f.name or (was.nullable and not f.nullable) or not _type_compatible(was.type, f.type):
            return False
    return True


def _type_compatible(old: pa.DataType, read: pa.DataType) -> bool:
    if pa.types.is_struct(old) and pa.types.is_struct(read):
        return _struct_compatible(cm._children(old), cm._children(read))
    if (pa.types.is_list(old) and pa.types.is_list(read)) or (pa.types.is_map(old) and pa.types.is_map(read)):
        # an array's elements, a map's keys and values: the same rules, nullability included
        return _struct_compatible(cm._children(old), cm._children(read))
    return bool(old.equals(read))


# --------------------------------------------------------------------------- reading


def output_schema(plan: ChangePlan) -> pa.Schema:
    """The columns a read of ``plan`` returns: the table's (logical names) and the change columns."""
    return pa.schema([*cm.strip(plan.schema), *change_columns()])


def read_changes(
    fs: fsspec.AbstractFileSystem,
    root: str,
    plan: ChangePlan,
    *,
    columns: Sequence[str] | None = None,
    filter: str | None = None,
) -> pa.Table:
    """The changed rows of ``plan`` where the SQL predicate ``filter`` (on table and change
    columns) holds, with ``columns`` (default all: the table's, then ``_change_type``,
    ``_commit_version``, ``_commit_timestamp``)."""
    out_schema = output_schema(plan)
    if columns is not None:
        columns = check_string_list(columns, "column")
        for col in columns:
            if col not in out_schema.names:
                raise UnknownColumnError(col, list(out_schema.names), "columns")
    pred = ex.parse_predicate(filter, out_schema, context="filter") if filter is not None else None
    schema = plan.schema
    wanted = set(out_schema.names if columns is None else columns)
    if pred is not None:
        wanted |= {c.name.split(".")[0] for c in ex.referenced_columns(pred)}
    table_columns = [c for c in schema.names if c in wanted]
    rows = read_change_rows(fs, root, plan.files, schema, plan.partition_columns, columns=table_columns)
    rows = cm.to_logical(rows, cm.strip(rows.schema)) if cm.is_mapped(schema) else rows
    rows = rows.append_column(change_columns()[2], _timestamps(plan, rows.column(COMMIT_VERSION)))
    if pred is not None:
        rows = rows.filter(ex.evaluate_mask(pred, rows))
    return rows.select(list(columns) if columns is not None else out_schema.names)


def _timestamps(plan: ChangePlan, versions: pa.ChunkedArray) -> pa.Array:
    """Each row's commit time, from its commit version."""
    by_offset = np.zeros(max(plan.end - plan.start + 1, 0), dtype=np.int64)
    for version, ms in plan.timestamps.items():
        by_offset[version - plan.start] = ms * 1000
    offsets = versions.to_numpy() - plan.start
    return pa.array(by_offset[offsets], pa.timestamp("us", tz="UTC"))
