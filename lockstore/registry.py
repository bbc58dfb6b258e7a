"""Open a slot store from a URI-like spec (``slots=`` argument or ``EVENTLOG_SLOTS``).

* ``memory://``                     the process-wide :class:`InMemorySlotStore`
* ``file:///dir`` or ``/dir``       a :class:`LocalFileSlotStore` rooted at ``dir``
* ``zk://host:port[,host:port]/chroot``  the ZooKeeper adapter (``lockstore.zookeeper``),
  loaded by name only when asked for, so nothing imports kazoo unless it is used.

Any other scheme is refused with :class:`UnknownSlotStoreError`.

Sharing: one store (one ZooKeeper session) per spec per process, for as long as someone
uses it. :func:`open_slot_store` counts a use; :func:`release_slot_store` gives one back,
and the last one closes the store (tables do this on ``close()`` and when collected). The
registry holds stores weakly: a store that nobody references any more is garbage
collected, and collection closes its connection, whether or not its uses were given back.

Leases: closing a store releases the leases acquired through it (for ZooKeeper, its
session ends and the server deletes their znodes). A lease taken through a shared store
therefore lasts only while the store is open: whoever holds a lease should hold a use of
the store too (:func:`open_slot_store`) and give it back after releasing the lease. (The
process-wide ``memory://`` store is never really closed: its leases end by ``release``.)
"""

from __future__ import annotations

import importlib
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

from lockstore.base import LockstoreError, SlotStore
from lockstore.localfs import LocalFileSlotStore
from lockstore.memory import InMemorySlotStore

ENV_VAR = "EVENTLOG_SLOTS"

# scheme -> "module:factory"; factories take the full spec string.
_ADAPTERS: dict[str, str] = {
    "zk": "lockstore.zookeeper:from_uri",
    "zookeeper": "lockstore.zookeeper:from_uri",
}


class UnknownSlotStoreError(LockstoreError):
    """A slot store spec with a scheme no adapter handles."""

    def __init__(self, spec: str) -> None:
        schemes = sorted({"memory", "file", *_ADAPTERS})
        super().__init__(f"unknown slot store {spec!r}; supported schemes: {schemes}")
        self.spec = spec


@dataclass
class _Entry:
    store: weakref.ref[SlotStore]
    uses: int


# One store (one ZooKeeper session, one connection) per spec per process: opening many
# tables, or one table many times, must not leak connections. Keyed by pid so a forked
# child never reuses its parent's session. Held weakly (see the module docstring). The lock
# is reentrant: a garbage collection while it is held may finalize a table, whose finalizer
# releases its store here on the same thread; every loop below iterates over a copy.
_SHARED: dict[tuple[int, str], _Entry] = {}
_SHARED_LOCK = threading.RLock()


def open_slot_store(spec: str, *, shared: bool = True) -> SlotStore:
    """The slot store named by ``spec`` (see the module docstring).

    Shared per process unless ``shared=False``: every call with one spec returns the same
    store while it is open, and counts one use of it. Give the use back with
    :func:`release_slot_store`; the last use closes the store. A store nobody references
    is closed when it is garbage collected (or at exit). ``store.close()`` closes it for
    every user at once; the next call then opens a new one. With ``shared=False`` the
    caller owns a new store and closes it.
    """
    if not shared:
        return _open(spec)
    key = (os.getpid(), spec)
    with _SHARED_LOCK:
        _forget_dead()
        entry = _SHARED.get(key)
        store = entry.store() if entry is not None else None
        if entry is None or store is None or store.closed:
            store = _open(spec)
            entry = _Entry(weakref.ref(store), 0)
            _SHARED[key] = entry
        entry.uses += 1
        return store


def release_slot_store(store: SlotStore) -> None:
    """Give back one use of a store from :func:`open_slot_store`; the last one closes it.

    A store the registry does not share (``shared=False``, or made elsewhere) is closed.
    Safe from any thread; call it once per use (a table does, on close or collection).
    """
    with _SHARED_LOCK:
        entry = next((e for e in list(_SHARED.values()) if e.store() is store), None)
        if entry is not None:
            entry.uses -= 1
            if entry.uses > 0:
                return
            _forget_dead(store)
    store.close()


def shared_slot_stores() -> list[SlotStore]:
    """The open stores shared by this process (for tests and operations tools)."""
    with _SHARED_LOCK:
        stores = [e.store() for (pid, _), e in _SHARED.items() if pid == os.getpid()]
    return [s for s in stores if s is not None and not s.closed]


def _forget_dead(store: SlotStore | None = None) -> None:
    """Drop entries whose store was collected, is closed, or is ``store`` (lock held)."""
    for key, entry in list(_SHARED.items()):
        current = entry.store()
        if current is None or current is store or current.closed:
            del _SHARED[key]


def _open(spec: str) -> SlotStore:
    if spec.startswith("/"):
        return LocalFileSlotStore(spec)
    parsed = urlparse(spec)
    if parsed.scheme == "memory":
        return InMemorySlotStore.shared()
    if parsed.scheme == "file":
        return LocalFileSlotStore(parsed.path)
    target = _ADAPTERS.get(parsed.scheme)
    if target is None:
        raise UnknownSlotStoreError(spec)
    module_name, factory_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownSlotStoreError(spec) from exc
    factory: Callable[[str], SlotStore] = getattr(module, factory_name)
    return factory(spec)
