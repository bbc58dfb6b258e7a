"""A published commit: one version of the log and its actions, in file order, and what its
commitInfo says about the transactions it carries (one, or a group commit's members)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from eventlog.log.actions import (
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    decode_commit,
)
from eventlog.log.bulk import decode_file_actions
from eventlog.log.filetable import FileActions, add_files, remove_files

__all__ = ["GROUP_FIELD", "Commit", "decode", "member_txn_ids"]

GROUP_FIELD = "eventlog.groupCommit"  # commitInfo field: a group commit's members' own commit infos


class Commit:
    """One published version: its actions, in file order.

    Made from action values (``Commit(version, actions)``), or, for a big commit read from
    the log, from its other actions and its file actions already in columns
    (:meth:`from_columns`): the ``AddFile``/``RemoveFile`` values are then made only if
    someone asks for :attr:`actions`, :attr:`adds` or :attr:`removes`, while snapshot
    folds and conflict checks use :attr:`file_actions` directly.
    """

    __slots__ = ("__dict__", "_actions", "_others", "version")

    def __init__(self, version: int, actions: Iterable[Action]) -> None:
        self.version = version
        self._actions: tuple[Action, ...] | None = tuple(actions)
        self._others: tuple[Action, ...] | None = None

    @staticmethod
    def from_columns(version: int, others: Iterable[Action], files: FileActions) -> Commit:
        """A commit given as its non-file actions (in file order) and its add and remove
        actions as Arrow tables. Its :attr:`actions` list the others, then the adds, then
        the removes."""
        commit = Commit(version, ())
        commit._actions = None
        commit._others = tuple(others)
        commit.__dict__["file_actions"] = files
        return commit

    @functools.cached_property
    def actions(self) -> tuple[Action, ...]:
        if self._actions is not None:
            return self._actions
        assert self._others is not None
        files = self.file_actions
        return (*self._others, *add_files(files.adds), *remove_files(files.removes))

    @functools.cached_property
    def others(self) -> tuple[Action, ...]:
        """Every action but the adds and removes, in file order."""
        if self._others is not None:
            return self._others
        return tuple(a for a in self.actions if not isinstance(a, AddFile | RemoveFile))

    @functools.cached_property
    def file_actions(self) -> FileActions:
        """Its add and remove actions as Arrow tables (built once, for snapshot folds and
        conflict checks)."""
        return FileActions.of(self.version, self.adds, self.removes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Commit):
            return NotImplemented
        return self.version == other.version and self.actions == other.actions

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Commit(version={self.version}, actions={len(self.actions)})"

    @property
    def commit_info(self) -> CommitInfo | None:
        for a in self.others:
            if isinstance(a, CommitInfo):
                return a
        return None

    @property
    def timestamp(self) -> int | None:
        info = self.commit_info
        return info.timestamp if info is not None else None

    @functools.cached_property
    def adds(self) -> list[AddFile]:
        if self._actions is None:
            return add_files(self.file_actions.adds)
        return [a for a in self._actions if isinstance(a, AddFile)]

    @functools.cached_property
    def removes(self) -> list[RemoveFile]:
        if self._actions is None:
            return remove_files(self.file_actions.removes)
        return [a for a in self._actions if isinstance(a, RemoveFile)]

    @property
    def metadata(self) -> Metadata | None:
        for a in self.others:
            if isinstance(a, Metadata):
                return a
        return None

    @property
    def protocol(self) -> Protocol | None:
        for a in self.others:
            if isinstance(a, Protocol):
                return a
        return None

    @property
    def txns(self) -> list[SetTransaction]:
        return [a for a in self.others if isinstance(a, SetTransaction)]

    @property
    def domains(self) -> list[DomainMetadata]:
        return [a for a in self.others if isinstance(a, DomainMetadata)]


COLUMNAR_BYTES = 64 << 10  # commits larger than this are decoded into columns, not values


def decode(version: int, data: bytes) -> Commit:
    """Commit ``version`` from its file's bytes. A big one (a compaction, a bulk write) is
    decoded in bulk into columns (:mod:`eventlog.log.bulk`), so folding it into a snapshot
    or checking a transaction against it makes no value per file. Raises
    :class:`~eventlog.log.actions.ActionDecodeError` on a malformed line."""
    if len(data) > COLUMNAR_BYTES:
        headers, files = decode_file_actions([(version, data)])
        (header,) = headers
        return Commit.from_columns(version, header.actions, files)
    return Commit(version, decode_commit(data))


def member_txn_ids(info: CommitInfo | Mapping[str, Any] | None) -> list[str]:
    """The transactions a commit carries: its group's members, or its own id."""
    if info is None:
        return []
    if isinstance(info, CommitInfo):
        group, own = info.extra.get(GROUP_FIELD), info.txn_id
    else:
        group, own = info.get(GROUP_FIELD), info.get("txnId")
    if group:
        return [str(entry["txnId"]) for entry in group]
    return [own] if own else []
