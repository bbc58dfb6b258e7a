"""Snapshots: the projection of the event log at a version.

A snapshot at version ``v`` is the fold of commits ``0..v`` (or of a checkpoint at ``c``
and commits ``c+1..v``): live files keyed by ``(path, deletion-vector id)``, metadata,
protocol, app-transaction versions and domain metadata. A :class:`Snapshot` is an
immutable value; :meth:`Snapshot.advance` folds further commits into a *new* snapshot.
Replay checks that versions are contiguous and fails with :class:`CorruptLogError` on a
gap.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import pyarrow as pa

from eventlog.errors import CorruptLogError
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import (
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from eventlog.log.commit import Commit
from eventlog.snapshot.isolation import IsolationLevel

FileKey = tuple[str, str | None]


# Advancing a snapshot records the new commits on top of its parent (O(new commits));
# the file map is folded on first use. Every this many commits a fold is forced, which
# bounds the chain a first use walks and the commits a chain keeps alive.
_MAX_LAZY_DEPTH = 256


class Snapshot:
    """The table state at ``version`` (an immutable value).

    ``protocol``, ``metadata``, ``txns`` and ``domains`` are folded eagerly; ``files``,
    ``tombstones`` and ``commit_timestamps`` lazily, on first access, from the nearest
    folded ancestor plus the commits since (structural sharing, so a stream of small
    commits does not copy the file map each time).
    """

    __slots__ = (
        "__dict__",
        "_depth",
        "_files",
        "_lock",
        "_parent",
        "_pending",
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
    _pending: tuple[Commit, ...]
    _depth: int
    _files: Mapping[FileKey, AddFile] | None
    _tombstones: Mapping[FileKey, RemoveFile] | None
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
        files: Mapping[FileKey, AddFile] | None = None,
        tombstones: Mapping[FileKey, RemoveFile] | None = None,
        timestamps: tuple[tuple[int, int], ...] = (),
        parent: Snapshot | None = None,
        pending: tuple[Commit, ...] = (),
    ) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "uri", uri)
        setattr_(self, "version", version)
        setattr_(self, "protocol", protocol)
        setattr_(self, "metadata", metadata)
        setattr_(self, "txns", MappingProxyType(dict(txns)))
        setattr_(self, "domains", MappingProxyType(dict(domains)))
        setattr_(self, "_parent", parent)
        setattr_(self, "_pending", pending)
        # Depth counts the unfolded links down to the nearest folded ancestor.
        setattr_(self, "_depth", 0 if parent is None else parent._depth + 1 if parent._files is None else 1)
        setattr_(self, "_files", MappingProxyType(dict(files)) if files is not None else None)
        setattr_(self, "_tombstones", MappingProxyType(dict(tombstones or {})) if files is not None else None)
        setattr_(self, "_timestamps", timestamps if files is not None else None)
        setattr_(self, "_lock", threading.Lock())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Snapshot is immutable (cannot set {name})")

    def __repr__(self) -> str:
        return f"Snapshot({self.uri!r}, version={self.version})"

    # ---------------------------------------------------------------- lazy fold

    def _fold(self) -> None:
        with self._lock:
            if self._files is not None:
                return
            chain: list[Snapshot] = []
            node: Snapshot | None = self
            while node is not None and node._files is None:
                chain.append(node)
                node = node._parent
            assert node is not None  # the root of every chain is folded
            state = _FileState(node)
            for link in reversed(chain):
                for commit in link._pending:
                    state.apply(commit)
            setattr_ = object.__setattr__
            setattr_(self, "_files", MappingProxyType(state.files))
            setattr_(self, "_tombstones", MappingProxyType(state.tombstones))
            setattr_(self, "_timestamps", tuple(state.timestamps))
            setattr_(self, "_parent", None)  # release the chain
            setattr_(self, "_pending", ())
            setattr_(self, "_depth", 0)

    @property
    def files(self) -> Mapping[FileKey, AddFile]:
        """Live files keyed by ``(path, deletion vector id)``."""
        self._fold()
        assert self._files is not None
        return self._files

    @property
    def tombstones(self) -> Mapping[FileKey, RemoveFile]:
        self._fold()
        assert self._tombstones is not None
        return self._tombstones

    @property
    def commit_timestamps(self) -> tuple[tuple[int, int], ...]:
        """(version, commitInfo.timestamp) of every commit folded from JSON, in order;
        versions folded from a checkpoint are absent (looked up from the log)."""
        self._fold()
        assert self._timestamps is not None
        return self._timestamps

    # ---------------------------------------------------------------- derived values

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The table schema (partition columns included) as Arrow."""
        return from_spark_schema_json(self.metadata.schema_string)

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
    def add_files(self) -> tuple[AddFile, ...]:
        """Live files in a stable order (by path)."""
        return tuple(sorted(self.files.values(), key=lambda a: a.path))

    @property
    def num_files(self) -> int:
        return len(self.files)

    def txn_version(self, app_id: str) -> int:
        """Latest committed version for ``app_id``, or -1."""
        txn = self.txns.get(app_id)
        return txn.version if txn is not None else -1

    # ---------------------------------------------------------------- folding

    @staticmethod
    def from_commits(uri: str, commits: Sequence[Commit]) -> Snapshot:
        """Fold commits starting at version 0."""
        if not commits:
            raise CorruptLogError(f"{uri}: no commits to replay", uri=uri, version=None)
        if commits[0].version != 0:
            raise CorruptLogError(
                f"{uri}: replay must start at version 0, found {commits[0].version}",
                uri=uri,
                version=commits[0].version,
            )
        _check_contiguous(uri, commits, 0)
        head = _Head()
        files = _FileState(None)
        for commit in commits:
            head.apply(commit)
            files.apply(commit)
        protocol, metadata = head.require(uri, commits[-1].version)
        return Snapshot(
            uri, commits[-1].version, protocol, metadata, head.txns, head.domains,
            files=files.files, tombstones=files.tombstones, timestamps=tuple(files.timestamps),
        )  # fmt: skip

    @staticmethod
    def from_state(
        uri: str,
        version: int,
        protocol: Protocol,
        metadata: Metadata,
        adds: Iterable[AddFile],
        removes: Iterable[RemoveFile] = (),
        txns: Iterable[SetTransaction] = (),
        domains: Iterable[DomainMetadata] = (),
    ) -> Snapshot:
        """A snapshot from an already folded state (a checkpoint)."""
        return Snapshot(
            uri, version, protocol, metadata,
            {t.app_id: t for t in txns}, {d.domain: d for d in domains if not d.removed},
            files={a.key: a for a in adds}, tombstones={r.key: r for r in removes},
        )  # fmt: skip

    def advance(self, commits: Sequence[Commit]) -> Snapshot:
        """A new snapshot with ``commits`` (versions ``version+1..``) folded in."""
        if not commits:
            return self
        _check_contiguous(self.uri, commits, self.version + 1)
        head = _Head(self)
        for commit in commits:
            head.apply(commit)
        protocol, metadata = head.require(self.uri, commits[-1].version)
        nxt = Snapshot(
            self.uri, commits[-1].version, protocol, metadata, head.txns, head.domains,
            parent=self, pending=tuple(commits),
        )  # fmt: skip
        if nxt._depth >= _MAX_LAZY_DEPTH:
            nxt._fold()
        return nxt


def _check_contiguous(uri: str, commits: Sequence[Commit], expected: int) -> None:
    for commit in commits:
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

    def apply(self, commit: Commit) -> None:
        for action in commit.actions:
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


class _FileState:
    """The file map being folded (mutable; frozen into a Snapshot at the end)."""

    def __init__(self, base: Snapshot | None) -> None:
        self.files: dict[FileKey, AddFile] = dict(base._files) if base is not None and base._files else {}
        self.tombstones: dict[FileKey, RemoveFile] = (
            dict(base._tombstones) if base is not None and base._tombstones else {}
        )
        self.timestamps: list[tuple[int, int]] = list(base._timestamps or ()) if base is not None else []

    def apply(self, commit: Commit) -> None:
        files, tombstones = self.files, self.tombstones
        for action in commit.actions:
            if isinstance(action, AddFile):
                key = action.key
                files[key] = action
                tombstones.pop(key, None)
            elif isinstance(action, RemoveFile):
                key = action.key
                files.pop(key, None)
                tombstones[key] = action
            elif isinstance(action, CommitInfo):
                self.timestamps.append((commit.version, action.timestamp))
