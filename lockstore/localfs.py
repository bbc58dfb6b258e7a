"""Local-file :class:`~lockstore.base.SlotStore`: safe across processes on one machine.

Layout, one directory per table under ``root``::

    root/<sanitised table key>-<sha1[:12]>/
        00000000000000000007.slot   claim of version 7: a symlink whose target text is the JSON
                                    {"claim": ..., "claimed_at": ...} (or a file with that JSON)
        00000000000000000007.done   empty; present once version 7 is published
        _latest                     best-effort hint: symlink to a recently claimed slot
        _table_id                   the table id bound to these slots
        .tmp-*                      in-flight temp files (a crash may leave some; they are ignored)

Exclusivity comes from ``symlink(2)`` (or ``link(2)``), which fails with EEXIST when the
name exists, atomically, on local filesystems (like ``O_CREAT | O_EXCL``). A claim is one
``symlink`` whose target text *is* the claim's JSON: it appears with its whole content in
one step, so it is never seen partially written, and it costs one metadata operation
instead of three (payloads too long for a symlink fall back to a temp file linked into
place). Network filesystems (NFS, SMB, FUSE object-store mounts) may not give
these guarantees; use the ZooKeeper adapter across machines.

Durability: by default nothing is fsynced, so claims survive the crash of any process but
not the loss of the machine's page cache (power failure, kernel crash). Pass ``fsync=True``
to sync the slot file and its directory before ``claim`` returns (and the entries of the
directories the store creates), at a latency cost.

Claim ages (:meth:`LocalFileSlotStore.claim_age`, for the repair of a claim whose staged
commit is gone): the slot file's modification time, stamped by the kernel, against that of
a probe file written then, never the ``claimed_at`` in the claim (the claimer's clock, kept
for operators).

Leases (:meth:`LocalFileSlotStore.acquire_lease`): one ``flock(2)``-ed file per lease under
``root/_leases``, held on an open descriptor that dies with its process; see
:mod:`lockstore.localfs_leases`, which holds them.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from typing import Any

from lockstore.base import (
    Lease,
    LeaseOwner,
    LeaseSet,
    LockstoreError,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    SlotStoreUnavailableError,
    SlotStoreWriteRefusedError,
    TableBindingError,
    check_range_request,
)
from lockstore.localfs_leases import _HELD as _HELD  # the leases this process holds
from lockstore.localfs_leases import (
    acquire_lease_file,
    lease_file_owner,
    lease_file_path,
    make_dirs,
    sync_dir,
)

_SLOT = ".slot"
_DONE = ".done"
# A symlink target may hold up to PATH_MAX bytes, but one longer than NAME_MAX (255) makes
# every stat() that follows the link fail with ENAMETOOLONG (pathlib's is_file() in a walk
# of the table directory, for one): longer claims are written as regular files.
_MAX_SYMLINK_PAYLOAD = 255
_HINT = "_latest"
_TABLE_ID = "_table_id"
_COUNTERS = "_counters"  # <name>: the counter's value (replaced by rename); <name>.lock: flock-ed
_TMP_PREFIX = ".tmp-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_SAFE_LEN = 64
_HINT_REPAIR_DISTANCE = 32  # latest() rewrites a hint that lags by this many versions
# claim() refreshes the hint only every this many versions: the forward probe in latest()
# costs one stat per version of lag (~4 us), a hint update a symlink and a rename (~70 us).
_HINT_EVERY = 16


def table_dir_name(table: str) -> str:
    """The directory name of ``table``'s slots: readable prefix plus a hash that keeps keys apart.

    Distinct keys that sanitise to the same text (``s3://b/t`` and ``s3:/b/t``) still get
    distinct directories through the sha1 suffix.
    """
    digest = hashlib.sha1(table.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()[:12]
    # strip(".") keeps the name from being hidden or from looking like "." / "..".
    safe = _UNSAFE.sub("_", table).strip("._-")[:_MAX_SAFE_LEN]
    return f"{safe}-{digest}" if safe else digest


def _slot_name(version: int) -> str:
    return f"{version:020d}{_SLOT}"


def _done_name(version: int) -> str:
    return f"{version:020d}{_DONE}"


def _parse_slot_name(name: str) -> int:
    """The version named by a slot file name, or -1 if ``name`` is not one."""
    if len(name) == 20 + len(_SLOT) and name.endswith(_SLOT) and name[:20].isdigit():
        return int(name[:20])
    return -1


def _exists(path: str) -> bool:
    # Not os.path.exists: that swallows every OSError (EACCES, EIO, ENOTDIR), which would make
    # an unreadable store look empty instead of unavailable. lstat, because a claim is a
    # symlink whose "target" (the claim's JSON) is no file.
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _read_if_exists(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _unlink_quietly(path: str) -> None:
    # Only used for temp files: a leftover temp is harmless (ignored by every reader), while an
    # error here could mask the real outcome of a claim that already succeeded.
    with contextlib.suppress(OSError):
        os.unlink(path)


class LocalFileSlotStore(SlotStore):
    """Version slots as files under ``root``; exclusive across processes of one machine.

    Guarantees: exclusive grant (``link(2)`` put-if-absent), durable record (slot files are
    never rewritten; see the module docstring about fsync), monotone ``latest`` under the
    engine's "claim latest + 1" rule, idempotent ``mark_complete``, persistent ``bind``.
    ``latest`` costs a hint read plus two ``stat`` calls, never a directory listing, unless
    the hint is found to be invalid. OS errors other than the expected "exists"/"missing"
    are raised as :class:`SlotStoreUnavailableError` (outcome unknown). ``root`` is created
    on first write if missing. The object is thread-safe; it holds no open resources but
    the descriptors of the leases it granted (see :mod:`lockstore.localfs_leases`), which
    ``close`` releases.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self._root = os.path.abspath(os.fspath(root))
        self._fsync = fsync
        self._dirs: dict[str, str] = {}  # table key -> slot directory (a cache of pure computation)
        self._made: set[str] = set()  # directories this object has created or seen
        self._leases = LeaseSet()

    @property
    def root(self) -> str:
        """Absolute path of the store's root directory."""
        return self._root

    def table_dir(self, table: str) -> str:
        """Absolute path of the directory holding ``table``'s slots (may not exist yet)."""
        directory = self._dirs.get(table)
        if directory is None:
            directory = os.path.join(self._root, table_dir_name(table))
            self._dirs[table] = directory
        return directory

    # ------------------------------------------------------------------ port

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        """Put-if-absent via ``link(2)``: True for exactly one caller per ``(table, version)``."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        payload = json.dumps(
            {"claim": _compact(claim.to_dict()), "claimed_at": round(time.time(), 3)}, separators=(",", ":")
        ).encode("utf-8")
        directory = self.table_dir(table)
        slot = os.path.join(directory, _slot_name(version))
        try:
            # Cheap early refusal (one stat) for the common lost race; link() below still
            # decides every case this check does not catch.
            if _exists(slot):
                return False
            try:
                if not self._place_slot(directory, slot, payload):
                    return False
            except (FileExistsError, FileNotFoundError):
                raise
            except OSError as exc:
                # symlink(2) and link(2) create the slot whole or not at all: refused here,
                # nothing was claimed.
                raise SlotStoreWriteRefusedError(
                    f"claim of version {version} of {table!r} in {directory}: {exc}", errno=exc.errno
                ) from exc
            if self._fsync:
                self._sync_dir(directory)
        except OSError as exc:
            raise SlotStoreUnavailableError(
                f"claim of version {version} of {table!r} in {directory}: {exc}"
            ) from exc
        # The slot is ours from here on: the hint is best-effort and must not turn a granted
        # claim into an error (which callers would have to treat as "outcome unknown").
        # Skip the hint only when the forward probe from an older hint reaches this slot
        # anyway: the previous slot exists (every gap start rewrote the hint itself).
        contiguous = version > 0 and _exists(os.path.join(directory, _slot_name(version - 1)))
        if not contiguous or version % _HINT_EVERY == 0:
            with contextlib.suppress(OSError):
                self._raise_hint(directory, version)
        return True

    def latest(self, table: str) -> int:
        """The highest claimed version (exact under the claim-latest+1 rule), or -1."""
        directory = self.table_dir(table)
        try:
            hint = self._read_hint(directory)
            if hint is None and not _exists(os.path.join(directory, _slot_name(0))):
                return -1  # fresh table: no hint and no version 0
            if hint is None or hint < 0 or not _exists(os.path.join(directory, _slot_name(hint))):
                # No usable hint although slots exist (a crash between link and hint update,
                # damage, or a slot released by repair): one listing, then repair the hint so
                # the next call is fast again. Probing from 0 instead would cost O(N) stats.
                version = self._scan(directory)
                if version >= 0:
                    with contextlib.suppress(OSError):
                        self._write_hint(directory, version)
            else:
                version = hint
            # The hint may lag (it is written after the slot, and a slower claimer may have
            # replaced it with a lower value), so always probe forward. Under the engine's
            # gapless rule this finds the true latest.
            start = version
            while _exists(os.path.join(directory, _slot_name(version + 1))):
                version += 1
            if version - start >= _HINT_REPAIR_DISTANCE:
                # A far-behind hint would make every reader probe the same long stretch.
                with contextlib.suppress(OSError):
                    self._raise_hint(directory, version)
        except OSError as exc:
            raise SlotStoreUnavailableError(f"latest of {table!r} in {directory}: {exc}") from exc
        return version

    def get(self, table: str, version: int) -> SlotRecord | None:
        """The stored claim of ``version``, or None if it was never claimed.

        Raises :class:`LockstoreError` if the slot file is not valid (it is only ever
        created complete, so this means outside damage).
        """
        if version < 0:
            return None
        directory = self.table_dir(table)
        path = os.path.join(directory, _slot_name(version))
        try:
            try:
                raw: bytes | str = os.readlink(path)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: a regular file (long payload)
                    raise
                with open(path, "rb") as f:
                    raw = f.read()
            complete = _exists(os.path.join(directory, _done_name(version)))
        except OSError as exc:
            raise SlotStoreUnavailableError(f"reading {path}: {exc}") from exc
        try:
            data: dict[str, Any] = json.loads(raw)
            return SlotRecord(
                version, SlotClaim.from_dict(_expand(data["claim"])), complete, float(data["claimed_at"])
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LockstoreError(f"corrupt slot file {path}: {exc}") from exc

    def claim_age(self, table: str, version: int) -> float | None:
        """The slot file's age by this machine's kernel clock: its modification time (a
        symlink's is when it was made) against that of a probe file written now (this
        process's clock only if the probe cannot be written)."""
        if version < 0:
            return None
        directory = self.table_dir(table)
        try:
            try:
                claimed = os.lstat(os.path.join(directory, _slot_name(version))).st_mtime_ns
            except FileNotFoundError:
                return None
            try:
                probe = self._write_temp(directory, b"")
            except OSError:  # a full or read-only disk: the local clock is the next best
                now = time.time_ns()
            else:
                try:
                    now = os.stat(probe).st_mtime_ns
                finally:
                    _unlink_quietly(probe)
        except OSError as exc:
            raise SlotStoreUnavailableError(
                f"age of version {version} of {table!r} in {directory}: {exc}"
            ) from exc
        return max(0.0, (now - claimed) / 1e9)

    def mark_complete(self, table: str, version: int) -> None:
        """Create ``<version>.done``; idempotent. Raises :class:`SlotNotClaimedError` if unclaimed."""
        directory = self.table_dir(table)
        try:
            if version < 0 or not _exists(os.path.join(directory, _slot_name(version))):
                raise SlotNotClaimedError(table, version)
            # O_CREAT without O_EXCL: an existing marker is success, whoever created it.
            fd = os.open(os.path.join(directory, _done_name(version)), os.O_WRONLY | os.O_CREAT, 0o644)
            os.close(fd)
            if self._fsync:
                self._sync_dir(directory)
        except OSError as exc:
            raise SlotStoreUnavailableError(
                f"mark_complete of version {version} of {table!r} in {directory}: {exc}"
            ) from exc

    def bind(self, table: str, table_id: str) -> None:
        """Bind ``table``'s slots to ``table_id`` once; raise :class:`TableBindingError` on another id."""
        directory = self.table_dir(table)
        path = os.path.join(directory, _TABLE_ID)
        try:
            raw = _read_if_exists(path)  # bound already (every open but the first): no write
            if raw is None:
                # Link a complete temp file rather than O_EXCL-create and then write: a
                # concurrent binder must never read an empty id and report a bogus conflict.
                tmp = self._write_temp(directory, table_id.encode("utf-8"))
                try:
                    os.link(tmp, path)
                    if self._fsync:
                        self._sync_dir(directory)
                    return
                except FileExistsError:
                    with open(path, "rb") as f:
                        raw = f.read()
                finally:
                    _unlink_quietly(tmp)
        except OSError as exc:
            raise SlotStoreUnavailableError(f"binding {table!r} in {directory}: {exc}") from exc
        try:
            bound = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LockstoreError(f"corrupt table id file {path}: {exc}") from exc
        if bound != table_id:
            raise TableBindingError(table, bound, table_id)

    def reserve_range(self, table: str, name: str, count: int, floor: int = 0) -> int:
        """The counter file read and replaced (temp file + rename) under ``flock(2)`` of a
        lock file beside it: one holder at a time across the processes of this machine, and
        a crash mid-way leaves the old value or the new one, never a torn one."""
        check_range_request(count, floor)
        directory = os.path.join(self.table_dir(table), _COUNTERS)
        path = os.path.join(directory, table_dir_name(name))
        try:
            self._makedirs(directory)
            fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close below
                try:
                    with open(path, "rb") as f:
                        current = int(f.read().decode("ascii") or "0")
                except FileNotFoundError:
                    current = 0
                first = max(current, floor)
                tmp = self._write_temp(directory, str(first + count).encode("ascii"))
                os.replace(tmp, path)
                if self._fsync:
                    self._sync_dir(directory)
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            raise SlotStoreUnavailableError(f"counter {name!r} of {table!r} in {directory}: {exc}") from exc
        return first

    def lease_path(self, name: str) -> str:
        """Absolute path of the file of lease ``name`` (may not exist yet)."""
        return lease_file_path(self._root, name)

    def acquire_lease(self, name: str, owner: LeaseOwner) -> Lease:
        """flock the lease file (see :mod:`lockstore.localfs_leases`); :class:`LeaseHeldError`
        naming the holder if a live process holds it. OS errors raise :class:`SlotStoreUnavailableError`."""
        stamped = owner.stamped()
        lease = acquire_lease_file(self.lease_path(name), name, stamped, self._made, fsync=self._fsync)
        return self._leases.add(lease)

    def lease_owner(self, name: str) -> LeaseOwner | None:
        """The holder's record if the lease file is locked (a live process holds it), else None."""
        return lease_file_owner(self.lease_path(name), name)

    def close(self) -> None:
        """Release the leases acquired through this object; the store stays usable (it holds
        no other open files or connections)."""
        self._leases.release_all()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._root!r}, fsync={self._fsync})"

    # ------------------------------------------------------------- helpers

    def _place_slot(self, directory: str, slot: str, payload: bytes) -> bool:
        """Create the slot file ``slot`` holding ``payload`` (a symlink's target when short
        enough, else a linked temp file); False if it already exists."""
        if len(payload) <= _MAX_SYMLINK_PAYLOAD:
            if directory not in self._made:
                self._makedirs(directory)
                self._made.add(directory)
            try:
                try:
                    os.symlink(payload.decode("utf-8"), slot)
                except FileNotFoundError:
                    # The directory vanished after we cached it (an operator or test
                    # removed the root): recreate it once.
                    self._makedirs(directory)
                    os.symlink(payload.decode("utf-8"), slot)
            except FileExistsError:
                return False
            return True
        tmp = self._write_temp(directory, payload)
        try:
            os.link(tmp, slot)
        except FileExistsError:
            return False
        finally:
            _unlink_quietly(tmp)
        return True

    def _write_temp(self, directory: str, data: bytes) -> str:
        """Write ``data`` to a fresh uniquely named file in ``directory``; return its path."""
        # pid + random: unique across processes and threads without any shared counter.
        tmp = os.path.join(directory, f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        if directory not in self._made:
            self._makedirs(directory)
            self._made.add(directory)
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            # The directory vanished after we cached it (e.g. a test or an operator removed
            # the root): recreate it once.
            self._makedirs(directory)
            fd = os.open(tmp, flags, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp

    def _read_hint(self, directory: str) -> int | None:
        """The hinted version; None if there is no hint, -1 if it is not a valid hint."""
        try:
            target = os.readlink(os.path.join(directory, _HINT))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a symlink: foreign or damaged; rebuild it
                return -1
            raise
        return _parse_slot_name(target)

    def _write_hint(self, directory: str, version: int) -> None:
        # A symlink whose target names the slot, not a regular file holding the number: ext4
        # (auto_da_alloc) forces data writeback when a regular file with data is renamed over
        # another, which costs ~100+ us per claim; a symlink carries no data blocks (~15 us).
        tmp = os.path.join(directory, f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        os.symlink(_slot_name(version), tmp)
        try:
            os.replace(tmp, os.path.join(directory, _HINT))
        except BaseException:
            _unlink_quietly(tmp)
            raise

    def _raise_hint(self, directory: str, version: int) -> None:
        # Only ever raise the hint, so a claim below the latest (the port allows gaps) does not
        # pull ``latest`` down. Read-compare-replace is not atomic across processes; a lost
        # race leaves the hint lower than it should be, which the forward probe in ``latest``
        # corrects whenever the claimed versions are gapless.
        current = self._read_hint(directory)
        if current is None or version > current:
            self._write_hint(directory, version)

    @staticmethod
    def _scan(directory: str) -> int:
        """Highest version with a slot file, by listing ``directory`` (slow path only)."""
        best = -1
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return -1
        for name in names:
            best = max(best, _parse_slot_name(name))
        return best

    def _makedirs(self, directory: str) -> None:
        """``os.makedirs(directory, exist_ok=True)``; with ``fsync``, the entry of every
        directory it created synced into its parent too (a claim synced into a directory
        whose own entry a power loss takes would be lost with it)."""
        make_dirs(directory, fsync=self._fsync)

    @staticmethod
    def _sync_dir(directory: str) -> None:
        sync_dir(directory)


def _compact(claim: dict[str, Any]) -> dict[str, Any]:
    """A claim as a slot file holds it: a hex digest as base64 (43 characters instead of
    64), which keeps a usual claim short enough to be one symlink."""
    digest = claim.get("digest")
    if isinstance(digest, str) and len(digest) == 64:
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            return claim
        return {**claim, "digest": "b64:" + base64.urlsafe_b64encode(raw).decode().rstrip("=")}
    return claim


def _expand(claim: dict[str, Any]) -> dict[str, Any]:
    digest = claim.get("digest")
    if isinstance(digest, str) and digest.startswith("b64:"):
        return {**claim, "digest": base64.urlsafe_b64decode(digest[4:] + "=").hex()}
    return claim
