"""Verify the tamper-evidence chain of a table's log (:mod:`eventlog.log.audit`).

:func:`verify` walks the commits from the oldest one the log still holds and reports the
first version that was edited, removed, inserted or reordered, or a truncated tail. For
each version, in order:

1. **Its own hash.** The content hash recomputed from the file must equal the stored one
   ("edited" otherwise), and with an audit key so must the HMAC.
2. **Its anchor.** The version slot that granted the version recorded the commit's hash
   (``SlotClaim.digest``) in the slot store, a separate system: a commit whose whole chain
   was recomputed after an edit no longer matches it ("edited"). A REPAIR commit that
   resolved a lost slot is the one exception, when it names the lost claim's transaction
   and anchored digest (:mod:`eventlog.log.recovery`). A REPAIR of a claim that never
   completed is noted; one that accepted the loss of an *acknowledged* commit is reported
   "lost", on every run, unless the auditor accepts that version too (``accept_lost``).
3. **Its link.** ``prev`` must be the SHA-256 of the previous file's bytes. When it is not,
   the previous commit is not the one this commit followed: ``prev`` naming an older
   version means commits were removed and the rest renumbered ("removed"), naming a later
   version means they were swapped ("reordered"), naming none that the log holds means a
   commit was put in ("inserted").

An unchained commit after the chain began that no version slot granted (or whose slot's
transaction committed later, having lost the version to it) was written by another Delta
writer outside the slots (Delta Spark, delta-rs): "unguarded", naming its engine, unless the
audit allows such commits (``allow_unguarded``), which it then notes.

With in-commit timestamps (:mod:`eventlog.log.in_commit_timestamps`) a commit whose
``inCommitTimestamp`` is not after the one of the commit before it is "non-monotonic": time
travel by timestamp could no longer tell the two apart, or would put them in the wrong order.

A missing version in the middle is "removed". A completed version slot above the newest
commit file whose staged commit is gone is a truncated tail ("truncated"); a claim above it
that never completed is noted (its writer died before publishing).

Anchors are only as good as the slot store they are looked up in. When chained commits
have no anchor there (a copy of the table at another location keyed by a shared store, a
lost slot store, the wrong ``--slots``), the report counts them (``unanchored``) and says
so in its notes; ``require_anchors`` makes that a failure ("unanchored").

Tables written before chaining verify from the first chained commit on, and the report says
so in its notes. After log cleanup the walk starts at the oldest retained commit; its
``prev`` is checked against the chain head the checkpoint before it carries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

import orjson

from eventlog.errors import TableNotFoundError
from eventlog.log.actions import CommitInfo, decode_commit
from eventlog.log.audit import digest as sha256
from eventlog.log.audit import read_audit, recompute
from eventlog.log.checkpoint import read_chain_head
from eventlog.log.commitlog import CommitLog
from eventlog.log.in_commit_timestamps import timestamp_of
from eventlog.log.recovery import ACCEPTED_LOSS, LOST_DIGEST, LOST_FILE_DIGEST, LOST_TXN
from eventlog.log.storage import LogStore
from lockstore import SlotClaim, SlotRecord

__all__ = ["VerifyReport", "verify"]

Progress = Callable[[int, int], None]  # (versions done, versions in all)


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`.

    ``problem`` is one of "edited", "removed", "inserted", "reordered", "truncated",
    "lost", "unanchored", "unguarded", "non-monotonic" (None when ``ok``), at ``first_bad_version``;
    ``detail`` says what was found. ``checked_from`` is the first version walked and
    ``chained_from`` the first chained one. ``unanchored``: chained commits the slot store
    holds no anchor for. ``unguarded``: (version, engine) of the commits other Delta
    writers made outside the version slots, as far as the walk went.
    """

    ok: bool
    first_bad_version: int | None
    problem: str | None
    detail: str | None
    checked_from: int
    chained_from: int | None
    versions_checked: int
    anchors_checked: int
    hmac_checked: bool
    notes: tuple[str, ...]
    unanchored: int = 0
    unguarded: tuple[tuple[int, str], ...] = ()


class _Failure(Exception):
    def __init__(self, version: int, problem: str, detail: str) -> None:
        super().__init__(detail)
        self.version, self.problem, self.detail = version, problem, detail


def verify(
    commitlog: CommitLog,
    key: bytes | None = None,
    progress: Progress | None = None,
    *,
    accept_lost: Collection[int] = (),
    require_anchors: bool = False,
    allow_unguarded: bool = False,
) -> VerifyReport:
    """Check the log of ``commitlog`` (see the module docstring); never changes anything.

    ``accept_lost``: versions whose accepted loss of an acknowledged commit this audit
    accepts too (noted instead of failing). ``require_anchors``: fail when chained commits
    have no anchor in the slot store. ``allow_unguarded``: accept commits other Delta
    writers made outside the version slots (noted, and listed in ``unguarded``).
    """
    log = commitlog.log
    versions = LogStore.commit_versions(log.list_log())
    if not versions:
        raise TableNotFoundError(commitlog.uri)
    first, last = versions[0], versions[-1]
    notes: list[str] = []
    state = _Walk(commitlog, key, notes, frozenset(accept_lost), allow_unguarded)
    try:
        present = set(versions)
        missing = next((v for v in range(first, last + 1) if v not in present), None)
        if first > 0:
            state.prev_digest = read_chain_head(log.fs, log.log_dir, first - 1)
            state.guarded = commitlog.slots.get(commitlog.key, first - 1) is not None
            notes.append(
                f"commits before version {first} were cleaned up: verified from version {first}"
                + ("" if state.prev_digest else " (no checkpoint chain head before it)")
            )
        for version in range(first, last + 1):
            if version == missing:
                raise _Failure(version, "removed", f"commit {version} is missing from the log")
            state.check(version)
            if progress is not None:
                progress(version - first + 1, last - first + 1)
        state.check_tail(last)
        state.check_anchored(require_anchors)
    except _Failure as failure:
        return state.report(first, False, failure)
    if state.chained_from is None:
        notes.append("no commit carries the hash chain (written before tamper evidence)")
    elif state.chained_from > first:
        notes.append(f"versions {first}-{state.chained_from - 1} predate the hash chain")
    return state.report(first, True, None)


class _Walk:
    """The state of one walk through the log."""

    def __init__(
        self,
        commitlog: CommitLog,
        key: bytes | None,
        notes: list[str],
        accept_lost: frozenset[int],
        allow_unguarded: bool,
    ) -> None:
        self.commitlog, self.key, self.notes, self.accept_lost = commitlog, key, notes, accept_lost
        self.prev_digest: str | None = None  # SHA-256 of the previous file's bytes
        self.lost_file_digest: str | None = None  # the previous commit's, when it was lost
        self.unanchored = 0
        self.first_unanchored: int | None = None
        self.allow_unguarded = allow_unguarded
        self.unguarded: list[tuple[int, str]] = []  # (version, engine) of other writers' commits
        # A slot granted an earlier version: from there on, a commit no slot granted is another
        # writer's even before the hash chain begins (e.g. another engine's log cleanup removed
        # every chained commit of ours, slot records staying).
        self.guarded = False
        self.prev_version = -1
        self.prev_ict: int | None = None  # the previous commit's inCommitTimestamp
        self.seen: dict[str, int] = {}  # file digest -> version
        self.chained_from: int | None = None
        self.hmac_from: int | None = None
        self.checked = 0
        self.anchors = 0

    def check(self, version: int) -> None:
        data = self.commitlog.log.read_commit(version)
        if data is None:
            raise _Failure(version, "removed", f"commit {version} is missing from the log")
        fields = read_audit(data)
        record = self.commitlog.slots.get(self.commitlog.key, version)
        anchor = record.claim.digest if record is not None else None
        if fields is None:
            if self.chained_from is not None or anchor is not None or (record is None and self.guarded):
                self._check_unchained(version, data, record)
        else:
            if self.chained_from is None:
                self.chained_from = version
            content, mac = recompute(data, fields, self.key)
            if content != fields.hash:
                raise _Failure(version, "edited", f"commit {version}'s content does not match its hash")
            self._check_hmac(version, fields.hmac, mac)
            repair = _repair(data)
            if anchor is not None:
                self.anchors += 1
                if anchor != fields.hash and not _resolves(repair, record.claim if record else None):
                    raise self._anchor_failure(version, data, fields.hash, anchor)
            else:
                self.unanchored += 1
                if self.first_unanchored is None:
                    self.first_unanchored = version
            self._check_link(version, fields.prev)
            self.lost_file_digest = None
            if repair is not None:
                self._check_repair(version, repair)
        self._check_timestamp(version, data)
        self.guarded = self.guarded or record is not None
        own = sha256(data)
        self.seen[own] = version
        self.prev_digest, self.prev_version = own, version
        self.checked += 1

    def _check_timestamp(self, version: int, data: bytes) -> None:
        """In-commit timestamps increase strictly from one commit to the next."""
        ict = timestamp_of(data)
        previous, self.prev_ict = self.prev_ict, ict
        if ict is not None and previous is not None and ict <= previous:
            raise _Failure(
                version,
                "non-monotonic",
                f"commit {version}'s inCommitTimestamp {ict} is not after commit {version - 1}'s "
                f"({previous})",
            )

    def _check_unchained(self, version: int, data: bytes, record: SlotRecord | None) -> None:
        """An unchained commit after the chain began: another Delta writer's (Delta Spark,
        delta-rs...), written outside the version slots, when no slot granted the version or
        the transaction the slot granted it to committed later (it lost the version to that
        writer and retried above it). Reported as "unguarded", naming the engine, unless the
        audit allows unguarded commits; otherwise a commit of ours was replaced ("edited") or
        one was put in ("inserted")."""
        engine = _engine(data) or "an unknown engine"
        lost_to_it = record is not None and record.claim.txn_id in self._later_txn_ids(version).values()
        if record is None or lost_to_it:
            self.unguarded.append((version, engine))
            if not self.allow_unguarded:
                raise _Failure(
                    version,
                    "unguarded",
                    f"commit {version} was written outside the version slots by {engine} "
                    "(allow_unguarded / --allow-unguarded accepts commits of other Delta writers)",
                )
            self.notes.append(f"version {version} was written outside the version slots by {engine}")
            return
        problem = "edited" if record.claim.digest is not None else "inserted"
        raise _Failure(version, problem, f"commit {version} carries no hash chain, unlike those before it")

    def _anchor_failure(self, version: int, data: bytes, found: str, anchored: str) -> _Failure:
        """Name what happened at ``version``, whose commit is not the one its slot granted.

        Commits are matched by the transaction id the slot recorded (hashes change when a
        chain is recomputed): the granted commit shows up later (commits were put in before
        it, or it was swapped with the one now here), the commit granted the next version is
        here (this one was removed and the rest renumbered), or neither (it was edited)."""
        slots, key = self.commitlog.slots, self.commitlog.key
        granted = slots.get(key, version)
        here = _txn_id(data)
        later = self._later_txn_ids(version)
        moved_to = next(
            (v for v, t in later.items() if granted is not None and t == granted.claim.txn_id), None
        )
        if moved_to is not None:
            record = slots.get(key, moved_to)
            swapped = record is not None and record.claim.txn_id == here
            what = "reordered" if swapped else "inserted"
            where = "swapped with" if swapped else "pushed to"
            return _Failure(
                version, what, f"the commit granted version {version} was {where} version {moved_to}"
            )
        following = slots.get(key, version + 1)
        if following is not None and here is not None and following.claim.txn_id == here:
            return _Failure(version, "removed", f"commit {version} was removed and the later ones renumbered")
        return _Failure(
            version,
            "edited",
            f"commit {version}'s hash {found[:12]}... differs from the one its version slot recorded "
            f"({anchored[:12]}...): the commit was rewritten",
        )

    def _later_txn_ids(self, version: int) -> dict[int, str]:
        """The transaction ids of the commits after ``version``."""
        log = self.commitlog.log
        out: dict[int, str] = {}
        for later in LogStore.commit_versions(log.list_log()):
            if later > version:
                data = log.read_commit(later)
                txn = _txn_id(data) if data is not None else None
                if txn is not None:
                    out[later] = txn
        return out

    def _check_hmac(self, version: int, stored: str | None, expected: str | None) -> None:
        if self.key is None:
            return
        if stored is None:
            if self.hmac_from is not None:
                raise _Failure(
                    version, "edited", f"commit {version} lacks the HMAC the commits before it carry"
                )
            return
        if self.hmac_from is None:
            self.hmac_from = version
            if version > (self.chained_from or 0):
                self.notes.append(f"HMACs start at version {version}")
        if stored != expected:
            raise _Failure(version, "edited", f"commit {version}'s HMAC does not match under the audit key")

    def _check_repair(self, version: int, repair: CommitInfo) -> None:
        """A REPAIR commit: noted, or "lost" when it accepted the loss of an acknowledged
        commit that this audit does not accept."""
        params = repair.operation_parameters
        txn, lost_digest = params.get(LOST_TXN, "?"), params.get(LOST_DIGEST)
        if lost_digest is None:
            self.notes.append(
                f"version {version}: a REPAIR commit without the lost claim's digest (older release)"
            )
        if params.get(ACCEPTED_LOSS) != "true":
            self.notes.append(
                f"version {version}: REPAIR of a claim that never completed (txn {txn}): its writer died "
                "before publishing, and nothing was acknowledged"
            )
            return
        what = f"the acknowledged commit of version {version} (txn {txn}, digest {lost_digest or 'unknown'})"
        if version not in self.accept_lost:
            raise _Failure(
                version,
                "lost",
                f"{what} was lost from the log; an operator accepted the loss with a REPAIR commit "
                f"(pass --accept-lost {version} to accept it in this audit too)",
            )
        self.notes.append(f"{what} was lost; its loss was accepted by an operator and by this audit")
        self.lost_file_digest = params.get(LOST_FILE_DIGEST)

    def _check_link(self, version: int, prev: str | None) -> None:
        expected = self.prev_digest
        if version == 0:
            expected = None
        elif expected is None:
            return  # first retained commit and no checkpoint chain head: nothing to link to
        if prev == expected or (prev is not None and prev == self.lost_file_digest):
            return  # (the second: this commit chained to the lost commit a REPAIR replaced)
        earlier = self.seen.get(prev) if prev is not None else None
        if earlier is not None:
            raise _Failure(
                version,
                "removed",
                f"commit {version} follows version {earlier}: the commits between were removed",
            )
        if prev is not None and self._later_version_with(prev, version) is not None:
            raise _Failure(version, "reordered", f"commit {version} follows a commit that comes after it")
        raise _Failure(
            version,
            "inserted",
            f"commit {version} does not follow commit {version - 1}: a commit was put in between",
        )

    def _later_version_with(self, wanted: str, version: int) -> int | None:
        log = self.commitlog.log
        for later in LogStore.commit_versions(log.list_log()):
            if later > version:
                data = log.read_commit(later)
                if data is not None and sha256(data) == wanted:
                    return later
        return None

    def check_tail(self, last: int) -> None:
        slots, key = self.commitlog.slots, self.commitlog.key
        latest = slots.latest(key)
        if latest <= last:
            return
        for version in range(last + 1, latest + 1):
            record = slots.get(key, version)
            if record is None:
                continue
            if self.commitlog.log.read_staged(record.claim.staged) is not None and not record.complete:
                self.notes.append(f"version {version} is claimed and being published (staged file present)")
                continue
            if not self.commitlog.recovery.acknowledged(record, latest):
                self.notes.append(
                    f"version {version} was claimed by txn {record.claim.txn_id} but never completed, and "
                    "its staged file is gone: its writer died before publishing ('eventlog slots repair' "
                    "resolves it)"
                )
                continue
            raise _Failure(
                version,
                "truncated",
                f"the version slots reach version {latest} but the log ends at {last}: commits were cut off",
            )

    def check_anchored(self, required: bool) -> None:
        """Say so when chained commits have no anchor; fail when anchors are ``required``."""
        if not self.unanchored:
            return
        first = self.first_unanchored
        detail = (
            f"{self.unanchored} chained commit(s), the first at version {first}, have no anchor in the slot "
            f"store ({self.commitlog.slots!r}): they are checked against the hash chain only. A copy of the "
            "table under another location, a lost slot store or the wrong --slots gives this"
        )
        self.notes.append(detail)
        if required and first is not None:
            raise _Failure(first, "unanchored", detail)

    def report(self, first: int, ok: bool, failure: _Failure | None) -> VerifyReport:
        return VerifyReport(
            ok=ok,
            first_bad_version=failure.version if failure else None,
            problem=failure.problem if failure else None,
            detail=failure.detail if failure else None,
            checked_from=first,
            chained_from=self.chained_from,
            versions_checked=self.checked,
            anchors_checked=self.anchors,
            hmac_checked=self.key is not None and self.hmac_from is not None,
            notes=tuple(self.notes),
            unanchored=self.unanchored,
            unguarded=tuple(self.unguarded),
        )


def _engine(data: bytes) -> str | None:
    """The ``engineInfo`` of a commit's commitInfo, wherever it stands in the file."""
    for line in data.splitlines():
        if b'"commitInfo"' in line:
            try:
                info = orjson.loads(line).get("commitInfo")
            except (orjson.JSONDecodeError, AttributeError):
                return None
            engine = info.get("engineInfo") if isinstance(info, dict) else None
            return str(engine) if engine is not None else None
    return None


def _txn_id(data: bytes) -> str | None:
    """The transaction id in a commit's commitInfo (first line), or None."""
    try:
        first = orjson.loads(data.split(b"\n", 1)[0])
    except orjson.JSONDecodeError:
        return None
    info = first.get("commitInfo") if isinstance(first, dict) else None
    txn = info.get("txnId") if isinstance(info, dict) else None
    return str(txn) if txn is not None else None


def _repair(data: bytes) -> CommitInfo | None:
    """The commitInfo of a REPAIR commit, or None for any other commit."""
    info = decode_commit(data)[0]
    return info if isinstance(info, CommitInfo) and info.operation == "REPAIR" else None


def _resolves(repair: CommitInfo | None, claim: SlotClaim | None) -> bool:
    """Whether ``repair`` is the REPAIR commit that resolved ``claim`` (whose commit was
    lost): it names the claim's transaction, and the digest the claim anchored."""
    if repair is None or claim is None:
        return False
    params = repair.operation_parameters
    recorded = params.get(LOST_DIGEST)
    return params.get(LOST_TXN) == claim.txn_id and (recorded is None or recorded == claim.digest)
