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
  returns True, across threads and processes (and machines, for the ZooKeeper adapter).
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
* An error other than False (e.g. :class:`SlotStoreUnavailableError`) means the outcome of
  that call is unknown: the caller must look the claim up (``find_txn``) before retrying.

Waiting for the next version: :meth:`SlotStore.await_latest` blocks until ``latest``
moves (group commit's followers wait on it). The default polls; the ZooKeeper adapter
sets a watch and the in-memory adapter waits on a condition.

Closing: :meth:`SlotStore.close` releases a store's connection; it is idempotent and safe
from any thread. A store holding a connection (ZooKeeper) reports ``closed`` and refuses
every later call with :class:`SlotStoreClosedError`; the others hold none and stay usable.
:mod:`lockstore.registry` shares one store per spec and closes it when its last user gives
it back or when it is garbage collected.
"""

from __future__ import annotations

import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class LockstoreError(Exception):
    """Root of every error raised by :mod:`lockstore`."""


class SlotStoreUnavailableError(LockstoreError):
    """The store could not be reached; the outcome of the call in flight is unknown."""


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

    def covers(self, txn_id: str) -> bool:
        """Whether this claim commits transaction ``txn_id`` (itself or as a group member)."""
        return txn_id == self.txn_id or txn_id in self.members

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"txn_id": self.txn_id, "staged": self.staged, "owner": dict(self.owner)}
        if self.members:
            out["members"] = list(self.members)
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SlotClaim:
        members = tuple(str(m) for m in d.get("members") or ())
        return SlotClaim(str(d["txn_id"]), str(d["staged"]), dict(d.get("owner") or {}), members)


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A claimed slot as stored."""

    version: int
    claim: SlotClaim
    complete: bool
    claimed_at: float  # epoch seconds

    @property
    def age(self) -> float:
        return max(0.0, time.time() - self.claimed_at)


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

    def sessions(self) -> dict[str, dict[str, str]]:
        """Live writer sessions and their owners, for stores that track them ({} otherwise)."""
        return {}

    def owner_alive(self, table: str, version: int) -> bool | None:
        """Whether the writer that claimed ``version`` provably still lives (True), is
        provably gone (False), or the store cannot tell (None, the default)."""
        return None

    def bind(self, table: str, table_id: str) -> None:
        """Record ``table_id`` as the owner of ``table``'s slots, or verify it.

        Raises :class:`TableBindingError` when the slots are bound to another id. Adapters
        that cannot persist bindings accept every id (the default).
        """
        return None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` released this store's connection (False for stores without one)."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Release connections and resources. Idempotent, and safe to call from any thread.

        A store that holds a connection (ZooKeeper) raises :class:`SlotStoreClosedError`
        from every call after it; stores without one (in-memory, local file) keep working.
        """

    def __enter__(self) -> SlotStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
