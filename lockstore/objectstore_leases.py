"""Leases of the object-store slot store (:mod:`lockstore.objectstore`, whose docstring
describes them): each generation created with put-if-absent, its heartbeat thread
(:class:`Heartbeat`), liveness judged on the server's clock, and the release of this
process's held leases when it exits (and their forgetting in a forked child).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import threading
import time

from lockstore.base import UNKNOWN_LEASE_OWNER, Lease, LeaseHeldError, LeaseOwner, LockstoreError
from lockstore.objectstore_io import Objects, parse_numbered

log = logging.getLogger("lockstore.objectstore")

_CLOCK = "_clock"
_LEASE = ".lease"
_BEAT = ".beat"
_RELEASED = ".released"
_RECORD_MAX = 1 << 20
# Server timestamps (S3's LastModified) have whole-second resolution: a live heartbeat may
# look up to this much older than it is.
_CLOCK_SLACK = 1.0


class Heartbeat:
    """One held lease generation: its heartbeat thread and its local liveness.

    Refers to the file system and paths only, never to the store or the :class:`Lease`
    handle, so a collected handle's finalizer can release it and a store can be collected.
    """

    def __init__(self, objects: Objects, directory: str, name: str, gen: int, ttl: float, started: float):
        self.objects = objects
        self.directory = directory
        self.name = name
        self.gen = gen
        self.ttl = ttl
        self.pid = os.getpid()
        self.last_ok = started  # monotonic start of the last request that proved the lease
        self.lost = False  # a newer generation exists, or no beat succeeded for ttl
        self.stopped = threading.Event()
        self.released = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"lockstore-lease-beat-{gen}", daemon=True)

    def path(self, gen: int, suffix: str) -> str:
        return f"{self.directory}/{gen:020d}{suffix}"

    def start(self) -> None:
        with _LIVE_LOCK:
            _LIVE.add(self)
        self.thread.start()

    def alive(self) -> bool:
        if self.lost or self.stopped.is_set() or os.getpid() != self.pid:
            return False
        if time.monotonic() - self.last_ok >= self.ttl:
            self.lost = True  # permanent: another owner may take it from here on
            self.stopped.set()
            return False
        return True

    def _run(self) -> None:
        interval = self.ttl / 3
        while not self.stopped.wait(interval):
            if not self.alive():
                return
            started = time.monotonic()
            try:
                self.objects.put(self.path(self.gen, _BEAT), str(time.time()).encode())
                taken = self.objects.exists(self.path(self.gen + 1, _LEASE))
            except LockstoreError as exc:
                log.warning("heartbeat of lease %r failed (retrying): %s", self.name, exc)
                continue
            except Exception as exc:  # never let the thread die silently
                log.warning("heartbeat of lease %r failed (retrying): %r", self.name, exc)
                continue
            if taken:
                log.warning("lease %r (generation %s) was taken over by another owner", self.name, self.gen)
                self.lost = True
                self.stopped.set()
                return
            self.last_ok = started

    def release(self, blocking: bool) -> None:
        """Stop beating and record the release (``<gen>.released``). Raises
        :class:`SlotStoreUnavailableError` if that write failed (a later call retries)."""
        self.stopped.set()
        if blocking and self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=1.0)
        if not blocking:
            threading.Thread(
                target=self._release_quietly, name="lockstore-lease-release", daemon=True
            ).start()
            return
        self._write_released()

    def _release_quietly(self) -> None:
        try:
            self._write_released()
        except Exception as exc:
            log.warning("releasing lease %r failed: %s", self.name, exc)

    def _write_released(self) -> None:
        with self.lock:
            if self.released:
                return
            if os.getpid() != self.pid:
                return
            self.objects.put(self.path(self.gen, _RELEASED), b"")
            self.released = True
        with _LIVE_LOCK:
            _LIVE.discard(self)


# Heartbeats of this process not yet released: at exit their leases are released (a clean
# exit frees them at once; only a killed process waits for the TTL).
_LIVE: set[Heartbeat] = set()
_LIVE_LOCK = threading.Lock()


def _release_at_exit() -> None:
    with _LIVE_LOCK:
        live = [beat for beat in _LIVE if beat.pid == os.getpid()]
    for beat in live:
        try:
            beat.release(blocking=True)
        except Exception as exc:
            log.warning("releasing lease %r at exit failed: %s", beat.name, exc)


def _forget_in_child() -> None:
    global _LIVE_LOCK
    _LIVE_LOCK = threading.Lock()  # another thread may have held it at fork time
    _LIVE.clear()  # the parent's leases; the child neither beats nor releases them


def _release_at_thread_exit() -> None:
    """The release at exit, early: before the interpreter's thread pools shut down (s3fs's
    aiohttp resolves host names on one; by the time atexit hooks run, scheduling on it
    fails). The interpreter is about to wait for its other (non-daemon) threads, which may
    still write under the lease: wait for them first, so the lease outlives them. Idle
    pool workers are not waited for: they end only after this hook."""
    with _LIVE_LOCK:
        if not any(beat.pid == os.getpid() for beat in _LIVE):
            return
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is current or thread.daemon or thread.name.startswith("ThreadPoolExecutor"):
            continue
        thread.join()
    _release_at_exit()


# threading's exit hooks run newest first, so this one runs before concurrent.futures'
# (registered when asyncio was imported, before this module: fsspec imports it, and
# lockstore.objectstore_io imports fsspec). A release is done once.
_register_thread_exit = getattr(threading, "_register_atexit", None)
if _register_thread_exit is not None:
    _register_thread_exit(_release_at_thread_exit)
atexit.register(_release_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)


def acquire_generation(objects: Objects, directory: str, name: str, stamped: LeaseOwner, ttl: float) -> Lease:
    """Win the next generation of lease ``name`` (objects under ``directory``) for ``stamped``
    if the current one ended (released, or its heartbeat silent for ``ttl``); else
    :class:`LeaseHeldError` naming its owner. Starts the winner's heartbeat."""
    current, live = current_generation(objects, directory, ttl)
    if live:
        raise LeaseHeldError(name, read_owner(objects, directory, current))
    gen = current + 1
    token = secrets.token_hex(8)
    record = {**stamped.to_dict(), "name": name, "token": token}
    payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
    path = f"{directory}/{gen:020d}{_LEASE}"
    started = time.monotonic()
    if not objects.create(path, payload) and objects.get(path) != payload:
        # Another acquirer won this generation (it is live: it was created just now).
        raise LeaseHeldError(name, read_owner(objects, directory, gen))
    beat = Heartbeat(objects, directory, name, gen, ttl, started)
    beat.start()

    def release(blocking: bool) -> None:
        beat.release(blocking)

    return Lease(name, stamped, release=release, alive=beat.alive)


def current_generation(objects: Objects, directory: str, ttl: float) -> tuple[int, bool]:
    """(highest generation of the lease, or -1; whether it is live)."""
    entries = objects.list(directory)
    gen = max((parse_numbered(n, _LEASE) for n in entries), default=-1)
    if gen < 0 or f"{gen:020d}{_RELEASED}" in entries:
        return gen, False
    # Not released: alive while its last sign of life (the lease object, then each beat)
    # is younger than the TTL, on the server's clock: write the clock object, list again.
    objects.put(f"{directory}/{_CLOCK}", b"")
    entries = objects.list(directory)
    latest_gen = max((parse_numbered(n, _LEASE) for n in entries), default=-1)
    if latest_gen != gen:  # a new generation appeared meanwhile: judge that one
        gen = latest_gen
        if f"{gen:020d}{_RELEASED}" in entries:
            return gen, False
    now = entries.get(_CLOCK)
    signs = [entries.get(f"{gen:020d}{suffix}") for suffix in (_LEASE, _BEAT)]
    last = max((t for t in signs if t is not None), default=None)
    if now is None or last is None:
        raise LockstoreError(
            f"lease objects under {directory} carry no modification times; this file "
            "system's listings cannot tell whether a lease holder is alive"
        )
    return gen, now - last <= ttl + _CLOCK_SLACK


def read_owner(objects: Objects, directory: str, gen: int) -> LeaseOwner:
    path = f"{directory}/{gen:020d}{_LEASE}"
    raw = objects.get(path)
    if raw is None:
        return UNKNOWN_LEASE_OWNER
    try:
        return LeaseOwner.from_dict(json.loads(raw[:_RECORD_MAX]))
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("unreadable lease record %s: %s", path, exc)
        return UNKNOWN_LEASE_OWNER
