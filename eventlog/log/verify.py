"""Verify the tamper-evidence chain of a table's log (:mod:`eventlog.log.audit`).

:func:`verify` walks the commits from the oldest one the log still holds and reports the
first version that was edited, removed, inserted or reordered, or a truncated tail. For
each version, in order:

1. **Its own hash.** The content hash recomputed from the file must equal the stored one
   ("edited" otherwise), and with an audit key so must the HMAC.
2. **Its anchor.** The version slot that granted the version recorded the commit's hash
   (``SlotClaim.digest``) in the slot store, a separate system: a commit whose whole chain
   was recomputed after an edit no longer matches it ("edited"). A REPAIR commit that
   resolved a lost slot is the one exception, and says so.
3. **Its link.** ``prev`` must be the SHA-256 of the previous file's bytes. When it is not,
   the previous commit is not the one this commit followed: ``prev`` naming an older
   version means commits were removed and the rest renumbered ("removed"), naming a later
   version means they were swapped ("reordered"), naming none that the log holds means a
   commit was put in ("inserted").

A missing version in the middle is "removed". A version slot above the newest commit file
whose staged commit is gone is a truncated tail ("truncated").

Tables written before chaining verify from the first chained commit on, and the report says
so in its notes. After log cleanup the walk starts at the oldest retained commit; its
``prev`` is checked against the chain head the checkpoint before it carries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import orjson

from eventlog.errors import TableNotFoundError
from eventlog.log.actions import CommitInfo, decode_commit
from eventlog.log.audit import digest as sha256
from eventlog.log.audit import read_audit, recompute
from eventlog.log.checkpoint import read_chain_head
from eventlog.log.commitlog import CommitLog
from eventlog.log.storage import LogStore

__all__ = ["VerifyReport", "verify"]

Progress = Callable[[int, int], None]  # (versions done, versions in all)


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`.

    ``problem`` is one of "edited", "removed", "inserted", "reordered", "truncated" (None
    when ``ok``), at ``first_bad_version``; ``detail`` says what was found. ``checked_from``
    is the first version walked and ``chained_from`` the first chained one.
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


class _Failure(Exception):
    def __init__(self, version: int, problem: str, detail: str) -> None:
        super().__init__(detail)
        self.version, self.problem, self.detail = version, problem, detail


def verify(commitlog: CommitLog, key: bytes | None = None, progress: Progress | None = None) -> VerifyReport:
    """Check the log of ``commitlog`` (see the module docstring); never changes anything."""
    log = commitlog.log
    versions = LogStore.commit_versions(log.list_log())
    if not versions:
        raise TableNotFoundError(commitlog.uri)
    first, last = versions[0], versions[-1]
    notes: list[str] = []
    state = _Walk(commitlog, key, notes)
    try:
        present = set(versions)
        missing = next((v for v in range(first, last + 1) if v not in present), None)
        if first > 0:
            state.prev_digest = read_chain_head(log.fs, log.log_dir, first - 1)
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
    except _Failure as failure:
        return state.report(first, False, failure)
    if state.chained_from is None:
        notes.append("no commit carries the hash chain (written before tamper evidence)")
    elif state.chained_from > first:
        notes.append(f"versions {first}-{state.chained_from - 1} predate the hash chain")
    return state.report(first, True, None)


class _Walk:
    """The state of one walk through the log."""

    def __init__(self, commitlog: CommitLog, key: bytes | None, notes: list[str]) -> None:
        self.commitlog, self.key, self.notes = commitlog, key, notes
        self.prev_digest: str | None = None  # SHA-256 of the previous file's bytes
        self.prev_version = -1
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
            if self.chained_from is not None or anchor is not None:
                problem = "edited" if anchor is not None else "inserted"
                raise _Failure(
                    version, problem, f"commit {version} carries no hash chain, unlike those before it"
                )
        else:
            if self.chained_from is None:
                self.chained_from = version
            content, mac = recompute(data, fields, self.key)
            if content != fields.hash:
                raise _Failure(version, "edited", f"commit {version}'s content does not match its hash")
            self._check_hmac(version, fields.hmac, mac)
            if anchor is not None:
                self.anchors += 1
                if anchor != fields.hash and not _repairs(data, record.claim.txn_id if record else ""):
                    raise self._anchor_failure(version, data, fields.hash, anchor)
            self._check_link(version, fields.prev)
        own = sha256(data)
        self.seen[own] = version
        self.prev_digest, self.prev_version = own, version
        self.checked += 1

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

    def _check_link(self, version: int, prev: str | None) -> None:
        expected = self.prev_digest
        if version == 0:
            expected = None
        elif expected is None:
            return  # first retained commit and no checkpoint chain head: nothing to link to
        if prev == expected:
            return
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
            raise _Failure(
                version,
                "truncated",
                f"the version slots reach version {latest} but the log ends at {last}: commits were cut off",
            )

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
        )


def _txn_id(data: bytes) -> str | None:
    """The transaction id in a commit's commitInfo (first line), or None."""
    try:
        first = orjson.loads(data.split(b"\n", 1)[0])
    except orjson.JSONDecodeError:
        return None
    info = first.get("commitInfo") if isinstance(first, dict) else None
    txn = info.get("txnId") if isinstance(info, dict) else None
    return str(txn) if txn is not None else None


def _repairs(data: bytes, lost_txn: str) -> bool:
    """Whether ``data`` is the REPAIR commit that resolved the lost claim of ``lost_txn``."""
    info = decode_commit(data)[0]
    return (
        isinstance(info, CommitInfo)
        and info.operation == "REPAIR"
        and info.operation_parameters.get("lostTxnId") == lost_txn
    )
