"""Leases of the local-file slot store (:meth:`LocalFileSlotStore.acquire_lease
<lockstore.localfs.LocalFileSlotStore.acquire_lease>`): one ``flock(2)``-ed file per lease,
and this process's table of the leases it holds.

Layout, under the store's root::

    root/_leases/<sanitised name>-<sha1[:20]>.lease   the owner's JSON {"name", "host", "pid", "info",
                                                      "acquired_ms"}; flock'ed while held

A lease is an exclusive ``flock(2)`` (``LOCK_EX | LOCK_NB``) on its file, held on a file
descriptor that stays open for the lease's lifetime. The kernel drops the lock when the
descriptor is closed: on ``release``, on the store's ``close``, and when the process dies
in any way (SIGKILL included), so a dead owner's lease is simply taken over. Liveness is
checked by trying the lock (``LOCK_SH | LOCK_NB``): it is granted only if nobody holds the
lease. flock locks belong to open file descriptions, so a second acquire from the same
process (another thread, another store object on the same root) fails like any other.
Lease files are never deleted (deleting one would let two owners lock two different
files of the same name); a free lease's file keeps its last owner's record, which counts
for nothing without the lock. The descriptor is opened ``O_CLOEXEC`` (an ``exec``'d
program never inherits it), and a forked child closes its copies at once
(``os.register_at_fork``): the lock belongs to the parent only, and ends with it even
while children live. Per machine only: flock on network filesystems is not guaranteed.

Durability (the store's ``fsync=True``): the record is fsynced, and so are the entries of
the lease file in ``_leases`` and of every directory made for it (each one's parent), before
``acquire_lease`` returns. A lease itself ends with its holder, power loss included; what a
synced lease keeps is its file and its last owner's record, for the operator reading it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass

from lockstore.base import (
    UNKNOWN_LEASE_OWNER,
    Lease,
    LeaseHeldError,
    LeaseOwner,
    SlotStoreUnavailableError,
    lease_node_name,
)

_LEASES_DIR = "_leases"  # never a table directory: those do not start with "_"
_LEASE_SUFFIX = ".lease"
_LEASE_RECORD_MAX = 1 << 20
# A lock attempt can meet a reader's momentary liveness probe (LOCK_SH) on a free lease, and
# a record read can meet its owner's write: retry for this long before concluding.
_LEASE_RETRY_SECONDS = 0.05


@dataclass(slots=True)
class _HeldLease:
    fd: int
    owner: LeaseOwner
    token: object


# Leases held by this process, by lease file path: a second acquire fails fast with the
# holder's owner, and a forked child knows which inherited descriptors to close.
_HELD: dict[str, _HeldLease] = {}
_HELD_LOCK = threading.Lock()


def _forget_leases_in_child() -> None:
    """After fork, in the child: close the inherited lease descriptors. The child never held
    the leases; closing its copies (never LOCK_UN, which would unlock the parent's) means
    the lock ends when the parent's descriptors close, whatever the child does."""
    global _HELD_LOCK
    _HELD_LOCK = threading.Lock()  # another thread may have held it at fork time
    for held in list(_HELD.values()):
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_leases_in_child)


def _read_lease_record(fd: int) -> LeaseOwner | None:
    """The owner recorded in an open lease file; None if empty or (mid-write) not valid."""
    raw = os.pread(fd, _LEASE_RECORD_MAX, 0)
    if not raw:
        return None
    try:
        return LeaseOwner.from_dict(json.loads(raw))
    except (ValueError, TypeError, AttributeError):
        return None


def _held_owner(fd: int) -> LeaseOwner:
    """The owner of a lease found locked: its record, retried briefly while being written."""
    deadline = time.monotonic() + _LEASE_RETRY_SECONDS
    while True:
        owner = _read_lease_record(fd)
        if owner is not None:
            return owner
        if time.monotonic() >= deadline:
            return UNKNOWN_LEASE_OWNER
        time.sleep(0.002)


def _release_lease(path: str, token: object) -> None:
    with _HELD_LOCK:
        held = _HELD.get(path)
        if held is None or held.token is not token:
            return  # already closed (fork, or released through another path)
        del _HELD[path]
    os.close(held.fd)  # drops the flock


def _lease_alive(path: str, token: object) -> bool:
    with _HELD_LOCK:
        held = _HELD.get(path)
        return held is not None and held.token is token


def lease_file_path(root: str, name: str) -> str:
    """Absolute path of the file of lease ``name`` under the store root ``root``."""
    return os.path.join(root, _LEASES_DIR, lease_node_name(name) + _LEASE_SUFFIX)


def acquire_lease_file(path: str, name: str, stamped: LeaseOwner, made: set[str], *, fsync: bool) -> Lease:
    """flock ``path``, the file of lease ``name``, and record ``stamped`` (the owner) in it;
    :class:`LeaseHeldError` naming the holder if a live process holds it. OS errors raise
    :class:`SlotStoreUnavailableError`. ``made``: the directories the store has created or
    seen (its cache, updated here)."""
    with _HELD_LOCK:
        mine = _HELD.get(path)
    if mine is not None:
        raise LeaseHeldError(name, mine.owner)
    record = dict(stamped.to_dict(), name=name)
    payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
    try:
        fd = _lock_lease_file(path, made, fsync=fsync)
        if fd is None:
            raise LeaseHeldError(name, _owner_of_locked(path))
        try:
            os.ftruncate(fd, 0)
            view = memoryview(payload)
            offset = 0
            while offset < len(payload):
                offset += os.pwrite(fd, view[offset:], offset)
            if fsync:
                os.fsync(fd)
                sync_dir(os.path.dirname(path))  # the file's entry, new or not (cheap, rare)
        except BaseException:
            os.close(fd)
            raise
    except OSError as exc:
        raise SlotStoreUnavailableError(f"acquiring lease {name!r} at {path}: {exc}") from exc
    token = object()
    with _HELD_LOCK:
        _HELD[path] = _HeldLease(fd, stamped, token)

    def release(_blocking: bool) -> None:
        _release_lease(path, token)

    def alive() -> bool:
        return _lease_alive(path, token)

    return Lease(name, stamped, release=release, alive=alive)


def lease_file_owner(path: str, name: str) -> LeaseOwner | None:
    """The holder's record if ``path``, the file of lease ``name``, is locked (a live
    process holds it), else None."""
    with _HELD_LOCK:
        mine = _HELD.get(path)
    if mine is not None:
        return mine.owner
    try:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _held_owner(fd)  # locked: a live holder
            return None  # nobody holds it; closing the descriptor drops our probe lock
        finally:
            os.close(fd)
    except OSError as exc:
        raise SlotStoreUnavailableError(f"reading lease {name!r} at {path}: {exc}") from exc


def _lock_lease_file(path: str, made: set[str], *, fsync: bool) -> int | None:
    """An open descriptor holding the exclusive flock of ``path``; None if a live holder
    has it. Retries briefly past a reader's liveness probe, and re-opens when the file
    was replaced while we waited (it never is, unless someone removes lease files).
    ``fsync``: the directories made for it have their entries synced."""
    directory = os.path.dirname(path)
    deadline = time.monotonic() + _LEASE_RETRY_SECONDS
    while True:
        if directory not in made:
            make_dirs(directory, fsync=fsync)
            made.add(directory)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise
            made.discard(directory)  # removed after we cached it: make it again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)
            continue
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)  # we locked a file that is no longer the lease's: try the current one


def make_dirs(directory: str, *, fsync: bool) -> None:
    """``os.makedirs(directory, exist_ok=True)``; with ``fsync``, the entry of every
    directory it created synced into its parent, top down (a file synced into a directory
    whose own entry a power loss takes would be lost with it)."""
    if not fsync:
        os.makedirs(directory, exist_ok=True)
        return
    missing = []
    current = directory
    while not os.path.isdir(current) and os.path.dirname(current) != current:
        missing.append(current)
        current = os.path.dirname(current)
    os.makedirs(directory, exist_ok=True)
    for created in reversed(missing):
        sync_dir(os.path.dirname(created))


def sync_dir(directory: str) -> None:
    """fsync a directory: the entries made in it are durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _owner_of_locked(path: str) -> LeaseOwner:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return UNKNOWN_LEASE_OWNER
    try:
        return _held_owner(fd)
    finally:
        os.close(fd)
