"""The commit loop: stage, conflict-check the winners, claim a version slot, publish.

One :class:`CommitLoop` runs per :meth:`eventlog.transaction.Transaction.commit` (the
pipeline is described in :mod:`eventlog.transaction`); groupable blind appends hand over
to :class:`eventlog.groupcommit.GroupCommitLoop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pyroaring import AbstractBitMap64

from eventlog.actions import Action, AddFile, CommitInfo, RemoveFile, encode_commit
from eventlog.conflicts import WinningCommit, check_conflicts
from eventlog.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    DeltaConcurrentModificationException,
    EventlogError,
    SlotStoreError,
)
from eventlog.groupcommit import GroupCommitLoop, groupable
from eventlog.isolation import IsolationLevel
from eventlog.scan import file_deletes
from eventlog.snapshot import Commit
from lockstore import SlotClaim, SlotStoreUnavailableError, default_owner

if TYPE_CHECKING:
    from eventlog.transaction import Transaction

log = logging.getLogger("eventlog.commit")


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


class CommitLoop:
    """The retry loop of one commit (see the module docstring)."""

    def __init__(self, txn: Transaction, body: list[Action], info: CommitInfo, level: IsolationLevel) -> None:
        self.txn = txn
        self.table = txn.table
        self.body = body
        self.info = info
        self.summary = txn.summary(level, bool(info.is_blind_append))
        self.staged_name = f"{txn.txn_id}.json"
        self.policy = self.table.retry_policy
        self.last_version = txn.read_version + 1
        self.timer = PhaseTimer()

    def _bytes(self) -> bytes:
        return encode_commit([self.info, *self.body])

    def run(self) -> CommitResult:
        table, policy = self.table, self.policy
        log_store, slots, key = table.log, table.slots, table.key
        if table.group_commit and groupable(self.summary, self.body):
            return GroupCommitLoop(self).run()
        timer = self.timer
        data = self._bytes()
        with timer.phase("stage"):
            log_store.stage(self.staged_name, data)
        started = policy.clock()
        checked = self.txn.read_version
        attempts = 0
        last_error: BaseException | None = None
        unknown: int | None = None  # a claim whose outcome we could not learn yet
        owner = default_owner(table.app_id)
        try:
            while True:
                try:
                    if unknown is not None:
                        # Look our transaction id up before claiming again: the earlier
                        # claim either landed (then we are done) or did not (retry).
                        found = slots.find_txn(key, self.txn.txn_id, max(0, unknown - 1))
                        unknown = None
                        if found is not None:
                            result = self._published(found, attempts, data)
                            if result is not None:
                                return result
                    # First attempt: the read snapshot was just refreshed, so guess that
                    # nothing won since and claim read_version+1 directly (one slot-store
                    # round trip fewer); a wrong guess only loses the claim.
                    latest = checked if attempts == 0 else table.latest_version()
                    if latest > checked:
                        with timer.phase("check"):
                            rebased = self.check_winners(table.commits_between(checked + 1, latest))
                        if rebased:
                            data = self._bytes()
                            with timer.phase("stage"):
                                log_store.stage(self.staged_name, data)
                        checked = latest
                    version = latest + 1
                    self.last_version = version
                    attempts += 1
                    try:
                        with timer.phase("claim"):
                            granted = slots.claim(
                                key, version, SlotClaim(self.txn.txn_id, self.staged_name, owner)
                            )
                    except SlotStoreUnavailableError:
                        unknown = version
                        raise
                    if granted:
                        result = self._published(version, attempts, data)
                        if result is not None:
                            return result
                    log.debug(
                        "slot taken",
                        extra={"txn_id": self.txn.txn_id, "version": version, "attempt": attempts},
                    )
                except (SlotStoreUnavailableError, SlotStoreError) as exc:
                    last_error = exc
                    log.warning("slot store unavailable during commit of txn %s: %s", self.txn.txn_id, exc)
                if policy.exhausted(max(attempts, 1), started):
                    raise self._exhausted(attempts, started, unknown, last_error) from last_error
                with timer.phase("backoff"):
                    policy.sleep(policy.delay(max(attempts, 1)))
        except (DeltaConcurrentModificationException, CommitFailedError, SlotStoreError):
            # Nothing was claimed: the commit provably did not land.
            log_store.delete_staged(self.staged_name)
            raise

    def _exhausted(
        self, attempts: int, started: float, unknown: int | None, last_error: BaseException | None
    ) -> EventlogError:
        elapsed = (self.policy.clock() - started) * 1000
        uri = self.table.uri
        if unknown is not None:
            return CommitStateUnknownError(
                f"the slot store for {uri} stayed unreachable for {elapsed:.0f} ms; the commit of txn "
                f"{self.txn.txn_id} may or may not have landed at version {unknown} (staged files kept)",
                txn_id=self.txn.txn_id,
                version=unknown,
            )
        if isinstance(last_error, (SlotStoreUnavailableError, SlotStoreError)):
            return SlotStoreError(
                f"commit of {self.info.operation} to {uri} failed: the slot store stayed unreachable for "
                f"{elapsed:.0f} ms; nothing was committed",
                uri=uri,
            )
        return CommitFailedError(
            f"commit of {self.info.operation} to {uri} failed after {attempts} attempts ({elapsed:.0f} ms): "
            "every version it tried was taken",
            attempts=attempts,
            start_version=self.txn.read_version + 1,
            last_attempted_version=self.last_version,
            elapsed_ms=elapsed,
            txn_id=self.txn.txn_id,
        )

    def _winner_bitmaps(self, commit: Commit) -> dict[str, AbstractBitMap64]:
        """DV bitmaps of a winner's files that row-level resolution compares with ours."""
        summary = self.summary
        if not summary.row_level:
            return {}
        interest = set(summary.dv_updates) | {c.path for c in summary.compaction}
        fs, root = self.table.log.fs, self.table.log.root
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
            self.summary = check_conflicts(self.summary, winner)
        rebuilt = self._rebuild_if_rebased()
        return self._rebase_timestamp(winners) or rebuilt

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

    def _published(self, version: int, attempts: int, data: bytes) -> CommitResult | None:
        table = self.table
        with self.timer.phase("publish"):
            published = table.publish_claimed(version, self.staged_name, data, self.txn.txn_id)
        if not published:
            return None  # a writer outside the slot store took this version: retry above it
        table.log.delete_staged(self.staged_name)
        self.txn.drop_unreferenced(self.summary.adds)
        commit = Commit(version, (self.info, *self.body))
        table.note_committed(commit)
        return self.result(version, attempts)

    def result(self, version: int, attempts: int) -> CommitResult:
        info = self.info
        metrics = dict(info.operation_metrics)
        return CommitResult(
            version, attempts, info.operation, metrics, self.txn.txn_id, timings=self.timer.result()
        )
