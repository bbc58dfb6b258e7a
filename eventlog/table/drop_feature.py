"""The table API's DROP FEATURE (Delta's ``ALTER TABLE ... DROP FEATURE``): the steps of
:mod:`eventlog.ops.drop_feature`, each committed in a transaction of its own, in Delta
Spark 4's order. :class:`DropFeature` is a base of :class:`~eventlog.table.Table`."""

from __future__ import annotations

import abc
from collections.abc import Callable

from eventlog.errors import FeatureDropError
from eventlog.log.cleanup import truncate_history_cutoff_ms
from eventlog.log.commit import Commit
from eventlog.log.storage import LogStore
from eventlog.log.storage_clock import retention_now_ms
from eventlog.ops import drop_feature as drop
from eventlog.ops.transaction import Transaction
from eventlog.snapshot import Snapshot
from eventlog.snapshot.features import TableFeature
from eventlog.txn.transaction import CommitResult

__all__ = ["DropFeature"]


class DropFeature(abc.ABC):
    """DROP FEATURE on a table handle."""

    @abc.abstractmethod
    def _run(self, operation: Callable[[Transaction], object]) -> CommitResult: ...

    @abc.abstractmethod
    def refresh(self) -> Snapshot: ...

    @abc.abstractmethod
    def checkpoint(self, snapshot: Snapshot | None = None) -> int: ...

    @abc.abstractmethod
    def commits_between(self, first: int, last: int) -> list[Commit]: ...

    @abc.abstractmethod
    def _clean_log(self, snap: Snapshot, checkpoint_version: int, cutoff_ms: int) -> None: ...

    @abc.abstractmethod
    def reorg_purge(self, where: str | None = None, *, target_size: int | None = None) -> CommitResult: ...

    @property
    @abc.abstractmethod
    def log(self) -> LogStore: ...

    def drop_feature(self, name: str, *, truncate_history: bool = False) -> CommitResult:
        """Remove table feature ``name`` from the protocol (``ALTER TABLE DROP FEATURE name
        [TRUNCATE HISTORY]``): deletionVectors, v2Checkpoint, inCommitTimestamp,
        vacuumProtocolCheck, rowTracking, checkConstraints (once no constraint remains). Its traces go
        first (properties off, deletion vectors purged...); for a reader-writer feature the
        history before the downgrade is then protected by ``checkpointProtection``, or, with
        ``truncate_history``, cut as Delta cuts it: log files older than
        ``delta.dropFeatureTruncateHistory.retentionDuration`` (24 hours; never within
        ``eventlog.auditRetentionDuration``) are deleted, and what remains must not use it. Refusals are
        :class:`~eventlog.errors.FeatureDropError` with ``feature`` and ``reason``. Returns
        the downgrade commit's result."""
        snap = self.refresh()
        feature = drop.check_drop(snap.protocol, snap.metadata, name, truncate_history=truncate_history)
        changed = self._remove_traces(feature, snap)
        protect = feature.reader_writer and not truncate_history
        if feature.reader_writer:
            for _ in range(drop.BARRIER_CHECKPOINTS if protect else 1):
                self._run(lambda txn: txn.empty_commit())
                checkpoint = self.checkpoint()  # also cleans the log up, as the table's retention allows
            if truncate_history:
                if not changed:  # Delta's truncation: the history older than 24 hours goes
                    snap = self.refresh()
                    # "now" bounded by the storage's clock: a clock ahead must not cut early
                    cutoff = truncate_history_cutoff_ms(snap.properties, retention_now_ms(self.log))
                    self._clean_log(snap, checkpoint, cutoff)
                self._check_history(feature, changed)
        result = self._run(
            lambda txn: txn.downgrade_protocol(name, truncate_history=truncate_history, protect=protect)
        )
        if protect:
            self.checkpoint()  # the protected checkpoint after the downgrade, as Delta writes
        return result

    def _remove_traces(self, feature: TableFeature, snap: Snapshot) -> bool:
        """The pre-downgrade step; whether it committed anything."""
        changed = False
        changes = drop.property_changes(snap.metadata, feature)
        if changes:
            self._run(lambda txn: txn.drop_feature_traces(changes))
            changed = True
        if feature.name == "deletionVectors" and _has_deletion_vectors(self.refresh()):
            self.reorg_purge()
            changed = True
        if feature.name == "rowTracking" and _has_row_ids(self.refresh()):
            self._run(lambda txn: txn.drop_row_ids())
            changed = True
        return changed

    def _check_history(self, feature: TableFeature, changed: bool) -> None:
        """With ``truncate_history``: no version the log still keeps may use the feature."""
        if changed:
            raise FeatureDropError(
                feature=feature.name,
                reason="wait for retention",
                detail="its traces were removed now; run DROP FEATURE again once the log retention "
                "(delta.logRetentionDuration, eventlog.auditRetentionDuration) has passed",
            )
        bounds = LogStore.commit_version_bounds(self.log.list_log())
        if bounds is None:
            return
        for commit in self.commits_between(*bounds):
            if any(drop.uses_feature(a, feature.name) for a in commit.actions):
                raise FeatureDropError(
                    feature=feature.name,
                    reason="historical versions exist",
                    detail=f"version {commit.version} still uses it; wait for the log retention to "
                    "pass, or drop it without truncate_history (checkpointProtection)",
                )


def _has_row_ids(snap: Snapshot) -> bool:
    return any(a.base_row_id is not None or a.default_row_commit_version is not None for a in snap.add_files)


def _has_deletion_vectors(snap: Snapshot) -> bool:
    live = snap.live_files
    return "deletionVector" in live.column_names and live.column("deletionVector").null_count < live.num_rows
