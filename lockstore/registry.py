"""Open a slot store from a URI-like spec (``slots=`` argument or ``EVENTLOG_SLOTS``).

* ``memory://``                     the process-wide :class:`InMemorySlotStore`
* ``file:///dir`` or ``/dir``       a :class:`LocalFileSlotStore` rooted at ``dir``
* ``zk://host:port[,host:port]/chroot``  the ZooKeeper adapter (``lockstore.zookeeper``),
  loaded by name only when asked for, so nothing imports kazoo unless it is used.

Any other scheme is refused with :class:`UnknownSlotStoreError`.
"""

from __future__ import annotations

import atexit
import importlib
import os
import threading
from collections.abc import Callable
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


# One store (one ZooKeeper session, one connection) per spec per process: opening many
# tables, or one table many times, must not leak connections. Keyed by pid so a forked
# child never reuses its parent's session.
_SHARED: dict[tuple[int, str], SlotStore] = {}
_SHARED_LOCK = threading.Lock()


def open_slot_store(spec: str, *, shared: bool = True) -> SlotStore:
    """The slot store named by ``spec`` (see the module docstring).

    Stores that hold connections are shared per process unless ``shared=False``; they
    are closed when the process exits.
    """
    if not shared:
        return _open(spec)
    key = (os.getpid(), spec)
    with _SHARED_LOCK:
        store = _SHARED.get(key)
        if store is None or getattr(store, "closed", False):
            store = _open(spec)
            _SHARED[key] = store
        return store


@atexit.register
def _close_shared() -> None:
    with _SHARED_LOCK:
        stores = [s for (pid, _), s in _SHARED.items() if pid == os.getpid()]
        _SHARED.clear()
    for store in stores:
        store.close()


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
