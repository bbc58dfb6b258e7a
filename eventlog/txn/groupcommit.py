"""Group commit: concurrent blind appends share one version.

Under contention every writer of a small append races for the next version slot and all
but one lose: each lost claim is a slot-store write (a quorum write in ZooKeeper), a
re-read of the winner and another attempt. With group commit
(``Table.open(..., group_commit=True)``) a *pure blind append* is queued in storage and
one writer claims the next version for every queued append::

    stage own commit atomically as  _eventlog/staged/q-<enqueued ns>-<checked>-<txn>.json
    loop: latest = latest_version();  read winners since ``checked``:
              a winner lists our txn     -> committed there, done (no slot-store write)
              else conflict-check them   -> raise on a conflict (see below)
          our turn? (oldest fresh queued file, or waited LEAD_AFTER without progress)
              no  -> wait for the latest version to move (a ZooKeeper watch), loop
              yes -> lead: gather queued appends that may join; stage the combined
                     commit; claim latest+1 (members listed in the claim)
                       granted -> publish, delete the members' queued files, done
                       taken   -> loop (the winner may have carried us)

Exactly once without any per-member slot-store write: claims are serialised by the
store (compare-and-set on the latest version), and a leader claiming version V has read
every commit below V, so it leaves out every queued append that a commit since the
append's ``checked`` version already carries. A member learns its fate the same way: it
reads the winners since its ``checked`` version in order and finds itself, or a conflict.

Only pure blind appends join: the commit adds files (``dataChange``, no deletion vector,
no row ids) and may write ``txn`` actions for the app ids it read. They read nothing, so
among the checker's rules only protocol, metadata and application-id changes can fail
them (:mod:`eventlog.txn.conflicts`, steps 1, 2 and 4); committing several in one version is
equivalent to committing them one after another. A leader leaves a member out when a
winner since the member's ``checked`` version changed the protocol or metadata or wrote
one of its app ids, or when its app ids overlap another member's. Such a member then
finds the conflict itself, with the full checker, and raises it. Raising is safe while
its file is still queued: a leader could only carry it at a version at or below the
conflicting winner, and every such version is already taken. Any other way out (retry
budget spent, an unexpected error) raises ``CommitStateUnknownError`` after withdrawing
the queued file, unless a claim of the writer's own is in doubt (then the file is the
staged commit recovery needs): afterwards only a leader claiming at that very moment can
still carry the append.

Clocks: the queue is ordered, and a queued file judged stale (its writer died, or leads on
its own), by when the *storage* stamped the file (its modification time: the file server's
kernel, S3's ``LastModified``), never by the clock of the writer that queued it: a writer
hours ahead or behind would otherwise look stale to everyone (never carried) or see every
other file as stale (carrying nobody), and the file of a writer that died hours ahead would
stay fresh, so a leader could still carry it after its application had retried the append.
"Now" for staleness is this writer's own queued file's stamp plus the monotonic time
since it was written. The enqueue time in the name (the writer's clock) only breaks ties
between files stamped alike (S3 stamps whole seconds), and is used in full only where the
storage reports no times. Staleness is a liveness rule, never a safety one: exactly once
rests on the claims and the commits a leader reads.

The combined commit has one ``commitInfo`` whose ``eventlog.groupCommit`` field lists every
member's own commit info (transaction id, operation, metrics, user metadata), so
auditors see each acknowledged append; Delta readers ignore the field.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eventlog import metrics
from eventlog.errors import (
    CommitStateUnknownError,
    DeltaConcurrentModificationException,
    SlotStoreError,
)
from eventlog.files import row_tracking
from eventlog.log.actions import (
    ENGINE_INFO,
    Action,
    ActionDecodeError,
    AddFile,
    CommitInfo,
    SetTransaction,
    decode_commit,
)
from eventlog.log.audit import anchor, chain_commit
from eventlog.log.commit import GROUP_FIELD, decode, member_txn_ids
from eventlog.log.commitlog import Published
from eventlog.log.storage import LogStore, file_mtime_ms
from eventlog.txn.attempt import CommitAttempt, CommitResult
from eventlog.txn.conflicts import TransactionSummary, WinningCommit
from lockstore import SlotClaim, SlotStoreUnavailableError, default_owner

log = logging.getLogger("eventlog.commit")

QUEUE_PREFIX = "q-"  # staged-file names of queued appends
MAX_MEMBERS = 64
MAX_LAG = 100  # versions a member may be behind the group's version and still join
# How long a queued writer waits without progress (no new version) before leading itself.
LEAD_AFTER_SECONDS = 0.05
# Queued files older than this (by the storage's clock) are ignored: their writer died or
# leads on its own.
STALE_SECONDS = 30.0


@dataclass(frozen=True)
class QueuedName:
    """The parts of a queued append's staged-file name."""

    enqueued_ns: int
    checked: int
    txn_id: str

    @property
    def name(self) -> str:
        # checked + 1 keeps the field non-negative (a read version may be -1).
        return f"{QUEUE_PREFIX}{self.enqueued_ns:020d}-{self.checked + 1:020d}-{self.txn_id}.json"

    @staticmethod
    def parse(name: str) -> QueuedName | None:
        if not name.startswith(QUEUE_PREFIX) or not name.endswith(".json"):
            return None
        parts = name[len(QUEUE_PREFIX) : -len(".json")].split("-", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
            return None
        return QueuedName(int(parts[0]), int(parts[1]) - 1, parts[2])


@dataclass(frozen=True)
class Queued:
    """A queued file as listed: its name's parts and when the storage stamped it."""

    queued: QueuedName
    stamped_ns: int  # the file's modification time (epoch ns); the name's enqueue time without one
    by_storage: bool  # whether ``stamped_ns`` is the storage's time

    @property
    def order(self) -> tuple[int, int, str]:
        """The queue's order: the storage's stamp, then the name (ties: S3's whole seconds)."""
        return (self.stamped_ns, self.queued.enqueued_ns, self.queued.txn_id)


def list_queued(log: LogStore) -> list[Queued]:
    """The queued files of ``log``'s staged directory with their modification times: one
    listing (a local file system also stats each queued file)."""
    out: list[Queued] = []
    if log.is_local:
        try:
            entries = os.scandir(log.staged_dir)
        except FileNotFoundError:
            return out
        with entries:
            for entry in entries:
                parsed = QueuedName.parse(entry.name)
                if parsed is None:
                    continue
                try:
                    out.append(Queued(parsed, entry.stat().st_mtime_ns, True))
                except FileNotFoundError:
                    continue  # carried or withdrawn since the listing
        return out
    with contextlib.suppress(AttributeError, TypeError):
        log.fs.invalidate_cache(log.staged_dir)  # other writers' files must be seen
    try:
        listed = log.fs.ls(log.staged_dir, detail=True)
    except FileNotFoundError:
        return out
    for info in listed:
        parsed = QueuedName.parse(str(info["name"]).rstrip("/").rsplit("/", 1)[-1])
        if parsed is None:
            continue
        mtime = file_mtime_ms(info)
        if mtime is None:
            out.append(Queued(parsed, parsed.enqueued_ns, False))
        else:
            out.append(Queued(parsed, mtime * 1_000_000, True))
    return out


@dataclass(frozen=True)
class Member:
    """One queued blind append, as the leader read it from its staged commit."""

    queued: QueuedName
    info: CommitInfo
    actions: tuple[Action, ...]  # its adds and txn actions
    app_ids: frozenset[str]  # the app ids it writes (and read)

    @property
    def txn_id(self) -> str:
        return self.queued.txn_id


def groupable(summary: TransactionSummary, body: Sequence[Action]) -> bool:
    """Whether a commit may join a group: a pure blind append (see the module docstring)."""
    if not summary.is_blind_append or summary.metadata is not None or summary.protocol is not None:
        return False
    if summary.removes or summary.domains or summary.dv_updates or summary.compaction:
        return False
    if summary.fail_on_any_winner or not all(_joinable(a) for a in body):
        return False
    if row_tracking.assigns(summary.read_protocol, summary.read_metadata):
        # Fresh row ids are assigned when a commit's bytes are made for its version; members
        # queue bytes already made, so row-tracking tables commit one transaction a version.
        return False
    written = {a.app_id for a in body if isinstance(a, SetTransaction)}
    return summary.read_set.app_ids <= written  # the queued file must show what it read


def _joinable(action: Action) -> bool:
    if isinstance(action, SetTransaction):
        return True
    return (
        isinstance(action, AddFile)
        and action.data_change
        and action.deletion_vector is None
        and action.base_row_id is None
    )


def parse_member(queued: QueuedName, data: bytes) -> Member | None:
    """A member from its queued file, or None if it cannot join."""
    try:
        actions = decode_commit(data)
    except ActionDecodeError:
        return None  # a foreign file: its writer commits on its own
    if not actions or not isinstance(actions[0], CommitInfo) or not actions[0].is_blind_append:
        return None
    if actions[0].txn_id != queued.txn_id:
        return None
    body = tuple(actions[1:])
    if not all(_joinable(a) for a in body):
        return None
    app_ids = frozenset(a.app_id for a in body if isinstance(a, SetTransaction))
    return Member(queued, actions[0], body, app_ids)


def member_blocked(member: Member, winners: Sequence[WinningCommit]) -> bool:
    """Whether a winner since the member's checked version keeps it out of the group."""
    return any(
        w.version > member.queued.checked
        and (w.metadata is not None or w.protocol is not None or bool(member.app_ids & w.app_ids))
        for w in winners
    )


def combine(members: Sequence[Member], *, txn_id: str, timestamp: int, read_version: int) -> list[Action]:
    """One commit carrying every member's actions, with a commitInfo that lists them."""
    infos = [m.info for m in members]
    operations = {i.operation for i in infos}
    params = [dict(i.operation_parameters) for i in infos]
    user_metadata = {i.user_metadata for i in infos}
    info = CommitInfo(
        timestamp=timestamp,
        operation=operations.pop() if len(operations) == 1 else "WRITE",
        operation_parameters=params[0] if all(p == params[0] for p in params) else {"mode": "Append"},
        read_version=read_version,
        isolation_level=infos[0].isolation_level,
        is_blind_append=True,
        txn_id=txn_id,
        engine_info=ENGINE_INFO,
        user_metadata=user_metadata.pop() if len(user_metadata) == 1 else None,
        operation_metrics=_sum_metrics(i.operation_metrics for i in infos),
        extra={GROUP_FIELD: [_member_entry(i) for i in infos]},
    )
    return [info, *(a for m in members for a in m.actions)]


def _member_entry(info: CommitInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "txnId": info.txn_id,
        "timestamp": info.timestamp,
        "operation": info.operation,
        "operationParameters": dict(info.operation_parameters),
        "readVersion": info.read_version,
        "operationMetrics": dict(info.operation_metrics),
    }
    if info.user_metadata is not None:
        entry["userMetadata"] = info.user_metadata
    return entry


def _sum_metrics(all_metrics: Iterable[Mapping[str, str]]) -> dict[str, str]:
    totals: dict[str, int] = {}
    for member_metrics in all_metrics:
        for key, value in member_metrics.items():
            if value.lstrip("-").isdigit():
                totals[key] = totals.get(key, 0) + int(value)
    return {k: str(v) for k, v in totals.items()}


class GroupCommitLoop:
    """The commit loop of a groupable commit (see the module docstring)."""

    def __init__(self, attempt: CommitAttempt) -> None:
        self.attempt = attempt
        self.policy = attempt.target.retry_policy
        self.table = attempt.target
        self.slots = attempt.target.slots
        self.key = attempt.target.key
        self.txn_id = attempt.txn_id
        self.checked = attempt.read_version
        # The enqueue time in the name is this writer's clock: a tie-break only (see the
        # module docstring); the storage's stamp of the file orders the queue.
        self.queued = QueuedName(time.time_ns(), self.checked, self.txn_id)
        self.staged_at = 0.0  # monotonic time just after the queued file was written
        # (the storage's stamp of the queued file, staged_at): the storage's "now" from here
        self.anchor: tuple[int, float] | None = None
        self.attempts = 0
        self.doubt_version: int | None = None  # a claim of ours whose outcome is not known yet

    def run(self) -> CommitResult:
        attempt, policy, table = self.attempt, self.policy, self.table
        # The queued file is also this writer's staged commit (what its own claims name).
        attempt.staged_name = self.queued.name
        timer = attempt.timer
        with timer.phase("stage"):
            # chained for the version it first hopes for; a leader re-chains it if needed
            table.log.stage(attempt.staged_name, attempt.bytes(self.checked + 1), atomic=True)
        self.staged_at = time.monotonic()
        started = policy.clock()
        last_error: BaseException | None = None
        progress = policy.clock()  # when the latest version last moved (or we arrived)
        seen = self.checked
        # The slot store's latest version when known without a round trip: a wait just
        # returned it, or (first turn) the snapshot was just refreshed: guess nothing won.
        claimed: int | None = self.checked
        try:
            while True:
                try:
                    latest, claimed = table.latest_version(claimed, repair=True), None
                    if latest > seen:
                        seen, progress = latest, policy.clock()
                    with timer.phase("check"):
                        found = self._catch_up(latest)
                    if found is not None:
                        return self._done(found)
                    if self.doubt_version is not None and latest >= self.doubt_version:
                        self.doubt_version = None  # read past it without finding us: it did not land
                    if self._my_turn(latest) or policy.clock() - progress >= LEAD_AFTER_SECONDS:
                        result = self._lead(latest)
                        if result is not None:
                            return result
                        progress = policy.clock()
                    else:
                        with timer.phase("wait"):
                            claimed = self.slots.await_latest(self.key, latest, LEAD_AFTER_SECONDS)
                        continue
                except (SlotStoreError, SlotStoreUnavailableError) as exc:
                    last_error = exc
                    log.warning("slot store unavailable during group commit of %s: %s", self.txn_id, exc)
                if policy.exhausted(max(self.attempts, 1), started):
                    elapsed = (policy.clock() - started) * 1000
                    reason = f"gave up after {elapsed:.0f} ms ({last_error or 'no version granted'})"
                    raise self._unknown(reason) from last_error
                if last_error is not None:
                    with timer.phase("backoff"):
                        policy.sleep(policy.delay(max(self.attempts, 1)))
                    last_error = None
        except DeltaConcurrentModificationException:
            table.log.delete_staged(attempt.staged_name)  # safe: see the module docstring
            raise
        except CommitStateUnknownError:
            raise
        except Exception as exc:
            # A leader may have carried this commit already: the outcome is unknown.
            raise self._unknown(f"failed while queued ({exc!r})") from exc
        except BaseException:
            attempt.may_still_land = True  # interrupted while queued: keep the files it wrote
            raise

    def _catch_up(self, latest: int) -> int | None:
        """Read the winners since ``checked``: the version carrying us, or None (checked)."""
        if latest <= self.checked:
            return None
        winners = self.table.commits_between(self.checked + 1, latest)
        for commit in winners:
            if self.txn_id in member_txn_ids(commit.commit_info):
                return commit.version
        self.attempt.check_winners(winners)  # raises the conflict; rebases in memory
        self.checked = latest
        return None

    def _my_turn(self, latest: int) -> bool:
        """Whether this writer's file is the oldest pending one in the queue (by the
        storage's stamps).

        Older files that a commit up to ``latest`` already carries do not count: a leader
        that died after its claim leaves its own file behind.
        """
        listed = list_queued(self.table.log)
        own = self._own(listed)
        if own is None:
            # Carried (its leader deleted it) or withdrawn: a claim finds out, safely.
            return True
        older = [q for q in self._fresh(listed, latest) if q.order < own.order]
        if not older:
            return True
        carried = self._carried(min(q.queued.checked for q in older) + 1, latest)
        return all(q.queued.txn_id in carried for q in older)

    def _own(self, listed: Sequence[Queued]) -> Queued | None:
        return next((q for q in listed if q.queued == self.queued), None)

    def _storage_now_ns(self, listed: Sequence[Queued]) -> int:
        """The storage's "now": the stamp of this writer's queued file plus the monotonic
        time since it was written (this process's clock only where the storage reports
        no times, or the file was never listed)."""
        if self.anchor is None:
            own = self._own(listed)
            if own is not None and own.by_storage:
                self.anchor = (own.stamped_ns, self.staged_at)
        if self.anchor is None:
            return time.time_ns()
        stamped, at = self.anchor
        return stamped + int((time.monotonic() - at) * 1e9)

    def _fresh(self, listed: Sequence[Queued], latest: int) -> list[Queued]:
        """Queued files of other writers that may still join a version after ``latest``:
        stamped by the storage within ``STALE_SECONDS``, and checked within ``MAX_LAG``."""
        horizon = self._storage_now_ns(listed) - int(STALE_SECONDS * 1e9)
        return [
            q
            for q in listed
            if q.queued.txn_id != self.txn_id
            and q.stamped_ns >= horizon
            and q.queued.checked >= latest - MAX_LAG
        ]

    def _carried(self, first: int, last: int) -> set[str]:
        """The transactions that the commits ``first..last`` carry."""
        return {txn for c in self.table.commits_between(first, last) for txn in member_txn_ids(c.commit_info)}

    def _lead(self, latest: int) -> CommitResult | None:
        attempt, table = self.attempt, self.table
        version = latest + 1
        attempt.last_version = version
        with attempt.timer.phase("gather"):
            members = self._gather(version)
        self.attempts += 1
        if len(members) == 1:
            actions: list[Action] = [attempt.info, *attempt.body]
            data = attempt.bytes(version)
            claim = SlotClaim(
                self.txn_id, attempt.staged_name, default_owner(table.app_id), digest=anchor(data)
            )
            if data != table.log.read_staged(attempt.staged_name):
                # Rebased since it was queued: the queued file is never rewritten (a leader
                # may be reading it), so the rebased commit is staged under a new name.
                claim = dataclasses.replace(claim, staged=f"{self.txn_id}-{uuid.uuid4().hex[:8]}.json")
                table.log.stage(claim.staged, data)
        else:
            group_id = str(uuid.uuid4())
            combined = combine(
                members, txn_id=group_id, timestamp=attempt.commit_timestamp(version), read_version=latest
            )
            actions = attempt.dated(combined, version)
            data = chain_commit(actions, table.commit_digest(version - 1), table.audit_key)
            ids = tuple(m.txn_id for m in members)
            claim = SlotClaim(
                group_id, f"group-{group_id}.json", default_owner(table.app_id), ids, digest=anchor(data)
            )
            table.log.stage(claim.staged, data)
        try:
            with attempt.timer.phase("claim"):
                granted = self.slots.claim(self.key, version, claim)
        except SlotStoreUnavailableError:
            return self._after_unknown_claim(version, claim)
        if not granted:
            if claim.staged != attempt.staged_name:
                table.log.delete_staged(claim.staged)
            return None
        attempt.may_still_land = True  # claimed: readers may publish it from now on
        result = self._publish(version, claim, data, actions, members)
        attempt.may_still_land = result is not None  # else another writer's commit holds it
        return result

    def _publish(
        self, version: int, claim: SlotClaim, data: bytes, actions: list[Action], members: Sequence[Member]
    ) -> CommitResult | None:
        table = self.table
        with self.attempt.timer.phase("publish"):
            published = table.publish_claimed(version, claim.staged, data, claim.txn_id)
        if not published:
            return None  # a writer outside the slot store took the version: go again
        metrics.observe_group_commit(len(members))
        pending = published is Published.PENDING  # a reader publishes it from claim.staged
        for member in members[1:]:
            if not (pending and member.queued.name == claim.staged):
                table.log.delete_staged(member.queued.name)
        if pending:
            return self._done(version, keep=claim.staged)
        if claim.staged != self.attempt.staged_name:
            table.log.delete_staged(claim.staged)
        table.note_committed(decode(version, data))
        return self._done(version)

    def _after_unknown_claim(self, version: int, claim: SlotClaim) -> CommitResult | None:
        """The claim's outcome is unknown: look it up before anything else happens."""
        self.doubt_version = version  # until the lookup, or a later catch-up, answers
        found = self.slots.find_txn(self.key, claim.txn_id, version)
        self.doubt_version = None
        if found is None:
            raise SlotStoreUnavailableError(f"claim of version {version} failed; nothing was claimed")
        return self._done(found) if self.table.latest_version() >= found else None

    def _gather(self, version: int) -> list[Member]:
        """This writer first, then the queued appends that may join at ``version``."""
        attempt, table = self.attempt, self.table
        own_ids = frozenset(a.app_id for a in attempt.body if isinstance(a, SetTransaction))
        members = [Member(self.queued, attempt.info, tuple(attempt.body), own_ids)]
        listed = sorted(self._fresh(list_queued(table.log), version - 1), key=lambda q: q.order)
        queued = [q.queued for q in listed[: MAX_MEMBERS - 1]]
        if not queued:
            return members
        # Commits since the oldest candidate's checked version: what may already carry a
        # candidate, or block it.
        commits = table.commits_between(min(q.checked for q in queued) + 1, version - 1)
        carried = {txn: c.version for c in commits for txn in member_txn_ids(c.commit_info)}
        winners = [WinningCommit.of(c) for c in commits]
        used = set(own_ids)
        for q in queued:
            if q.txn_id in carried:
                # Left behind by a leader that died after its claim; published, so unneeded.
                table.log.delete_staged(q.name)
                continue
            data = table.log.read_staged(q.name)
            member = parse_member(q, data) if data is not None else None
            if member is None or member.app_ids & used or member_blocked(member, winners):
                continue
            used |= member.app_ids
            members.append(member)
        return members

    def _done(self, version: int, *, keep: str | None = None) -> CommitResult:
        """The commit landed at ``version``: its staged file goes (unless it is ``keep``,
        the staged commit of a claim not yet published)."""
        attempt = self.attempt
        if attempt.staged_name != keep:
            self.table.log.delete_staged(attempt.staged_name)
        attempt.drop_unreferenced()
        return attempt.result(version, max(self.attempts, 1))

    def _unknown(self, reason: str) -> CommitStateUnknownError:
        """Leaving without knowing the outcome: withdraw from the queue if that is safe.

        A leader may already have carried this commit, so the outcome stays unknown. But
        unless a claim of this writer's own is in doubt (its staged file is the queued file,
        which recovery would need), the queued file is deleted: no later leader can carry
        the commit, only one that read the file already and is claiming right now.
        """
        withdrawn = False
        if self.doubt_version is None:
            with contextlib.suppress(OSError):  # best effort: the error raised says what is known
                self.table.log.delete_staged(self.attempt.staged_name)
                withdrawn = True
        after = (
            "it was withdrawn from the queue, so only a leader claiming at this moment can still carry it"
            if withdrawn
            else "its own claim may have landed"
        )
        return CommitStateUnknownError(
            f"group commit of txn {self.txn_id} to {self.table.uri} {reason}; {after}: look its txn id "
            "up in the history before retrying",
            txn_id=self.txn_id,
            version=self.attempt.last_version,
        )
