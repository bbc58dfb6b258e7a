"""In-process :class:`~lockstore.base.SlotStore` for tests and ``memory://`` tables.

Safe across threads of one process (every operation runs under one lock); it shares
nothing with other processes. It enforces the same rules as the file and ZooKeeper
adapters, so code tested against it behaves the same against them.

Leases are entries of a dict under the store's lock: a lease is alive until its handle
is released (or collected) or the store is closed. They exclude holders within this
process only. A forked child inherits a copy of the dict; entries recorded by another
process (the parent) count as dead there and are taken over.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from lockstore.base import (
    Lease,
    LeaseHeldError,
    LeaseOwner,
    LeaseSet,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    TableBindingError,
    check_range_request,
)


@dataclass(slots=True)
class _Slot:
    claim: dict[str, Any]  # stored as plain data: callers cannot mutate it through a SlotClaim
    claimed_at: float
    complete: bool = False


@dataclass(frozen=True, slots=True)
class _Holder:
    token: str
    pid: int  # the process that acquired it: another pid here means a forked copy
    owner: LeaseOwner


class _MemoryLeases:
    """The lease table of one store; the handles' release callables refer to it, never to
    the store (a collected store must not be kept alive by its leases' finalizers)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.holders: dict[str, _Holder] = {}

    def live(self, name: str) -> _Holder | None:
        """The live holder of ``name`` (lock held)."""
        holder = self.holders.get(name)
        if holder is not None and holder.pid != os.getpid():
            del self.holders[name]  # inherited through fork: its handle is the parent's
            return None
        return holder

    def release(self, name: str, token: str) -> None:
        with self.lock:
            holder = self.holders.get(name)
            if holder is not None and holder.token == token:
                del self.holders[name]

    def alive(self, name: str, token: str) -> bool:
        with self.lock:
            holder = self.holders.get(name)
            return holder is not None and holder.token == token


class InMemorySlotStore(SlotStore):
    """Version slots held in a dict, guarded by one :class:`threading.Lock`.

    Guarantees (within one process): exclusive grant, durable record for the lifetime of
    the store, monotone ``latest``, idempotent ``mark_complete``, persistent ``bind``,
    exclusive leases. ``close`` keeps the slots, so closing one table never drops the
    slots of others that share the store; it releases the store's leases, except on the
    process-wide :meth:`shared` store, which every ``memory://`` table closes when it is
    done with it: its leases end only by ``release`` (or when their handles are collected).
    """

    _shared: ClassVar[InMemorySlotStore | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed = threading.Condition(self._lock)  # notified on every claim
        self._slots: dict[str, dict[int, _Slot]] = {}
        self._latest: dict[str, int] = {}
        self._bindings: dict[str, str] = {}
        self._counters: dict[tuple[str, str], int] = {}
        self._lease_table = _MemoryLeases(self._lock)
        self._leases = LeaseSet()

    @classmethod
    def shared(cls) -> InMemorySlotStore:
        """The process-wide store used by default for ``memory://`` tables (always the same object)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        """Put-if-absent under the lock: True for exactly one caller per ``(table, version)``."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        # Serialise outside the lock; a copy decouples the store from the caller's owner dict.
        data = claim.to_dict()
        with self._lock:
            slots = self._slots.setdefault(table, {})
            if version in slots:
                return False
            slots[version] = _Slot(data, time.time())
            # max(): a claim below latest (the store does not forbid gaps) must not lower it.
            if version > self._latest.get(table, -1):
                self._latest[table] = version
            self._claimed.notify_all()
            return True

    def latest(self, table: str) -> int:
        """The highest claimed version of ``table``, or -1."""
        with self._lock:
            return self._latest.get(table, -1)

    def await_latest(self, table: str, seen: int, timeout: float) -> int:
        """Wait on the store's condition until a claim moves ``latest`` past ``seen``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while (latest := self._latest.get(table, -1)) <= seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._claimed.wait(remaining)
            return latest

    def get(self, table: str, version: int) -> SlotRecord | None:
        """The stored claim (a fresh copy) of ``version``, or None if it was never claimed."""
        with self._lock:
            slot = self._slots.get(table, {}).get(version)
            if slot is None:
                return None
            data, claimed_at, complete = slot.claim, slot.claimed_at, slot.complete
        return SlotRecord(version, SlotClaim.from_dict(data), complete, claimed_at)

    def mark_complete(self, table: str, version: int) -> None:
        """Flag ``version`` as published; idempotent. Raises :class:`SlotNotClaimedError` if unclaimed."""
        with self._lock:
            slot = self._slots.get(table, {}).get(version)
            if slot is None:
                raise SlotNotClaimedError(table, version)
            slot.complete = True

    def reserve_range(self, table: str, name: str, count: int, floor: int = 0) -> int:
        """The counter moved under the store's lock."""
        check_range_request(count, floor)
        with self._lock:
            first = max(self._counters.get((table, name), 0), floor)
            self._counters[(table, name)] = first + count
        return first

    def bind(self, table: str, table_id: str) -> None:
        """Bind ``table`` to ``table_id`` on first call; raise :class:`TableBindingError` on another id."""
        with self._lock:
            bound = self._bindings.setdefault(table, table_id)
        if bound != table_id:
            raise TableBindingError(table, bound, table_id)

    def acquire_lease(self, name: str, owner: LeaseOwner) -> Lease:
        """An entry in the store's lease dict; :class:`LeaseHeldError` if a live one exists."""
        stamped = owner.stamped()
        token = secrets.token_hex(8)
        table = self._lease_table
        with self._lock:
            holder = table.live(name)
            if holder is not None:
                raise LeaseHeldError(name, holder.owner)
            table.holders[name] = _Holder(token, os.getpid(), stamped)

        def release(_blocking: bool) -> None:
            table.release(name, token)

        def alive() -> bool:
            return table.alive(name, token)

        return self._leases.add(Lease(name, stamped, release=release, alive=alive))

    def lease_owner(self, name: str) -> LeaseOwner | None:
        with self._lock:
            holder = self._lease_table.live(name)
        return holder.owner if holder is not None else None

    def close(self) -> None:
        """Release this store's leases (not on :meth:`shared`); the slots stay: they live as
        long as the object (the shared store is never emptied)."""
        if self is not type(self)._shared:
            self._leases.release_all()
