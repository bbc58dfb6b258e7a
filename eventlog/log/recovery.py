"""What to do with a claimed version slot whose commit is not in the log.

A claim is the commit point: once ``claim`` returned True the commit is decided, and its
bytes are the staged file the claim names. A slot found without ``<N>.json`` is one of:

========================================  ==================================================
found                                     what happens
========================================  ==================================================
the staged file is there                  anyone publishes it (the writer's own bytes, checked
                                          against the anchored digest): idempotent help that
                                          readers give too
**acknowledged** (the slot was marked     the commit was published and then removed from
complete, or a later version was          outside: :class:`CommitLostError`, for readers and
published after it) and no staged file    writers alike, until the file is restored or an
                                          operator accepts the loss (:meth:`accept_lost`)
never completed, no staged file, the      readers see the version before it (nothing was
writer may be alive                       acknowledged); writers wait (``CorruptLogError``)
never completed, no staged file, the      a *writer* (or ``slots repair``) resolves it with an
writer provably gone                      empty REPAIR commit recording the lost claim's
                                          anchored digest; readers never write it
========================================  ==================================================

"Reads stay reads": a reader never invents content. The only thing it writes is the staged
bytes a writer decided on, which is what that writer would have published.

An operator who cannot restore a lost acknowledged commit accepts the loss with
``eventlog slots repair --accept-lost N`` (:meth:`SlotRecovery.accept_lost`): a REPAIR commit
that says an acknowledged commit was lost, with its transaction id and digest. ``verify``
reports that version as ``lost`` from then on, unless the auditor names it in
``--accept-lost`` too.

Deferred completion marks (the ZooKeeper adapter batches a handle's marks for up to half a
second) leave one narrow window: a writer that published, deleted its staged file and died
before its mark was flushed, and whose commit file is then removed, looks never completed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from eventlog.errors import CommitLostError, CorruptLogError, InvalidInputError
from eventlog.log import in_commit_timestamps as ict
from eventlog.log.actions import ENGINE_INFO, CommitInfo
from eventlog.log.audit import anchor, chain_commit, read_audit
from eventlog.log.storage import LogStore
from lockstore import SlotRecord, SlotStore

logger = logging.getLogger("eventlog.log.recovery")

# For slot stores that cannot tell whether a writer lives: how old a claim with a lost
# staged file must be before a writer repairs it.
REPAIR_GRACE_SECONDS = 300.0
RECOVERY_MARK_AGE = 0.25  # a live owner publishes within milliseconds of its claim

#: ``operationParameters`` of REPAIR commits.
LOST_TXN = "lostTxnId"
LOST_DIGEST = "lostDigest"  # the content hash the slot store anchored for the lost claim
LOST_FILE_DIGEST = "lostFileDigest"  # SHA-256 of the lost file, as the next commit chained it
ACCEPTED_LOSS = "acceptedLoss"  # "true": an acknowledged commit was lost, accepted by an operator
NEVER_COMPLETED = "claim never completed: its writer is gone and its staged commit file is missing"
ACKNOWLEDGED_LOST = "acknowledged commit lost from the log; the loss was accepted by an operator"


class SlotRecovery:
    """Recovery of one table's claimed-but-unpublished slots (see the module docstring).

    ``prev_digest(version)``: the SHA-256 of commit ``version``'s file (what a commit after
    it chains to); ``note_digest(version, data)``: remember a published commit's bytes.
    """

    def __init__(
        self,
        log: LogStore,
        slots: SlotStore,
        key: str,
        *,
        prev_digest: Callable[[int], str | None],
        note_digest: Callable[[int, bytes], object],
        audit_key: Callable[[], bytes | None],
    ) -> None:
        self.log, self.slots, self.key = log, slots, key
        self._prev_digest, self._note_digest, self._audit_key = prev_digest, note_digest, audit_key

    @property
    def uri(self) -> str:
        return self.log.uri

    def record(self, version: int) -> SlotRecord:
        record = self.slots.get(self.key, version)
        if record is None:
            raise CorruptLogError(
                f"{self.uri}: slot store reports version {version} claimed but holds no claim",
                uri=self.uri,
                version=version,
            )
        return record

    def acknowledged(self, record: SlotRecord, claimed: int) -> bool:
        """Whether the commit of ``record``'s slot was provably published once: its slot was
        marked complete, or a later version was published or completed (a writer claims
        ``N+1`` only after ``N`` is in the log)."""
        if record.complete:
            return True
        for later in range(record.version + 1, max(claimed, record.version) + 2):
            if self.log.commit_exists(later):
                return True
            following = self.slots.get(self.key, later)
            if following is not None and following.complete:
                return True
        return False

    def lost(self, record: SlotRecord) -> CommitLostError:
        version, claim = record.version, record.claim
        return CommitLostError(
            f"{self.uri}: the acknowledged commit of version {version} (txn {claim.txn_id}, anchored "
            f"digest {claim.digest or 'none'}) is missing from the log and its staged file is gone: "
            f"it was removed from outside. Restore {self.log.commit_path(version)} from a backup, or "
            f"accept the loss with 'eventlog slots repair {self.uri} --accept-lost {version}' "
            "(verify then reports it as lost)",
            uri=self.uri,
            version=version,
            txn_id=claim.txn_id,
            anchored_digest=claim.digest,
        )

    def writer_gone(self, record: SlotRecord) -> bool:
        """Whether the claiming writer is provably gone (or, for stores that cannot tell,
        its claim is older than ``REPAIR_GRACE_SECONDS``)."""
        alive = self.slots.owner_alive(self.key, record.version)
        return alive is False or (alive is None and self.claim_age(record) >= REPAIR_GRACE_SECONDS)

    def claim_age(self, record: SlotRecord) -> float:
        """How old ``record``'s claim is: by the slot store's clock where it can tell (a
        claimer or a repairer hours ahead or behind must neither repair a live writer's
        fresh claim nor keep a dead one's for hours), else by the claimer's."""
        age = self.slots.claim_age(self.key, record.version)
        return record.age if age is None else age

    def staged(self, record: SlotRecord) -> bytes | None:
        """The staged bytes a claim names, checked against its anchored digest."""
        data = self.log.read_staged(record.claim.staged)
        if data is not None and record.claim.digest is not None and anchor(data) != record.claim.digest:
            raise CorruptLogError(
                f"{self.uri}: the staged file {record.claim.staged} of version {record.version} does not "
                "hash to the digest its slot anchored: it was changed after the claim; not publishing it",
                uri=self.uri,
                version=record.version,
            )
        return data

    def resolve(self, version: int, *, claimed: int, hot: bool, repair: bool) -> bool:
        """Publish claimed ``version`` from its staged file, or decide what its absence means.

        True when ``<version>.json`` is published now. False when the claim was never
        completed and stays unresolved for this caller (a reader, or a writer whose
        ``repair`` is off): the version is not visible. Raises :class:`CommitLostError` for
        an acknowledged commit that is gone, and :class:`CorruptLogError` to a repairing
        writer while the claiming writer may still be alive.

        ``hot``: found by a reader. A fresh claim's owner is usually publishing it this very
        moment (group commit wakes its members on the claim), so the helper publishes but
        leaves the completion mark (a slot-store write) to a live owner whose claim is
        younger than ``RECOVERY_MARK_AGE`` seconds.
        """
        record = self.record(version)
        data = self.staged(record)
        if data is None:
            if self.log.commit_exists(version):
                return True
            if self.acknowledged(record, claimed):
                raise self.lost(record)
            if not repair:
                return False
            if not self.writer_gone(record):
                raise CorruptLogError(
                    f"{self.uri}: version {version} was claimed by txn {record.claim.txn_id} "
                    f"({dict(record.claim.owner)}, {self.claim_age(record):.0f}s ago) but neither "
                    f"{version}.json nor its staged file {record.claim.staged} exists, and its writer may "
                    "still be alive; retry later (it is repaired once the writer is provably gone)",
                    uri=self.uri,
                    version=version,
                )
            data = self.repair_commit(record, reason=NEVER_COMPLETED)
        published = self.log.publish(version, record.claim.staged, data)
        if published:
            self._note_digest(version, data)
        fresh_live_owner = hot and (
            not published
            or (record.age < RECOVERY_MARK_AGE and self.slots.owner_alive(self.key, version) is True)
        )
        if not fresh_live_owner:
            self.slots.mark_complete(self.key, version)
        return True

    def repair_commit(self, record: SlotRecord, *, reason: str, accepted: bool = False) -> bytes:
        """An empty REPAIR commit at ``record``'s version, recording the lost claim."""
        version = record.version
        logger.warning(
            "repairing lost slot %s of %s (txn %s): %s", version, self.uri, record.claim.txn_id, reason
        )
        parameters = {
            "version": str(version),
            LOST_TXN: record.claim.txn_id,
            "owner": orjson.dumps(dict(record.claim.owner)).decode(),
            "reason": reason,
        }
        if record.claim.digest is not None:
            parameters[LOST_DIGEST] = record.claim.digest
        if accepted:
            parameters[ACCEPTED_LOSS] = "true"
            following = self.log.read_commit(version + 1)
            fields = read_audit(following) if following is not None else None
            if fields is not None and fields.prev is not None:
                parameters[LOST_FILE_DIGEST] = fields.prev  # keeps the chain after it checkable
        info = CommitInfo(
            timestamp=int(time.time() * 1000),
            operation="REPAIR",
            operation_parameters=parameters,
            isolation_level="SnapshotIsolation",
            is_blind_append=False,
            txn_id=str(uuid.uuid4()),
            engine_info=ENGINE_INFO,
        )
        # With in-commit timestamps on, the REPAIR is dated between its neighbours too.
        previous = self.log.read_commit(version - 1) if version > 0 else None
        info = ict.date_between(info, previous, self.log.read_commit(version + 1))
        return chain_commit([info], self._prev_digest(version - 1), self._audit_key())

    def repair(self, *, dry_run: bool, limit: int, accept_lost: frozenset[int]) -> list[dict[str, Any]]:
        """Finish or resolve the newest ``limit`` slots whose commit is not in the log, and
        report each action (:meth:`eventlog.table.Table.repair_slots`).

        A slot whose commit is published is only marked complete; a slot with a staged file
        is published from it; a never-completed slot with neither is resolved with a REPAIR
        commit once its writer is provably gone; an acknowledged commit that is gone is
        reported ``lost``, and resolved only when its version is in ``accept_lost``.
        """
        listed = set(LogStore.commit_versions(self.log.list_log()))
        claimed = self.slots.latest(self.key)
        records = {r.version: r for r in self.slots.recent(self.key, limit=limit)}
        for version in accept_lost:
            records.setdefault(version, self.accept_target(version))
        actions: list[dict[str, Any]] = []
        for version in sorted(records, reverse=True):
            record = records[version]
            if version in listed and record.complete and version not in accept_lost:
                continue
            entry: dict[str, Any] = {"version": version, "txn_id": record.claim.txn_id}
            entry["action"] = self._plan(record, version in listed, claimed, accept_lost)
            actions.append(entry)
        for entry in sorted(actions, key=lambda a: a["version"]):  # oldest first: chains link
            if not dry_run and not entry["action"].startswith(("skip", "lost")):
                self._apply(records[entry["version"]], entry["action"], claimed)
        return actions

    def _plan(self, record: SlotRecord, listed: bool, claimed: int, accept_lost: frozenset[int]) -> str:
        version = record.version
        if listed or self.log.commit_exists(version):
            if version in accept_lost:
                raise InvalidInputError(f"version {version} of {self.uri} is in the log: nothing was lost")
            return "mark-complete"
        if self.log.read_staged(record.claim.staged) is not None:
            return "publish-staged"
        if self.acknowledged(record, claimed):
            if version in accept_lost:
                return "accept-lost"
            return f"lost: acknowledged commit missing (restore it, or accept with --accept-lost {version})"
        if version in accept_lost:
            raise InvalidInputError(
                f"version {version} of {self.uri} was never acknowledged (its claim never completed): "
                "'slots repair' without --accept-lost resolves it once its writer is gone"
            )
        if self.writer_gone(record):
            return "repair-commit"
        return "skip: writer may be alive"

    def _apply(self, record: SlotRecord, action: str, claimed: int) -> None:
        version = record.version
        if action == "mark-complete":
            self.slots.mark_complete(self.key, version)
        elif action == "accept-lost":
            data = self.repair_commit(record, reason=ACKNOWLEDGED_LOST, accepted=True)
            if self.log.publish(version, record.claim.staged, data):
                self._note_digest(version, data)
            self.slots.mark_complete(self.key, version)
        else:  # publish-staged, repair-commit
            self.resolve(version, claimed=claimed, hot=False, repair=True)

    def accept_target(self, version: int) -> SlotRecord:
        """The slot record of a version named in ``--accept-lost``."""
        record = self.slots.get(self.key, version) if version >= 0 else None
        if record is None:
            raise InvalidInputError(
                f"version {version} of {self.uri} was never granted by the slot store: there is no "
                "acknowledged commit to accept the loss of"
            )
        return record
