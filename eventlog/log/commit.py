"""A published commit: one version of the log and its actions, in file order, and what its
commitInfo says about the transactions it carries (one, or a group commit's members)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
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
)
from eventlog.log.filetable import FileActions

__all__ = ["GROUP_FIELD", "Commit", "member_txn_ids"]

GROUP_FIELD = "eventlog.groupCommit"  # commitInfo field: a group commit's members' own commit infos


@dataclass(frozen=True)
class Commit:
    """One published version: its actions, in file order."""

    version: int
    actions: tuple[Action, ...]

    @functools.cached_property
    def file_actions(self) -> FileActions:
        """Its add and remove actions as Arrow tables (built once, for snapshot folds)."""
        return FileActions.of(self.version, self.adds, self.removes)

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
