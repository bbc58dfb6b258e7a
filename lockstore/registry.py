"""Open a slot store from a URI-like spec (``slots=`` argument or ``EVENTLOG_SLOTS``).

* ``memory://``                     the process-wide :class:`InMemorySlotStore`
* ``file:///dir`` or ``/dir``       a :class:`LocalFileSlotStore` rooted at ``dir``
* ``zk://host:port[,host:port]/chroot``  the ZooKeeper adapter (``lockstore.zookeeper``),
  loaded by name only when asked for, so nothing imports kazoo unless it is used.

Any other scheme is refused with :class:`UnknownSlotStoreError`.
"""

from __future__ import annotations

import importlib
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


def open_slot_store(spec: str) -> SlotStore:
    """The slot store named by ``spec`` (see the module docstring)."""
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
