"""The table API's change data feed read (Delta's ``table_changes``): :class:`TableChanges` is
a base of :class:`~eventlog.table.Table`; the work is done by :mod:`eventlog.snapshot.changes`."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import pyarrow as pa

from eventlog.log.commitlog import CommitLog
from eventlog.log.storage import LogStore
from eventlog.snapshot.changes import Timestamp, plan_changes, read_changes, resolve_range
from eventlog.snapshot.projection import Snapshot

__all__ = ["TableChanges"]


class TableChanges(abc.ABC):
    """Change data feed reads of a table handle."""

    commitlog: CommitLog

    @abc.abstractmethod
    def refresh(self) -> Snapshot:
        """The latest snapshot."""

    @property
    @abc.abstractmethod
    def log(self) -> LogStore:
        """The table's log store (its file system and root)."""

    def changes(
        self,
        start_version: int | None = None,
        end_version: int | None = None,
        *,
        start_timestamp: Timestamp | None = None,
        end_timestamp: Timestamp | None = None,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
    ) -> pa.Table:
        """The row-level changes of versions ``start..end`` (inclusive; end default latest),
        as Delta's ``table_changes``: the end version's columns, then ``_change_type``
        (``insert``, ``update_preimage``, ``update_postimage``, ``delete``),
        ``_commit_version`` and ``_commit_timestamp`` (UTC), ordered by version.

        Exactly one of ``start_version``/``start_timestamp`` (the first version committed at
        or after it); ``end_timestamp``: the last version committed at or before it.
        ``filter``: a SQL predicate on those columns; ``columns``: a projection.
        ChangeDataNotRecordedError when ``delta.enableChangeDataFeed`` was off at the start
        or turned off within the range; ChangeDataSchemaChangeError when the range spans a
        schema change the end version's schema cannot read (a column renamed or dropped under
        column mapping, a type or partitioning change: read ``start..e.version - 1`` and
        ``e.version..end`` apart); InvalidChangeRangeError for an end before the start or a
        start after the latest version (see :mod:`eventlog.snapshot.changes`).
        """
        current = self.refresh()
        start, end = resolve_range(
            self.commitlog, current.version, start_version, end_version,
            start_timestamp=start_timestamp, end_timestamp=end_timestamp,
        )  # fmt: skip
        plan = plan_changes(self.commitlog, start, end, current.metadata)
        return read_changes(self.log.fs, self.log.root, plan, columns=columns, filter=filter)
