"""Snapshots: the projection of the event log at a version.

A snapshot at version ``v`` is the fold of commits ``0..v`` (or of a checkpoint at ``c``
and commits ``c+1..v``): live files keyed by ``(path, deletion-vector id)``, metadata,
protocol, app-transaction versions and domain metadata. A :class:`Snapshot` is an
immutable value; :meth:`Snapshot.advance` folds further commits into a *new* snapshot.
Replay checks that versions are contiguous and fails with :class:`CorruptLogError` on a
gap.

The file state is columnar: :attr:`Snapshot.live_files` is an Arrow table in the layout
of a checkpoint's ``add`` rows (:data:`eventlog.log.filetable.ADD_SCHEMA`), and
:attr:`Snapshot.tombstone_files` the ``remove`` rows, folded by
:func:`eventlog.snapshot.reconcile.fold_files`. ``AddFile`` values are made only on
demand (:attr:`Snapshot.files`, :attr:`Snapshot.add_files`), for callers that walk a few
files; everything that walks all of them works on the columns.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import CorruptLogError
from eventlog.files.column_mapping import with_mode
from eventlog.files.pruning import FileIndex
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import (
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from eventlog.log.bulk import CommitHeader
from eventlog.log.commit import Commit
from eventlog.log.filetable import (
    ADD_SCHEMA,
    REMOVE_SCHEMA,
    FileActions,
    add_files,
    adds_table,
    conform,
    remove_files,
    removes_table,
)
from eventlog.log.in_commit_timestamps import commit_time
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.snapshot.reconcile import fold_files

FileKey = tuple[str, str | None]
Events = Commit | CommitHeader  # a commit, or (when its file actions travel as columns) its other actions


# Advancing a snapshot records the new commits on top of its parent (O(new commits));
# the file state is folded on first use. Every this many commits a fold is forced, which
# bounds the chain a first use walks and the commits a chain keeps alive.
_MAX_LAZY_DEPTH = 256


class Snapshot:
    """The table state at ``version`` (an immutable value).

    ``protocol``, ``metadata``, ``txns`` and ``domains`` are folded eagerly; the file state
    (``live_files``, ``tombstone_files``) and ``commit_timestamps`` lazily, on first access,
    from the nearest folded ancestor plus the commits since (so a stream of small commits
    does not fold the file state each time).
    """

    __slots__ = (
        "__dict__",
        "_depth",
        "_live",
        "_lock",
        "_parent",
        "_pending",
        "_pending_timestamps",
        "_timestamps",
        "_tombstones",
        "domains",
        "metadata",
        "protocol",
        "txns",
        "uri",
        "version",
    )  # fmt: skip
    uri: str
    version: int
    protocol: Protocol
    metadata: Metadata
    txns: Mapping[str, SetTransaction]
    domains: Mapping[str, DomainMetadata]
    _parent: Snapshot | None
    _pending: FileActions
    _pending_timestamps: tuple[tuple[int, int], ...]
    _depth: int
    _live: pa.Table | None
    _tombstones: pa.Table | None
    _timestamps: tuple[tuple[int, int], ...] | None
    _lock: threading.Lock

    def __init__(
        self,
        uri: str,
        version: int,
        protocol: Protocol,
        metadata: Metadata,
        txns: Mapping[str, SetTransaction],
        domains: Mapping[str, DomainMetadata],
        *,
        live: pa.Table | None = None,
        tombstones: pa.Table | None = None,
        timestamps: tuple[tuple[int, int], ...] = (),
        parent: Snapshot | None = None,
        pending: FileActions | None = None,
    ) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "uri", uri)
        setattr_(self, "version", version)
        setattr_(self, "protocol", protocol)
        setattr_(self, "metadata", metadata)
        setattr_(self, "txns", MappingProxyType(dict(txns)))
        setattr_(self, "domains", MappingProxyType(dict(domains)))
        setattr_(self, "_parent", parent)
        setattr_(self, "_pending", pending if pending is not None else FileActions.empty())
        setattr_(self, "_pending_timestamps", timestamps if parent is not None else ())
        # Depth counts the unfolded links down to the nearest folded ancestor.
        setattr_(self, "_depth", 0 if parent is None else parent._depth + 1 if parent._live is None else 1)
        folded = parent is None
        setattr_(self, "_live", _as_table(live, ADD_SCHEMA) if folded else None)
        setattr_(self, "_tombstones", _as_table(tombstones, REMOVE_SCHEMA) if folded else None)
        setattr_(self, "_timestamps", timestamps if folded else None)
        setattr_(self, "_lock", threading.Lock())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Snapshot is immutable (cannot set {name})")

    def __repr__(self) -> str:
        return f"Snapshot({self.uri!r}, version={self.version})"

    # ---------------------------------------------------------------- lazy fold

    def _fold(self) -> None:
        with self._lock:
            if self._live is not None:
                return
            chain: list[Snapshot] = []
            node: Snapshot | None = self
            while node is not None and node._live is None:
                chain.append(node)
                node = node._parent
            assert node is not None and node._live is not None and node._tombstones is not None
            chain.reverse()
            pending = FileActions.concat(link._pending for link in chain)
            live, tombstones = fold_files(node._live, node._tombstones, pending)
            timestamps = (node._timestamps or ()) + tuple(
                t for link in chain for t in link._pending_timestamps
            )
            setattr_ = object.__setattr__
            setattr_(self, "_live", live)
            setattr_(self, "_tombstones", tombstones)
            setattr_(self, "_timestamps", timestamps)
            setattr_(self, "_parent", None)  # release the chain
            setattr_(self, "_pending", FileActions.empty())
            setattr_(self, "_pending_timestamps", ())
            setattr_(self, "_depth", 0)

    @property
    def live_files(self) -> pa.Table:
        """The live files, one row each, in the columns of a checkpoint's ``add`` struct
        (:data:`~eventlog.log.filetable.ADD_SCHEMA`); in no particular order."""
        self._fold()
        assert self._live is not None
        return self._live

    @property
    def tombstone_files(self) -> pa.Table:
        """Removed files still remembered (``remove`` rows,
        :data:`~eventlog.log.filetable.REMOVE_SCHEMA`)."""
        self._fold()
        assert self._tombstones is not None
        return self._tombstones

    @functools.cached_property
    def files(self) -> Mapping[FileKey, AddFile]:
        """Live files keyed by ``(path, deletion vector id)``, as values (built on first use:
        prefer :attr:`live_files` when walking many files)."""
        return MappingProxyType({a.key: a for a in add_files(self.live_files)})

    @functools.cached_property
    def tombstones(self) -> Mapping[FileKey, RemoveFile]:
        """Tombstones keyed like :attr:`files`, as values (built on first use)."""
        return MappingProxyType({r.key: r for r in remove_files(self.tombstone_files)})

    @property
    def commit_timestamps(self) -> tuple[tuple[int, int], ...]:
        """(version, timestamp) of every commit folded from JSON, in order (its
        ``inCommitTimestamp`` when it has one, else ``commitInfo.timestamp``);
        versions folded from a checkpoint are absent (looked up from the log)."""
        self._fold()
        assert self._timestamps is not None
        return self._timestamps

    # ---------------------------------------------------------------- derived values

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The table schema (partition columns included) as Arrow (marked with column
        mapping's ``id`` mode, :func:`eventlog.files.column_mapping.with_mode`)."""
        return with_mode(from_spark_schema_json(self.metadata.schema_string), self.metadata.configuration)

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.metadata.partition_columns

    @functools.cached_property
    def partition_schema(self) -> pa.Schema:
        schema = self.schema
        return pa.schema([schema.field(c) for c in self.metadata.partition_columns])

    @property
    def properties(self) -> Mapping[str, str]:
        return self.metadata.configuration

    @property
    def isolation_level(self) -> IsolationLevel:
        return IsolationLevel.of_table(self.metadata.configuration)

    @property
    def table_id(self) -> str:
        return self.metadata.id

    @functools.cached_property
    def index(self) -> FileIndex:
        """The live files with their typed partition values and statistics, parsed on first
        use and kept: what pruning and data skipping work on."""
        return FileIndex(self.live_files, self.schema, self.partition_columns)

    def select_files(self, predicate: ex.Expr | None) -> tuple[ex.Expr | None, pa.Table]:
        """(the partition-only part of ``predicate`` or None, the live files that may hold
        matching rows after partition pruning and min/max skipping); all files when None."""
        if predicate is None:
            return None, self.live_files
        return self.index.prune(predicate)

    @functools.cached_property
    def add_files(self) -> tuple[AddFile, ...]:
        """Live files as values, in a stable order (by path). Built on first use: prefer
        :attr:`live_files` when walking many files."""
        return tuple(sorted(add_files(self.live_files), key=lambda a: a.path))

    @property
    def num_files(self) -> int:
        return int(self.live_files.num_rows)

    def paths(self) -> list[str]:
        """Relative paths of the live files, sorted."""
        return sorted(self.live_files.column("path").to_pylist())

    def txn_version(self, app_id: str) -> int:
        """Latest committed version for ``app_id``, or -1."""
        txn = self.txns.get(app_id)
        return txn.version if txn is not None else -1

    # ---------------------------------------------------------------- folding

    @staticmethod
    def from_commits(uri: str, commits: Sequence[Commit]) -> Snapshot:
        """Fold commits starting at version 0."""
        return Snapshot.from_events(uri, commits, FileActions.concat(c.file_actions for c in commits))

    @staticmethod
    def from_events(uri: str, events: Sequence[Events], files: FileActions) -> Snapshot:
        """Fold commits starting at version 0, given as their other actions (``events``) and
        all their file actions as columns (``files``)."""
        if not events:
            raise CorruptLogError(f"{uri}: no commits to replay", uri=uri, version=None)
        if events[0].version != 0:
            raise CorruptLogError(
                f"{uri}: replay must start at version 0, found {events[0].version}",
                uri=uri,
                version=events[0].version,
            )
        _check_contiguous(uri, events, 0)
        head = _Head()
        for event in events:
            head.apply(event.actions)
        protocol, metadata = head.require(uri, events[-1].version)
        empty_live, empty_tombstones = ADD_SCHEMA.empty_table(), REMOVE_SCHEMA.empty_table()
        live, tombstones = fold_files(empty_live, empty_tombstones, files)
        return Snapshot(
            uri, events[-1].version, protocol, metadata, head.txns, head.domains,
            live=live, tombstones=tombstones, timestamps=_timestamps(events),
        )  # fmt: skip

    @staticmethod
    def from_state(
        uri: str,
        version: int,
        protocol: Protocol,
        metadata: Metadata,
        adds: pa.Table | Iterable[AddFile],
        removes: pa.Table | Iterable[RemoveFile] = (),
        txns: Iterable[SetTransaction] = (),
        domains: Iterable[DomainMetadata] = (),
    ) -> Snapshot:
        """A snapshot from an already folded state (a checkpoint): files as tables or values."""
        live = adds if isinstance(adds, pa.Table) else adds_table(list(adds))
        tombstones = removes if isinstance(removes, pa.Table) else removes_table(list(removes))
        return Snapshot(
            uri, version, protocol, metadata,
            {t.app_id: t for t in txns}, {d.domain: d for d in domains if not d.removed},
            live=live, tombstones=tombstones,
        )  # fmt: skip

    def advance(self, commits: Sequence[Commit]) -> Snapshot:
        """A new snapshot with ``commits`` (versions ``version+1..``) folded in."""
        return self.advance_events(commits, FileActions.concat(c.file_actions for c in commits))

    def advance_events(self, events: Sequence[Events], files: FileActions) -> Snapshot:
        """:meth:`advance` for commits given as their other actions plus their file
        actions as columns (what :func:`eventlog.log.bulk.decode_file_actions` returns)."""
        if not events:
            return self
        _check_contiguous(self.uri, events, self.version + 1)
        head = _Head(self)
        for event in events:
            head.apply(event.actions)
        protocol, metadata = head.require(self.uri, events[-1].version)
        nxt = Snapshot(
            self.uri, events[-1].version, protocol, metadata, head.txns, head.domains,
            parent=self, pending=files, timestamps=_timestamps(events),
        )  # fmt: skip
        if nxt._depth >= _MAX_LAZY_DEPTH:
            nxt._fold()
        return nxt


def _as_table(table: pa.Table | None, schema: pa.Schema) -> pa.Table:
    return schema.empty_table() if table is None else conform(table, schema)


def _timestamps(events: Sequence[Events]) -> tuple[tuple[int, int], ...]:
    """(version, timestamp) of each commit: its in-commit timestamp, else commitInfo's."""
    return tuple(
        (event.version, commit_time(action))
        for event in events
        for action in event.actions
        if isinstance(action, CommitInfo)
    )


def _check_contiguous(uri: str, events: Sequence[Events], expected: int) -> None:
    for commit in events:
        if commit.version != expected:
            raise CorruptLogError(
                f"{uri}: the commit log has a gap: expected version {expected}, found {commit.version}",
                uri=uri,
                version=expected,
            )
        expected += 1


class _Head:
    """Eagerly folded, small parts of the state: protocol, metadata, txns, domains."""

    def __init__(self, base: Snapshot | None = None) -> None:
        self.protocol = base.protocol if base is not None else None
        self.metadata = base.metadata if base is not None else None
        self.txns: dict[str, SetTransaction] = dict(base.txns) if base is not None else {}
        self.domains: dict[str, DomainMetadata] = dict(base.domains) if base is not None else {}

    def apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, (AddFile, RemoveFile, CommitInfo)):
                continue
            if isinstance(action, Metadata):
                self.metadata = action
            elif isinstance(action, Protocol):
                self.protocol = action
            elif isinstance(action, SetTransaction):
                self.txns[action.app_id] = action
            elif isinstance(action, DomainMetadata):
                if action.removed:
                    self.domains.pop(action.domain, None)
                else:
                    self.domains[action.domain] = action

    def require(self, uri: str, version: int) -> tuple[Protocol, Metadata]:
        if self.protocol is None or self.metadata is None:
            missing = "protocol" if self.protocol is None else "metaData"
            raise CorruptLogError(
                f"{uri}: no {missing} action in versions 0..{version}", uri=uri, version=version
            )
        return self.protocol, self.metadata
