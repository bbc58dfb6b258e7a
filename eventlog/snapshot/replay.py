"""Replay and diff for audits: how the table got here, and what changed between versions.

:func:`replay` rebuilds the projection from events alone: from version 0 when the log
still holds it, else from the oldest readable checkpoint (it says which). For every
version it yields a :class:`VersionChange`: the files added and removed, the rows added and
removed (from the add/remove statistics, and exactly for deletion-vector updates from the
vectors' cardinalities), the operation and its parameters, who and when (commitInfo: engine,
user metadata, streaming query and batch, group-commit members), and the read version and
isolation level.

It also checks that the fold equals the live snapshot at every version it passes. The live
snapshot of version ``v`` is what :func:`eventlog.snapshot.loader.load_snapshot` builds: the
newest checkpoint at or before ``v`` plus the commits after it. Between two checkpoints both
are the same fold of the same commits, so they can only part where a checkpoint stands in
for the commits before it; :func:`replay` therefore compares its fold with every checkpoint
it passes, and raises :class:`~eventlog.errors.ReplayMismatchError` naming the first
version where they differ.

:func:`diff` compares two versions' live files. It needs only the log (and deletion-vector
files for exact positions); with ``rows=True`` it also reads the rows, and nets out rows
that were only rewritten (OPTIMIZE), so what remains is exactly what was added and removed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import CorruptLogError, ReplayMismatchError, VersionNotFoundError
from eventlog.files.scan import file_deletes, read_live_rows
from eventlog.log.actions import AddFile, RemoveFile
from eventlog.log.checkpoint import read_checkpoint
from eventlog.log.commit import Commit, member_txn_ids
from eventlog.log.commitlog import CommitLog
from eventlog.log.filetable import add_files, file_keys
from eventlog.log.storage import LogStore
from eventlog.snapshot.loader import load_snapshot
from eventlog.snapshot.projection import Snapshot

__all__ = ["Replay", "TableDiff", "VersionChange", "diff", "replay"]

logger = logging.getLogger(__name__)

STREAMING_FIELD = "eventlog.streaming"  # commitInfo field written by the streaming sink


@dataclasses.dataclass(frozen=True)
class VersionChange:
    """What one version changed, and who changed it (see the module docstring)."""

    version: int
    timestamp: int | None
    operation: str | None
    parameters: Mapping[str, str]
    read_version: int | None
    isolation_level: str | None
    engine: str | None
    user_metadata: str | None
    txn_ids: tuple[str, ...]  # the transactions it carries: one, or a group commit's members
    streaming: Mapping[str, Any] | None  # query id, run id and batch id of a streaming sink
    files_added: tuple[str, ...]
    files_removed: tuple[str, ...]
    rows_added: int | None  # None when an added file has no statistics
    rows_removed: int | None  # None when a removed file has no statistics
    rows_deleted_by_dv: int  # rows newly marked deleted by deletion vectors (in rows_removed)
    data_change: bool  # False for OPTIMIZE and other rewrites that keep the rows
    metadata_changed: bool
    protocol_changed: bool


@dataclasses.dataclass(frozen=True)
class TableDiff:
    """Files (and rows) added and removed between ``from_version`` and ``to_version``."""

    from_version: int
    to_version: int
    files_added: tuple[str, ...]
    files_removed: tuple[str, ...]
    dv_changed: Mapping[str, tuple[int, int]]  # path: (deleted rows before, after)
    rows_added: int | None
    rows_removed: int | None
    added: pa.Table | None = None  # with rows=True: the rows only the later version has
    removed: pa.Table | None = None  # with rows=True: the rows only the earlier version has


class Replay:
    """An iteration over :class:`VersionChange` values, with where it started.

    ``start_version`` is the first version replayed; ``from_checkpoint`` the checkpoint
    the fold started from (None when it started at version 0, from events alone).
    """

    def __init__(self, commitlog: CommitLog, to_version: int | None) -> None:
        self._commitlog = commitlog
        names = commitlog.log.list_log()
        versions = LogStore.commit_versions(names)
        latest = max(versions[-1] if versions else -1, commitlog.latest_version())
        if latest < 0:
            raise CorruptLogError(
                f"{commitlog.uri}: the log holds no commit", uri=commitlog.uri, version=None
            )
        self.to_version = latest if to_version is None else to_version
        if not 0 <= self.to_version <= latest:
            raise VersionNotFoundError(
                f"{commitlog.uri}: cannot replay to version {self.to_version}; the latest is {latest}",
                requested=self.to_version,
                earliest=versions[0] if versions else 0,
                latest=latest,
            )
        self._checkpoints = sorted(_checkpoint_versions(names))
        self.from_checkpoint: int | None = None
        self._base: Snapshot | None = None
        if not versions or versions[0] != 0:
            oldest = next((c for c in self._checkpoints if c <= self.to_version), None)
            if oldest is None:
                raise VersionNotFoundError(
                    f"{commitlog.uri}: commits before version {versions[0] if versions else '?'} were "
                    "cleaned up and no checkpoint covers them",
                    requested=0,
                    earliest=versions[0] if versions else 0,
                    latest=latest,
                )
            self.from_checkpoint = oldest
            self._base = _checkpoint_snapshot(commitlog, oldest)
            logger.info("replay of %s starts from checkpoint %d", commitlog.uri, oldest)
        self.start_version = 0 if self._base is None else self._base.version + 1
        self.final: Snapshot | None = None  # the fold at ``to_version``, once iterated

    def __iter__(self) -> Iterator[VersionChange]:
        commitlog = self._commitlog
        fold = self._base
        checkpoints = set(self._checkpoints)
        for version in range(self.start_version, self.to_version + 1):
            (commit,) = commitlog.commits_between(version, version)
            before = fold
            fold = Snapshot.from_commits(commitlog.uri, [commit]) if fold is None else fold.advance([commit])
            yield _change(commitlog, before, fold, commit)
            if version in checkpoints:
                _check_against(commitlog, fold, _checkpoint_snapshot(commitlog, version))
        if fold is not None:
            _check_against(commitlog, fold, load_snapshot(commitlog, self.to_version))
        self.final = fold

    def run(self) -> list[VersionChange]:
        """Replay to the end and return every change (checks included)."""
        return list(self)


def replay(commitlog: CommitLog, to_version: int | None = None) -> Replay:
    """See the module docstring; iterate the result to replay."""
    return Replay(commitlog, to_version)


# --------------------------------------------------------------------------- one version


def _change(commitlog: CommitLog, before: Snapshot | None, after: Snapshot, commit: Commit) -> VersionChange:
    info = commit.commit_info
    adds = commit.adds
    removes = commit.removes
    removed_paths = {r.path: r for r in removes}
    rows_added: int | None = 0
    rows_removed: int | None = 0
    dv_deleted = 0
    for add in adds:
        old = removed_paths.get(add.path)
        if old is not None and _records(old) is not None:
            # A deletion-vector update: the same file, more rows deleted.
            newly = _dv_card(add) - _dv_card(old)
            dv_deleted += max(newly, 0)
            continue
        rows_added = _plus(rows_added, _live(add))
    added_paths = {a.path for a in adds}
    for rm in removes:
        if rm.path in added_paths and _records(rm) is not None:
            continue  # counted above as a DV update
        rows_removed = _plus(rows_removed, _live(rm))
    if rows_removed is not None:
        rows_removed += dv_deleted
    data_change = any(a.data_change for a in adds) or any(r.data_change for r in removes)
    return VersionChange(
        version=commit.version,
        timestamp=info.timestamp if info else None,
        operation=info.operation if info else None,
        parameters=dict(info.operation_parameters) if info else {},
        read_version=info.read_version if info else None,
        isolation_level=info.isolation_level if info else None,
        engine=info.engine_info if info else None,
        user_metadata=info.user_metadata if info else None,
        txn_ids=tuple(member_txn_ids(info)),
        streaming=info.extra.get(STREAMING_FIELD) if info else None,
        files_added=tuple(a.path for a in adds),
        files_removed=tuple(r.path for r in removes),
        rows_added=rows_added,
        rows_removed=rows_removed,
        rows_deleted_by_dv=dv_deleted,
        data_change=data_change,
        metadata_changed=before is None or before.metadata != after.metadata,
        protocol_changed=before is None or before.protocol != after.protocol,
    )


def _records(action: AddFile | RemoveFile) -> int | None:
    """``numRecords`` of the file's statistics (removes carry them too), or None."""
    if not action.stats:
        return None
    n = orjson.loads(action.stats).get("numRecords")
    return int(n) if n is not None else None


def _dv_card(action: AddFile | RemoveFile) -> int:
    return action.deletion_vector.cardinality if action.deletion_vector is not None else 0


def _live(action: AddFile | RemoveFile) -> int | None:
    records = _records(action)
    return None if records is None else records - _dv_card(action)


def _plus(total: int | None, value: int | None) -> int | None:
    return None if total is None or value is None else total + value


# --------------------------------------------------------------------------- checks


def _checkpoint_versions(names: list[str]) -> set[int]:
    out: set[int] = set()
    for name in names:
        if ".checkpoint" in name and name[:20].isdigit():
            out.add(int(name[:20]))
    return out


def _checkpoint_snapshot(commitlog: CommitLog, version: int) -> Snapshot:
    log = commitlog.log
    state = read_checkpoint(log.fs, log.log_dir, version)
    return Snapshot.from_state(
        commitlog.uri, version, state.protocol, state.metadata, state.add_table, state.remove_table,
        state.txns, state.domains,
    )  # fmt: skip


def _check_against(commitlog: CommitLog, fold: Snapshot, live: Snapshot) -> None:
    version = fold.version
    problems: list[str] = []
    if fold.protocol != live.protocol:
        problems.append("protocol")
    if fold.metadata != live.metadata:
        problems.append("metadata")
    if {k: t.version for k, t in fold.txns.items()} != {k: t.version for k, t in live.txns.items()}:
        problems.append("app transactions")
    ours, theirs = _keys(fold.live_files), _keys(live.live_files)
    extra = ours.filter(pc.invert(pc.is_in(ours, value_set=theirs)))
    missing = theirs.filter(pc.invert(pc.is_in(theirs, value_set=ours)))
    if len(extra) or len(missing) or len(ours) != len(theirs):
        only_events, only_snapshot = _first_paths(extra), _first_paths(missing)
        problems.append(
            f"live files (only in the events: {only_events}; only in the snapshot: {only_snapshot})"
        )
    if problems:
        raise ReplayMismatchError(
            f"{commitlog.uri}: replaying the events to version {version} does not give the table's "
            f"snapshot there: {', '.join(problems)} differ",
            uri=commitlog.uri,
            version=version,
            differences=problems,
        )


def _keys(files: pa.Table) -> pa.Array:
    keys = file_keys(files)
    return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys


def _first_paths(keys: pa.Array) -> list[str]:
    return sorted(k.partition("\x00")[0] for k in keys.to_pylist())[:3]


# --------------------------------------------------------------------------- diff


def diff(
    fs: fsspec.AbstractFileSystem,
    root: str,
    old: Snapshot,
    new: Snapshot,
    *,
    rows: bool = False,
) -> TableDiff:
    """What ``new`` has that ``old`` has not, and the reverse (see the module docstring)."""
    # On columns: only the files that differ between the versions become values.
    old_live, new_live = old.live_files, new.live_files
    old_only = old_live.filter(pc.invert(pc.is_in(_keys(old_live), value_set=_keys(new_live))))
    new_only = new_live.filter(pc.invert(pc.is_in(_keys(new_live), value_set=_keys(old_live))))
    old_paths = {a.path: a for a in add_files(old_only)}
    new_paths = {a.path: a for a in add_files(new_only)}
    dv_changed = {
        p: (_dv_card(old_paths[p]), _dv_card(new_paths[p])) for p in old_paths.keys() & new_paths.keys()
    }
    added = sorted(new_paths.keys() - old_paths.keys())
    removed = sorted(old_paths.keys() - new_paths.keys())
    rows_added: int | None = 0
    rows_removed: int | None = 0
    for p in added:
        rows_added = _plus(rows_added, _live(new_paths[p]))
    for p in removed:
        rows_removed = _plus(rows_removed, _live(old_paths[p]))
    for before, after in dv_changed.values():
        if after >= before and rows_removed is not None:
            rows_removed += after - before
        elif rows_added is not None:
            rows_added += before - after  # a restore can undelete rows
    result = TableDiff(
        old.version, new.version, tuple(added), tuple(removed), dv_changed, rows_added, rows_removed
    )
    if not rows:
        return result
    gained, lost = _changed_rows(fs, root, old, new, added, removed, dv_changed, old_paths, new_paths)
    return dataclasses.replace(
        result, added=gained, removed=lost, rows_added=gained.num_rows, rows_removed=lost.num_rows
    )


def _changed_rows(
    fs: fsspec.AbstractFileSystem,
    root: str,
    old: Snapshot,
    new: Snapshot,
    added: list[str],
    removed: list[str],
    dv_changed: Mapping[str, tuple[int, int]],
    old_paths: Mapping[str, AddFile],
    new_paths: Mapping[str, AddFile],
) -> tuple[pa.Table, pa.Table]:
    """Rows only ``new`` has and rows only ``old`` has, rewritten rows netted out."""
    schema = new.schema
    gained = [read_live_rows(fs, root, [new_paths[p] for p in added], schema, new.partition_columns)]
    lost = [
        _conform(read_live_rows(fs, root, [old_paths[p] for p in removed], old.schema, old.partition_columns),
                 schema)
    ]  # fmt: skip
    for path in dv_changed:
        before, after = old_paths[path], new_paths[path]
        was, now = file_deletes(fs, root, before), file_deletes(fs, root, after)
        every = read_live_rows(fs, root, [dataclasses.replace(after, deletion_vector=None)], schema,
                               new.partition_columns)  # fmt: skip
        if now - was:
            lost.append(every.take(pa.array(sorted(now - was), pa.int64())))
        if was - now:
            gained.append(every.take(pa.array(sorted(was - now), pa.int64())))
    return _net(pa.concat_tables(gained), pa.concat_tables(lost))


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of an older schema in the newer one (added columns are null)."""
    cols = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(cols, schema=schema)


_COUNT = "__eventlog_count"


def _net(gained: pa.Table, lost: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Multiset difference: a row both gained and lost (rewritten) is neither."""
    if gained.num_rows == 0 or lost.num_rows == 0:
        return gained, lost
    keys = gained.column_names
    if any(pa.types.is_nested(f.type) for f in gained.schema):
        return gained, lost  # nested columns cannot be grouped: report both sides as read
    tagged = pa.concat_tables(
        [
            gained.append_column(_COUNT, pa.array([1] * gained.num_rows, pa.int64())),
            lost.append_column(_COUNT, pa.array([-1] * lost.num_rows, pa.int64())),
        ]
    )
    net = tagged.group_by(keys, use_threads=False).aggregate([(_COUNT, "sum")])
    counts = net.column(f"{_COUNT}_sum")
    plus = net.filter(pc.greater(counts, 0))
    minus = net.filter(pc.less(counts, 0))
    return _repeat(plus, keys), _repeat(minus, keys)


def _repeat(net: pa.Table, keys: list[str]) -> pa.Table:
    counts = pc.abs(net.column(f"{_COUNT}_sum")).to_pylist()
    index = [i for i, n in enumerate(counts) for _ in range(n)]
    return net.select(keys).take(pa.array(index, pa.int64()))
