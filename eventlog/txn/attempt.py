"""What the commit loops work on: a prepared commit, the table it goes to, and its result.

A transaction hands its commit to a loop as values, never as itself:

* :class:`PendingCommit` says what the transaction read and wrote (its actions, its
  commitInfo, the summary the conflict checker needs, and the data files it created);
* :class:`CommitTarget` is the small part of a table a loop uses (the log store, the
  slot store, the latest version, reading winners, publishing, caching a new commit);
* :class:`CommitAttempt` is the one mutable thing: the commit as it is rebased on the
  winners of each turn (row-level resolution may rewrite its adds and removes, and its
  timestamp moves past a winner's).

Both :mod:`eventlog.txn.commitloop` and :mod:`eventlog.txn.groupcommit` run a
:class:`CommitAttempt`, and neither knows the other or the transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from pyroaring import AbstractBitMap64

from eventlog import metrics
from eventlog.errors import DeltaConcurrentModificationException
from eventlog.files import row_tracking
from eventlog.files.datafiles import delete_files
from eventlog.files.deletion_vectors import dv_file_path
from eventlog.files.reader import physical_row_count
from eventlog.files.scan import file_deletes
from eventlog.log import in_commit_timestamps as ict
from eventlog.log.actions import Action, AddCDCFile, AddFile, CommitInfo, Metadata, RemoveFile
from eventlog.log.audit import chain_commit
from eventlog.log.commit import Commit
from eventlog.log.commitlog import Published
from eventlog.log.storage import LogStore
from eventlog.snapshot import Snapshot
from eventlog.txn.conflicts import TransactionSummary, WinningCommit, check_conflicts
from eventlog.txn.identity import restage_metadata
from eventlog.txn.retry import RetryPolicy
from lockstore import SlotStore

log = logging.getLogger("eventlog.commit")

__all__ = ["CommitAttempt", "CommitResult", "CommitTarget", "PendingCommit", "PhaseTimer"]


@dataclasses.dataclass(frozen=True, slots=True)
class CommitResult:
    """Outcome of a commit: the version, the attempts it took and the operation metrics."""

    version: int
    attempts: int
    operation: str
    metrics: Mapping[str, str]
    txn_id: str = ""
    skipped: bool = False  # an idempotent write whose app version was already committed
    # Where the commit's time went, in ms: "stage", "check" (reading and conflict-checking
    # winners), "claim", "publish", "backoff"; with group commit also "wait" (queued) and
    # "gather"; "total" from staging to the result.
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)


class CommitTarget(Protocol):
    """The part of a table that transactions and commit loops use (:class:`eventlog.table.Table`
    is one): storage, slots, the latest version, past snapshots, reading and publishing commits."""

    @property
    def log(self) -> LogStore: ...
    @property
    def slots(self) -> SlotStore: ...
    @property
    def key(self) -> str: ...
    @property
    def uri(self) -> str: ...

    app_id: str | None
    retry_policy: RetryPolicy
    group_commit: bool

    @property
    def audit_key(self) -> bytes | None: ...
    def commit_digest(self, version: int) -> str | None: ...
    def refresh(self) -> Snapshot: ...
    def snapshot(self, version: int | None = None) -> Snapshot: ...
    def latest_version(self, claimed: int | None = None, *, repair: bool = False) -> int: ...
    def commits_between(self, first: int, last: int) -> list[Commit]: ...
    def publish_claimed(self, version: int, staged_name: str, data: bytes, txn_id: str) -> Published: ...
    def note_committed(self, commit: Commit) -> None: ...
    def bind_slots(self, table_id: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class PendingCommit:
    """A transaction's prepared commit: what it read (in ``summary``) and wrote."""

    txn_id: str
    read_version: int
    info: CommitInfo
    body: tuple[Action, ...]
    summary: TransactionSummary
    created: tuple[str, ...]  # data and DV files it wrote (table-relative), deleted if unused
    # The row-id high-water mark of the read snapshot (eventlog.files.row_tracking).
    row_id_mark: int = row_tracking.NO_HIGH_WATER_MARK


class PhaseTimer:
    """Milliseconds spent per phase of one commit (see ``CommitResult.timings``)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._started = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - t0) * 1000

    def result(self) -> dict[str, float]:
        return {**self.ms, "total": (time.perf_counter() - self._started) * 1000}


class CommitAttempt:
    """A pending commit on its way to a version: rebased on winners, then published."""

    def __init__(self, target: CommitTarget, pending: PendingCommit) -> None:
        self.target = target
        self.txn_id = pending.txn_id
        self.read_version = pending.read_version
        self.info = pending.info
        self.body = list(pending.body)
        self.summary = pending.summary
        self.created = pending.created
        self.staged_name = f"{pending.txn_id}.json"
        self.last_version = pending.read_version + 1
        self.timer = PhaseTimer()
        # Set when the loop leaves while the commit may still land (interrupted while
        # queued for group commit): the files it wrote must then be kept.
        self.may_still_land = False
        self._dated: tuple[int, int] | None = None  # (version, timestamp) of the last dating
        # The row-id high-water mark of the latest version checked (the read one, then each
        # winner's): fresh row ids are assigned above it.
        self.row_id_mark = pending.row_id_mark

    def bytes(self, version: int) -> bytes:
        """The commit file's bytes for ``version``: chained to version-1's hash
        (:mod:`eventlog.log.audit`), so a commit re-staged for another version changes."""
        prev = self.target.commit_digest(version - 1)
        return chain_commit(self.dated([self.info, *self.body], version), prev, self.target.audit_key)

    @property
    def in_commit_timestamps(self) -> bool:
        """Whether the table as this commit leaves it writes in-commit timestamps."""
        metadata = self.summary.metadata or self.summary.read_metadata
        return metadata is not None and ict.enabled(metadata.configuration)

    def commit_timestamp(self, version: int) -> int:
        """The timestamp of this commit at ``version``: the clock, but after version-1's.

        Fixed while the commit tries ``version`` (its staged bytes stay the same), taken
        again when it moves to another version (rebased over a winner)."""
        if self._dated is None or self._dated[0] != version:
            previous = self._previous_timestamp(version)
            self._dated = (version, ict.next_timestamp(previous, ict.wall_clock_ms()))
        return self._dated[1]

    def _previous_timestamp(self, version: int) -> int | None:
        """Version-1's timestamp: its in-commit timestamp, else its commitInfo's, and with
        in-commit timestamps on (this commit enables them) its file's modification time."""
        if version <= 0:
            return None
        (previous,) = self.target.commits_between(version - 1, version - 1)
        stamped = ict.in_commit_timestamp(previous.commit_info)
        if stamped is not None:
            return stamped
        mtime = self.target.log.commit_mtime_ms(version - 1) if self.in_commit_timestamps else None
        known = [t for t in (previous.timestamp, mtime) if t is not None]
        return max(known) if known else None

    def dated(self, actions: Sequence[Action], version: int) -> list[Action]:
        """``actions`` (commitInfo first) as the commit file of ``version`` holds them: with
        in-commit timestamps on, the commitInfo carries :meth:`commit_timestamp`, and a
        commit that turns them on for an existing table records where they begin. On a
        row-tracking table, adds get fresh row ids above the mark and ``version`` as their
        default row commit version (:func:`eventlog.files.row_tracking.assign_fresh_row_ids`)."""
        actions = self._with_row_ids(actions, version)
        if not self.in_commit_timestamps:
            return list(actions)
        info, *rest = actions
        assert isinstance(info, CommitInfo), "commitInfo must come first"
        ts = self.commit_timestamp(version)
        read = self.summary.read_metadata
        body = [
            ict.stamp_enablement(a, read, version, ts) if isinstance(a, Metadata) and read is not None else a
            for a in rest
        ]
        return [ict.stamp_info(info, ts), *body]

    def _with_row_ids(self, actions: Sequence[Action], version: int) -> Sequence[Action]:
        summary = self.summary
        protocol = summary.protocol or summary.read_protocol
        if not row_tracking.assigns(protocol, summary.metadata or summary.read_metadata):
            return actions
        fs, root = self.target.log.fs, self.target.log.root
        out, _ = row_tracking.assign_fresh_row_ids(
            actions, version, self.row_id_mark, lambda add: physical_row_count(fs, root, add)
        )
        return out

    def _winner_bitmaps(self, commit: Commit) -> dict[str, AbstractBitMap64]:
        """DV bitmaps of a winner's files that row-level resolution compares with ours."""
        summary = self.summary
        if not summary.row_level:
            return {}
        interest = set(summary.dv_updates) | {c.path for c in summary.compaction}
        fs, root = self.target.log.fs, self.target.log.root
        out: dict[str, AbstractBitMap64] = {}
        for add in commit.adds:
            if add.deletion_vector is not None and add.path in interest:
                out[add.path] = file_deletes(fs, root, add)
        return out

    def check_winners(self, winners: Sequence[Commit]) -> bool:
        """Conflict-check this commit against ``winners`` (ascending) and rebase it on them.

        Raises the conflict; returns whether the commit's actions changed (row-level
        resolution rewrote adds or removes, or the timestamp moved past a winner's), in
        which case the caller re-stages it.
        """
        for commit in winners:
            winner = WinningCommit.of(commit, self._winner_bitmaps(commit))
            # Rebased over the winner: our fresh row ids go above its mark.
            self.row_id_mark = max(self.row_id_mark, row_tracking.high_water_mark(winner.domains))
            info = commit.commit_info
            fields = {
                "table": self.target.uri,
                "txn_id": self.txn_id,
                "winning_version": commit.version,
                "winning_operation": info.operation if info is not None else None,
            }
            try:
                self.summary = check_conflicts(self.summary, winner)
            except DeltaConcurrentModificationException as exc:
                log.warning(
                    "commit conflict with version %s: %s",
                    commit.version,
                    type(exc).__name__,
                    extra={**fields, "exception": type(exc).__name__},
                )
                metrics.observe_conflict(exc)
                raise
            log.info("rebased on winning commit %s", commit.version, extra=fields)
        rebuilt = self._rebuild_if_rebased()
        restaged = self._restage_identity_marks()
        return self._rebase_timestamp(winners) or rebuilt or restaged

    def _restage_identity_marks(self) -> bool:
        """A commit whose only metadata change is identity high-water marks carries the
        metadata it rebased on (a winner's) with the furthest marks: never a mark below one
        the log already holds, and every other field as the winner left it."""
        summary = self.summary
        if not summary.identity or summary.metadata is not None or summary.read_metadata is None:
            return False
        staged = restage_metadata(summary.read_metadata, summary.identity)
        index = next(i for i, a in enumerate(self.body) if isinstance(a, Metadata))
        if self.body[index] == staged:
            return False
        self.body[index] = staged
        return True

    def _rebuild_if_rebased(self) -> bool:
        """Row-level resolution may rewrite this commit's adds and removes."""
        files = [a for a in self.body if isinstance(a, (AddFile, RemoveFile))]
        if files == [*self.summary.removes, *self.summary.adds]:
            return False
        others = [a for a in self.body if not isinstance(a, (AddFile, RemoveFile))]
        self.body = [*others, *self.summary.removes, *self.summary.adds]
        return True

    def _rebase_timestamp(self, winners: Sequence[Commit]) -> bool:
        """Keep commit timestamps increasing with versions (what time travel relies on)."""
        latest_ts = max((c.timestamp or 0 for c in winners), default=0)
        if latest_ts < self.info.timestamp:
            return False
        self.info = dataclasses.replace(self.info, timestamp=latest_ts + 1)
        return True

    def drop_unreferenced(self) -> None:
        """Delete files the transaction wrote that the final commit does not reference
        (row-level resolution can drop a compaction or replace a DV file by an inline DV)."""
        final = self.summary.adds
        used = {a.path for a in final}
        used |= {
            dv_file_path("", a.deletion_vector).lstrip("/")
            for a in final
            if a.deletion_vector is not None and a.deletion_vector.storage_type == "u"
        }
        used |= {a.path for a in self.body if isinstance(a, AddCDCFile)}  # change data
        unused = [p for p in self.created if p not in used]
        self.created = ()
        if unused:
            delete_files(self.target.log.fs, self.target.log.root, unused)

    def result(self, version: int, attempts: int) -> CommitResult:
        info = self.info
        return CommitResult(
            version,
            attempts,
            info.operation,
            dict(info.operation_metrics),
            self.txn_id,
            timings=self.timer.result(),
        )
