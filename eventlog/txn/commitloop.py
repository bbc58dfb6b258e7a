"""The commit loop: stage, conflict-check the winners, claim a version slot, publish.

One :class:`CommitLoop` runs per :meth:`eventlog.txn.transaction.Transaction.commit` (the
pipeline is described in :mod:`eventlog.txn.transaction`) on a
:class:`~eventlog.txn.attempt.CommitAttempt`; with group commit, groupable blind appends run
:class:`eventlog.txn.groupcommit.GroupCommitLoop` instead (the transaction chooses).
"""

from __future__ import annotations

import logging

from eventlog.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    DeltaConcurrentModificationException,
    EventlogError,
    SlotStoreError,
    StorageError,
    storage_error,
)
from eventlog.log.audit import anchor
from eventlog.log.commit import decode
from eventlog.log.commitlog import Published
from eventlog.txn.attempt import CommitAttempt, CommitResult
from lockstore import SlotClaim, SlotStoreUnavailableError, SlotStoreWriteRefusedError, default_owner

log = logging.getLogger("eventlog.commit")


class CommitLoop:
    """The retry loop of one commit (see the module docstring)."""

    def __init__(self, attempt: CommitAttempt) -> None:
        self.attempt = attempt
        self.table = attempt.target
        self.policy = self.table.retry_policy

    def run(self) -> CommitResult:
        attempt, table, policy = self.attempt, self.table, self.policy
        log_store, slots, key = table.log, table.slots, table.key
        timer = attempt.timer
        data = b""  # what is staged: the commit for the version claimed last
        started = policy.clock()
        checked = attempt.read_version
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
                        found = slots.find_txn(key, attempt.txn_id, max(0, unknown - 1))
                        unknown = None
                        if found is not None:
                            result = self._published(found, attempts, data)
                            if result is not None:
                                return result
                    # First attempt: the read snapshot was just refreshed, so guess that
                    # nothing won since and claim read_version+1 directly (one slot-store
                    # round trip fewer); a wrong guess only loses the claim.
                    latest = checked if attempts == 0 else table.latest_version(repair=True)
                    if latest > checked:
                        with timer.phase("check"):
                            attempt.check_winners(table.commits_between(checked + 1, latest))
                        checked = latest
                    version = latest + 1
                    attempt.last_version = version
                    # The bytes chain to version-1's hash: stage again whenever they change
                    # (another version, or a rebase). Never while a claim is in doubt: its
                    # slot names this staged file (``unknown`` is resolved above first).
                    fresh = attempt.bytes(version)
                    if fresh != data:
                        with timer.phase("stage"):
                            log_store.stage(attempt.staged_name, fresh)
                        data = fresh
                    attempts += 1
                    try:
                        with timer.phase("claim"):
                            claim = SlotClaim(attempt.txn_id, attempt.staged_name, owner, digest=anchor(data))
                            granted = slots.claim(key, version, claim)
                    except SlotStoreWriteRefusedError as exc:
                        # The store's storage refused the claim (its disk is full): nothing
                        # was claimed, so the commit provably did not land.
                        log_store.delete_staged(attempt.staged_name)
                        raise self._claim_refused(version, exc) from exc
                    except SlotStoreUnavailableError:
                        unknown = version
                        raise
                    if granted:
                        attempt.may_still_land = True  # claimed: readers may publish it from now on
                        result = self._published(version, attempts, data)
                        if result is not None:
                            return result
                        attempt.may_still_land = False  # another writer's commit holds the version
                    log.info(
                        "version %s taken by another writer; retrying",
                        version,
                        extra={
                            "table": table.uri,
                            "txn_id": attempt.txn_id,
                            "winning_version": version,
                            "attempt": attempts,
                        },
                    )
                except (SlotStoreUnavailableError, SlotStoreError) as exc:
                    last_error = exc
                    log.warning("slot store unavailable during commit of txn %s: %s", attempt.txn_id, exc)
                if policy.exhausted(max(attempts, 1), started):
                    raise self._exhausted(attempts, started, unknown, last_error) from last_error
                with timer.phase("backoff"):
                    policy.sleep(policy.delay(max(attempts, 1)))
        except (DeltaConcurrentModificationException, CommitFailedError, SlotStoreError):
            # Nothing was claimed: the commit provably did not land.
            log_store.delete_staged(attempt.staged_name)
            raise

    def _claim_refused(self, version: int, exc: SlotStoreWriteRefusedError) -> StorageError:
        cause = exc.__cause__
        path = getattr(cause, "filename2", None) or getattr(cause, "filename", None)
        return storage_error(
            self.table.uri, str(path or f"slot of version {version}"), "slot claim", cause or exc
        )

    def _exhausted(
        self, attempts: int, started: float, unknown: int | None, last_error: BaseException | None
    ) -> EventlogError:
        attempt = self.attempt
        elapsed = (self.policy.clock() - started) * 1000
        uri = self.table.uri
        if unknown is not None:
            return CommitStateUnknownError(
                f"the slot store for {uri} stayed unreachable for {elapsed:.0f} ms; the commit of txn "
                f"{attempt.txn_id} may or may not have landed at version {unknown} (staged files kept)",
                txn_id=attempt.txn_id,
                version=unknown,
            )
        if isinstance(last_error, (SlotStoreUnavailableError, SlotStoreError)):
            return SlotStoreError(
                f"commit of {attempt.info.operation} to {uri} failed: the slot store stayed unreachable for "
                f"{elapsed:.0f} ms; nothing was committed",
                uri=uri,
            )
        return CommitFailedError(
            f"commit of {attempt.info.operation} to {uri} failed after {attempts} attempts "
            f"({elapsed:.0f} ms): every version it tried was taken",
            attempts=attempts,
            start_version=attempt.read_version + 1,
            last_attempted_version=attempt.last_version,
            elapsed_ms=elapsed,
            txn_id=attempt.txn_id,
        )

    def _published(self, version: int, attempts: int, data: bytes) -> CommitResult | None:
        attempt, table = self.attempt, self.table
        with attempt.timer.phase("publish"):
            published = table.publish_claimed(version, attempt.staged_name, data, attempt.txn_id)
        if not published:
            return None  # a writer outside the slot store took this version: retry above it
        attempt.drop_unreferenced()
        if published is Published.PENDING:
            return attempt.result(version, attempts)  # a reader publishes it from the staged file
        table.log.delete_staged(attempt.staged_name)
        table.note_committed(decode(version, data))
        return attempt.result(version, attempts)
