"""The version-slot port: who may publish version N of a table.

A :class:`SlotStore` grants version ``N`` of a table to exactly one writer. The table
engine's commit pipeline is::

    stage commit file  ->  claim(table, N, claim)  ->  publish <N>.json  ->  mark_complete(table, N)
                              |  False: another writer owns N: conflict-check its commit, retry at latest+1

The claim is the commit point. Once ``claim`` returned True the commit is decided; its
content is the staged file named in the claim. Publishing the log file and marking the
slot complete only make it visible, and any process can finish them (recovery) from the
staged file. That is why the staged file must be fully written *before* the claim.

Guarantees every adapter gives (each has a contract test in ``tests/lockstore``):

* **Exclusive grant**: for one ``(table, version)``, at most one ``claim`` call ever
  returns True, across threads and processes (and machines, for the ZooKeeper adapter and
  the object-store adapter on S3's conditional writes).
  Later calls return False and do not change the stored claim.
* **Durable record**: after ``claim`` returned True, ``get`` returns that claim (the same
  txn id, staged name and owner) for as long as the store exists.
* **Monotone latest**: ``latest`` returns the highest claimed version, or -1. It never
  goes down. If callers only ever claim ``latest() + 1`` (the engine does), the claimed
  versions form the gapless prefix ``0..latest``.
* **Idempotent completion**: ``mark_complete`` may be called any number of times, by any
  process; it fails only if the slot was never claimed. The mark is for operators: the
  engine's recovery keys on ``<N>.json`` existing, never on the mark, so an adapter may
  defer it (the ZooKeeper adapter batches the marks of a handle's own claims into one
  write every half second: other handles see them up to that much later).

Honest non-guarantees:

* ``latest`` is a lower bound by the time the caller reads it; a concurrent claim may
  already have happened. Callers must treat a False from ``claim`` as normal.
* The stores do not check that version ``N-1`` exists when ``N`` is claimed; the engine's
  "claim latest+1" rule keeps the prefix gapless.
* The local-file adapter is safe across processes on one machine only (it relies on the
  atomic, exclusive ``link(2)`` of a local filesystem); the in-memory adapter within one
  process. Without ``fsync=True`` a claim survives a crashed process but not a power
  loss; the in-memory adapter survives neither.
* The object-store adapter (:mod:`lockstore.objectstore`) is as exclusive as the store's
  put-if-absent is atomic: S3 (``If-None-Match: *``) is; fsspec's local file system is
  not (refused). Its ``latest`` probes forward from the highest version a handle has seen,
  exact under the engine's gapless rule; a claim past a gap made through another handle
  is seen by a new handle only. Its records are durable as S3 objects are.
* An error other than False (e.g. :class:`SlotStoreUnavailableError`) means the outcome of
  that call is unknown: the caller must look the claim up (``find_txn``) before retrying.

Counters (:meth:`SlotStore.reserve_range`): one atomic, monotone counter per ``(table,
name)``, starting at 0, for handing out disjoint ranges (the table engine's identity
column values). ``reserve_range(table, name, count, floor)`` moves the counter from
``max(counter, floor)`` to that plus ``count`` in one atomic step and returns where the
range starts. Guarantees (contract-tested on every adapter):

* **Disjoint ranges**: the ranges ``[first, first + count)`` returned for one ``(table,
  name)`` never overlap, across threads, processes and (ZooKeeper, S3) machines.
* **Floor respected**: ``first >= floor``; the counter never goes down.

Honest non-guarantees: a call that raises (:class:`SlotStoreUnavailableError`) or whose
caller dies may still have moved the counter: that range is lost (a gap), never handed
out twice. Adapters retry an ambiguous write by re-reading, so a lost response also costs
a gap, not a duplicate. Counters live as long as the store's records (the in-memory
adapter's within its process).

Waiting for the next version: :meth:`SlotStore.await_latest` blocks until ``latest``
moves (group commit's followers wait on it). The default polls; the ZooKeeper adapter
sets a watch and the in-memory adapter waits on a condition; the object-store adapter
polls every ``poll_interval`` (25 ms by default: each poll is a request).

Leases (:meth:`SlotStore.acquire_lease`): a named, exclusive, *liveness-bound* lock, used
to keep two running streaming queries that share one checkpoint location from both
writing. At most one live owner holds a lease name at a time; the holder's record
(:class:`LeaseOwner`: host, pid, free-form info such as the query and run ids) is readable
by everyone (:meth:`SlotStore.lease_owner`) and is carried by the :class:`LeaseHeldError`
that a second acquirer gets. A lease ends when its :class:`Lease` is released, when the
store that granted it is closed, when the handle is garbage collected unreleased, or when
its owner dies: the process (in-memory and local-file adapters, including SIGKILL: the OS
drops the lock), the ZooKeeper session (it expires ``timeout`` seconds after the process
died or lost its connection), or the heartbeat (object-store adapter: the holder rewrites
a beat object every ``lease_ttl / 3``; a clean exit releases the lease, a SIGKILLed owner's
is free ``lease_ttl`` seconds after its last beat). A dead owner's lease is taken over by
the next acquirer.

Honest non-guarantees of leases:

* ``Lease.held`` is a local observation, not a fence: a ZooKeeper owner cut off from the
  ensemble learns that its session expired only when it reconnects, and another owner
  may hold the lease by then (``held`` is False while the connection is suspended, but a
  check followed by a write can always race with an expiry). Writers keep a commit-time
  check (the streaming sink's txn version) as the backstop.
* Local-file leases are per machine: they rely on ``flock(2)`` of a local filesystem.
  Across machines (NFS, SMB, FUSE mounts) flock may be emulated, per-client, or missing;
  use the ZooKeeper adapter there. In-memory leases are per process.
* A ZooKeeper lease whose owner was SIGKILLed stays held until the server expires the
  owner's session (its timeout); nothing guesses from pids across machines.
* Object-store leases are bound by a TTL, not a session: a holder paused or cut off for
  longer than ``lease_ttl`` may overlap with the next owner until its own ``held`` turns
  False (within ``lease_ttl`` of its last successful beat, before anyone may take over,
  as long as the holder's clock runs at the server's rate). Liveness compares server
  timestamps (the beat's and a clock object's ``LastModified``), so client clock skew does
  not matter; S3's one-second timestamp resolution is allowed as slack.
* Leases are owned by the process that acquired them: a forked child neither holds nor
  can release its parent's leases (its ``Lease.held`` is False and ``release`` does
  nothing), and the local-file adapter closes the inherited lock descriptors in the child,
  so a child outliving its parent does not keep the lease alive.

Closing: :meth:`SlotStore.close` releases a store's connection and its leases; it is
idempotent and safe from any thread. A store holding a connection (ZooKeeper) reports
``closed`` and refuses every later call with :class:`SlotStoreClosedError`; the others hold
none and stay usable (the object-store adapter stops its heartbeats and releases its
leases, but does not close the caller's file system).
:mod:`lockstore.registry` shares one store per spec and closes it when its last user gives
it back or when it is garbage collected.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

log = logging.getLogger("lockstore")


class LockstoreError(Exception):
    """Root of every error raised by :mod:`lockstore`."""


class SlotStoreUnavailableError(LockstoreError):
    """The store could not be reached; the outcome of the call in flight is unknown."""


class SlotStoreWriteRefusedError(SlotStoreUnavailableError):
    """The store's own storage refused a write before anything was written (a full disk,
    a read-only file system, permission denied): unlike its parent's, this outcome is
    known, nothing was claimed or changed. ``errno`` is the storage's error number; the
    ``OSError`` is chained. Callers that only know the parent treat it as unknown, which
    is safe."""

    def __init__(self, message: str, *, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refused, (str(self), self.errno))


def _refused(message: str, errno: int | None) -> SlotStoreWriteRefusedError:
    return SlotStoreWriteRefusedError(message, errno=errno)


class SlotStoreClosedError(LockstoreError):
    """The store was closed (by :meth:`SlotStore.close`, or by the last table using it)
    before or during the call; nothing more is sent through it. Open a new one."""


class SlotNotClaimedError(LockstoreError):
    """``mark_complete`` or a repair on a version nobody claimed."""

    def __init__(self, table: str, version: int) -> None:
        super().__init__(f"version {version} of table {table!r} was never claimed")
        self.table = table
        self.version = version

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.table, self.version))


class TableBindingError(LockstoreError):
    """The slot namespace is bound to another table id (two tables claiming one path)."""

    def __init__(self, table: str, bound_id: str, requested_id: str) -> None:
        super().__init__(
            f"slots for {table!r} belong to table id {bound_id}, not {requested_id}; "
            "refusing to share version slots between two tables"
        )
        self.table = table
        self.bound_id = bound_id
        self.requested_id = requested_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.table, self.bound_id, self.requested_id))


def check_range_request(count: int, floor: int) -> None:
    """ValueError unless ``count >= 1`` and ``floor >= 0`` (what every adapter's
    :meth:`SlotStore.reserve_range` accepts)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
        raise ValueError(f"floor must be an int >= 0, got {floor!r}")


def default_owner(app_id: str | None = None) -> dict[str, str]:
    """Identity of this writer, stored in every claim so operators can see who holds a slot."""
    owner = {"host": socket.gethostname(), "pid": str(os.getpid())}
    if app_id:
        owner["app_id"] = app_id
    return owner


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """What a writer records when it claims a version."""

    txn_id: str
    staged: str  # name of the staged commit file, relative to the table's log directory
    owner: Mapping[str, str] = field(default_factory=default_owner)
    # Group commits: the transaction ids the slot's commit carries (``txn_id`` is the group's).
    members: tuple[str, ...] = ()
    # The content hash of the commit the claim grants (eventlog's tamper-evidence anchor: the
    # slot store keeps it outside the table's storage, so a rewritten log no longer matches).
    digest: str | None = None

    def covers(self, txn_id: str) -> bool:
        """Whether this claim commits transaction ``txn_id`` (itself or as a group member)."""
        return txn_id == self.txn_id or txn_id in self.members

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"txn_id": self.txn_id, "staged": self.staged, "owner": dict(self.owner)}
        if self.members:
            out["members"] = list(self.members)
        if self.digest is not None:
            out["digest"] = self.digest
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SlotClaim:
        members = tuple(str(m) for m in d.get("members") or ())
        digest = d.get("digest")
        return SlotClaim(
            str(d["txn_id"]),
            str(d["staged"]),
            dict(d.get("owner") or {}),
            members,
            str(digest) if digest is not None else None,
        )


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A claimed slot as stored."""

    version: int
    claim: SlotClaim
    complete: bool
    claimed_at: float  # epoch seconds, by the claimer's clock

    @property
    def age(self) -> float:
        """Seconds since the claim by this process's clock against the claimer's: for
        display; decisions use :meth:`SlotStore.claim_age` where the store can tell."""
        return max(0.0, time.time() - self.claimed_at)


# ------------------------------------------------------------------------------ leases


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class LeaseOwner:
    """Who holds a lease: the process (``host``, ``pid``) plus free-form ``info`` (for a
    streaming query: ``{"queryId": ..., "runId": ...}``) and when it was acquired
    (epoch milliseconds; 0 in an owner not yet granted: the store stamps the time)."""

    host: str
    pid: int
    info: Mapping[str, str] = field(default_factory=dict, hash=False)
    acquired_ms: int = 0

    def __post_init__(self) -> None:
        # A private plain copy: the caller's mapping may change later; the record must not.
        object.__setattr__(self, "info", {str(k): str(v) for k, v in dict(self.info).items()})

    def describe(self) -> str:
        """``"queryId=... runId=... host=h pid=123"``: the owner, for error messages."""
        parts = [f"{key}={value}" for key, value in self.info.items()]
        parts += [f"host={self.host}", f"pid={self.pid}"]
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "info": dict(self.info), "acquired_ms": self.acquired_ms}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> LeaseOwner:
        info = d.get("info") or {}
        return LeaseOwner(
            host=str(d.get("host", "")),
            pid=int(d.get("pid") or 0),
            info={str(k): str(v) for k, v in dict(info).items()},
            acquired_ms=int(d.get("acquired_ms") or 0),
        )

    def stamped(self) -> LeaseOwner:
        """This owner with ``acquired_ms`` set to now if it was 0 (adapters call it on grant)."""
        return self if self.acquired_ms else replace(self, acquired_ms=_now_ms())


def lease_owner_here(**info: str) -> LeaseOwner:
    """An owner naming this host and process, acquired now, with ``info`` (e.g. queryId=...)."""
    return LeaseOwner(socket.gethostname(), os.getpid(), dict(info), _now_ms())


UNKNOWN_LEASE_OWNER = LeaseOwner("unknown", 0)


class LeaseHeldError(LockstoreError):
    """A live owner holds the lease ``name``; ``owner`` says who (host, pid, info)."""

    def __init__(self, name: str, owner: LeaseOwner) -> None:
        since = ""
        if owner.acquired_ms:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(owner.acquired_ms / 1000))
            since = f" since {stamp}"
        super().__init__(f"lease {name!r} is held by a live owner: {owner.describe()}{since}")
        self.name = name
        self.owner = owner

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.owner))


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def lease_node_name(name: str) -> str:
    """The file or znode name of lease ``name``: a readable prefix plus a hash that keeps
    distinct names apart (``s3://b/c`` and ``s3:/b/c`` sanitise alike). Safe as a file
    name and as a znode name; the original name is kept in the owner record."""
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()[:20]
    safe = _UNSAFE_NAME.sub("_", name).strip("._-")[:64]
    return f"{safe}-{digest}" if safe else digest


class _LeaseState:
    """A lease's release state, apart from the :class:`Lease` handle so that a finalizer can
    release a collected handle (it must not refer to the handle)."""

    def __init__(self, name: str, release: Callable[[bool], None], alive: Callable[[], bool]) -> None:
        self.name = name
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.releasing = False
        self.released = False
        self._release: Callable[[bool], None] | None = release
        self._alive: Callable[[], bool] | None = alive

    def held(self) -> bool:
        alive = self._alive
        return not self.releasing and os.getpid() == self.pid and alive is not None and alive()

    def release(self, blocking: bool = True) -> None:
        if os.getpid() != self.pid:
            return  # a forked child: the lease is its parent's
        with self.lock:
            if self.released:
                return
            self.releasing = True
            release = self._release
            if release is not None:
                release(blocking)  # may raise (outcome unknown): a later call retries
            self.released = True
            self._release = self._alive = None  # drop references to the store's resources

    def collected(self) -> None:
        """The handle was garbage collected unreleased: release without blocking, never raise."""
        try:
            self.release(blocking=False)
        except Exception as exc:
            log.warning("releasing the collected lease %r failed: %s", self.name, exc)


class Lease:
    """A held lease, from :meth:`SlotStore.acquire_lease`.

    ``name`` is the lease's name, ``owner`` the record stored for it (with ``acquired_ms``
    stamped). The lease lasts until :meth:`release` (idempotent; also on leaving a ``with``
    block), the store's ``close``, the garbage collection of this handle, or the end of its
    owner (process, or ZooKeeper session). :attr:`held` says whether it still holds, as far
    as this process can tell (see "Honest non-guarantees of leases" in :mod:`lockstore.base`).

    Adapters make handles with a ``release(blocking)`` callable (called at most once with
    success; ``blocking=False`` from a finalizer) and an ``alive()`` callable; neither may
    refer to the handle.
    """

    def __init__(
        self,
        name: str,
        owner: LeaseOwner,
        *,
        release: Callable[[bool], None],
        alive: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        self.owner = owner
        self._state = _LeaseState(name, release, alive or (lambda: True))
        finalizer = weakref.finalize(self, self._state.collected)
        finalizer.atexit = False  # at exit the process (or the store's session) ends anyway

    def release(self) -> None:
        """Give the lease up. Idempotent and thread-safe; a no-op in a forked child. Raises
        :class:`SlotStoreUnavailableError` if the store could not be reached (the lease is no
        longer :attr:`held`; call again to retry, or let the owner's end release it)."""
        self._state.release(True)

    @property
    def held(self) -> bool:
        """False once released or lost (process forked, store closed, ZooKeeper session
        expired or suspended); True while this process still holds the lease."""
        return self._state.held()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else "not held"
        return f"Lease({self.name!r}, {self.owner.describe()}, {state})"


class LeaseSet:
    """The leases a store granted and has not seen released, held weakly, so that the
    store's ``close`` can release them (a collected handle released itself already)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()

    def add(self, lease: Lease) -> Lease:
        with self._lock:
            self._leases.add(lease)
        return lease

    def release_all(self) -> None:
        """Release every lease still tracked (outside the lock: releasing takes others)."""
        with self._lock:
            leases = list(self._leases)
            self._leases.clear()
        for lease in leases:
            try:
                lease.release()
            except Exception as exc:
                log.warning("releasing lease %r at close failed: %s", lease.name, exc)


class SlotStore(ABC):
    """Grants version slots of tables; see the module docstring for the guarantees.

    ``table`` is an opaque key chosen by the engine (a normalised table URI).
    """

    @abstractmethod
    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        """Put-if-absent: True if this call obtained ``version``; False if it was taken."""

    @abstractmethod
    def latest(self, table: str) -> int:
        """The highest claimed version of ``table``, or -1 when none was claimed."""

    @abstractmethod
    def get(self, table: str, version: int) -> SlotRecord | None:
        """The record of a claimed slot, or None if ``version`` was never claimed."""

    @abstractmethod
    def mark_complete(self, table: str, version: int) -> None:
        """Record that ``<version>.json`` is published. Idempotent."""

    def find_txn(self, table: str, txn_id: str, start: int = 0) -> int | None:
        """The version whose claim carries ``txn_id``, searching ``start..latest``; or None."""
        for version in range(self.latest(table), start - 1, -1):
            record = self.get(table, version)
            if record is not None and record.claim.covers(txn_id):
                return version
        return None

    def recent(self, table: str, *, limit: int = 100, incomplete_only: bool = False) -> list[SlotRecord]:
        """The newest ``limit`` claimed slots of ``table``, newest first (operations view)."""
        out: list[SlotRecord] = []
        latest = self.latest(table)
        for version in range(latest, max(-1, latest - limit), -1):
            record = self.get(table, version)
            if record is not None and (not incomplete_only or not record.complete):
                out.append(record)
        return out

    def await_latest(self, table: str, seen: int, timeout: float) -> int:
        """Wait until ``latest(table) > seen`` or ``timeout`` seconds passed; return latest.

        This default polls (every millisecond); adapters that can be notified override it.
        """
        deadline = time.monotonic() + timeout
        while True:
            latest = self.latest(table)
            if latest > seen or time.monotonic() >= deadline:
                return latest
            time.sleep(min(0.001, max(0.0, deadline - time.monotonic())))

    @abstractmethod
    def reserve_range(self, table: str, name: str, count: int, floor: int = 0) -> int:
        """Atomically move counter ``name`` of ``table`` from ``max(counter, floor)`` by
        ``count`` and return that starting point (see "Counters" in the module docstring)."""

    def sessions(self) -> dict[str, dict[str, str]]:
        """Live writer sessions and their owners, for stores that track them ({} otherwise)."""
        return {}

    def owner_alive(self, table: str, version: int) -> bool | None:
        """Whether the writer that claimed ``version`` provably still lives (True), is
        provably gone (False), or the store cannot tell (None, the default)."""
        return None

    def claim_age(self, table: str, version: int) -> float | None:
        """Seconds since ``version`` was claimed by the *store's* clock (the slot file's
        modification time against a probe file's, S3's ``LastModified`` of the slot object
        against a clock object's), or None when the store cannot tell (the default; callers
        then use :attr:`SlotRecord.age`, which reads the claimer's clock against their own,
        hours off when either runs ahead or behind). None also for an unclaimed version."""
        return None

    def bind(self, table: str, table_id: str) -> None:
        """Record ``table_id`` as the owner of ``table``'s slots, or verify it.

        Raises :class:`TableBindingError` when the slots are bound to another id. Adapters
        that cannot persist bindings accept every id (the default).
        """
        return None

    @abstractmethod
    def acquire_lease(self, name: str, owner: LeaseOwner) -> Lease:
        """Take the lease ``name`` for ``owner``, or raise :class:`LeaseHeldError` naming the
        live owner that holds it. A dead owner's lease is taken over.

        ``name`` is any string (a checkpoint location URI); ``owner`` is recorded with
        ``acquired_ms`` stamped if it was 0 (see :meth:`LeaseOwner.stamped`). A second
        acquire of a held name fails even from the same process and the same store.
        """

    @abstractmethod
    def lease_owner(self, name: str) -> LeaseOwner | None:
        """The live holder of lease ``name``, or None when nobody (alive) holds it."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` released this store's connection (False for stores without one)."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Release connections, resources and the leases acquired through this store.
        Idempotent, and safe to call from any thread.

        A store that holds a connection (ZooKeeper) raises :class:`SlotStoreClosedError`
        from every call after it; stores without one (in-memory, local file) keep working.
        """

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
