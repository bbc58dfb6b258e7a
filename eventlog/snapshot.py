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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import pyarrow as pa

from eventlog.actions import (
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from eventlog.errors import CorruptLogError
from eventlog.isolation import IsolationLevel
from eventlog.schema import from_spark_schema_json

FileKey = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class Commit:
    """One published version: its actions, in file order."""

    version: int
    actions: tuple[Action, ...]

    @property
    def commit_info(self) -> CommitInfo | None:
        for a in self.actions:
            if isinstance(a, CommitInfo):
                return a
        return None

    @property
    def timestamp(self) -> int | None:
        info = self.commit_info
        return info.timestamp if info is not None else None

    @property
    def adds(self) -> list[AddFile]:
        return [a for a in self.actions if isinstance(a, AddFile)]

    @property
    def removes(self) -> list[RemoveFile]:
        return [a for a in self.actions if isinstance(a, RemoveFile)]

    @property
    def metadata(self) -> Metadata | None:
        for a in self.actions:
            if isinstance(a, Metadata):
                return a
        return None

    @property
    def protocol(self) -> Protocol | None:
        for a in self.actions:
            if isinstance(a, Protocol):
                return a
        return None

    @property
    def txns(self) -> list[SetTransaction]:
        return [a for a in self.actions if isinstance(a, SetTransaction)]

    @property
    def domains(self) -> list[DomainMetadata]:
        return [a for a in self.actions if isinstance(a, DomainMetadata)]


@dataclass(frozen=True)
class Snapshot:
    """The table state at ``version`` (immutable)."""

    uri: str
    version: int
    protocol: Protocol
    metadata: Metadata
    files: Mapping[FileKey, AddFile]
    txns: Mapping[str, SetTransaction] = field(default_factory=dict)
    domains: Mapping[str, DomainMetadata] = field(default_factory=dict)
    tombstones: Mapping[FileKey, RemoveFile] = field(default_factory=dict)
    # (version, commitInfo.timestamp) of every commit folded from JSON, in order; versions
    # folded from a checkpoint are absent and looked up from the log when needed.
    commit_timestamps: tuple[tuple[int, int], ...] = ()

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
        state = _FoldState()
        state.apply_all(uri, commits, expected_first=0)
        return state.freeze(uri, commits[-1].version)

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
        state = _FoldState()
        state.protocol = protocol
        state.metadata = metadata
        state.files = {a.key: a for a in adds}
        state.tombstones = {r.key: r for r in removes}
        state.txns = {t.app_id: t for t in txns}
        state.domains = {d.domain: d for d in domains if not d.removed}
        return state.freeze(uri, version)

    def advance(self, commits: Sequence[Commit]) -> Snapshot:
        """A new snapshot with ``commits`` (versions ``version+1..``) folded in."""
        if not commits:
            return self
        state = _FoldState.of(self)
        state.apply_all(self.uri, commits, expected_first=self.version + 1)
        return state.freeze(self.uri, commits[-1].version)


class _FoldState:
    """Mutable accumulator used only inside a fold; frozen into a Snapshot at the end."""

    def __init__(self) -> None:
        self.protocol: Protocol | None = None
        self.metadata: Metadata | None = None
        self.files: dict[FileKey, AddFile] = {}
        self.tombstones: dict[FileKey, RemoveFile] = {}
        self.txns: dict[str, SetTransaction] = {}
        self.domains: dict[str, DomainMetadata] = {}
        self.timestamps: list[tuple[int, int]] = []

    @staticmethod
    def of(snapshot: Snapshot) -> _FoldState:
        state = _FoldState()
        state.protocol = snapshot.protocol
        state.metadata = snapshot.metadata
        state.files = dict(snapshot.files)
        state.tombstones = dict(snapshot.tombstones)
        state.txns = dict(snapshot.txns)
        state.domains = dict(snapshot.domains)
        state.timestamps = list(snapshot.commit_timestamps)
        return state

    def apply_all(self, uri: str, commits: Sequence[Commit], *, expected_first: int) -> None:
        expected = expected_first
        for commit in commits:
            if commit.version != expected:
                raise CorruptLogError(
                    f"{uri}: the commit log has a gap: expected version {expected}, found {commit.version}",
                    uri=uri,
                    version=expected,
                )
            self.apply(commit)
            expected += 1

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
            elif isinstance(action, Metadata):
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

    def freeze(self, uri: str, version: int) -> Snapshot:
        if self.protocol is None or self.metadata is None:
            missing = "protocol" if self.protocol is None else "metaData"
            raise CorruptLogError(
                f"{uri}: no {missing} action in versions 0..{version}", uri=uri, version=version
            )
        return Snapshot(
            uri=uri,
            version=version,
            protocol=self.protocol,
            metadata=self.metadata,
            files=MappingProxyType(self.files),
            txns=MappingProxyType(self.txns),
            domains=MappingProxyType(self.domains),
            tombstones=MappingProxyType(self.tombstones),
            commit_timestamps=tuple(self.timestamps),
        )
