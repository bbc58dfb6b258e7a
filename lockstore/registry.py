"""Open a slot store from a URI-like spec (``slots=`` argument or ``EVENTLOG_SLOTS``).

* ``memory://``                     the process-wide :class:`InMemorySlotStore`
* ``file:///dir`` or ``/dir``       a :class:`LocalFileSlotStore` rooted at ``dir`` (a table's
  own ``<table>/_eventlog/slots`` opens as its :class:`~lockstore.embedded.EmbeddedSlotStore`)
* ``zk://host:port[,host:port]/chroot``  the ZooKeeper adapter (``lockstore.zookeeper``),
  loaded by name only when asked for, so nothing imports kazoo unless it is used.
* ``s3://bucket/prefix`` (or ``s3a://``)  an :class:`~lockstore.objectstore.ObjectStoreSlotStore`
  on S3 conditional writes. Its file system is ``filesystem=`` if given (e.g. the table's
  own), else ``fsspec.core.url_to_fs(spec, **storage_options)`` (s3fs; without options it
  finds credentials and endpoint the usual way: ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``,
  profiles, instance roles). Query parameters ``lease_ttl`` and ``poll_interval`` (seconds)
  tune the store: ``s3://bucket/slots?lease_ttl=10``. s3fs is imported only when used; without
  it the spec is refused, saying to install the ``s3`` extra.

Any other scheme is refused with :class:`UnknownSlotStoreError`.

Sharing: one store (one ZooKeeper session) per spec, storage options and file system per
process, for as long as someone uses it. :func:`open_slot_store` counts a use;
:func:`release_slot_store` gives one back, and the last one closes the store (tables do
this on ``close()`` and when collected). The registry holds stores weakly: a store that
nobody references any more is garbage collected, and collection closes its connection,
whether or not its uses were given back.

Leases: closing a store releases the leases acquired through it (for ZooKeeper, its
session ends and the server deletes their znodes). A lease taken through a shared store
therefore lasts only while the store is open: whoever holds a lease should hold a use of
the store too (:func:`open_slot_store`) and give it back after releasing the lease. (The
process-wide ``memory://`` store is never really closed: its leases end by ``release``.)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from lockstore.base import LockstoreError, SlotStore
from lockstore.embedded import EmbeddedSlotStore, is_embedded_root
from lockstore.localfs import LocalFileSlotStore
from lockstore.memory import InMemorySlotStore

if TYPE_CHECKING:
    import fsspec

ENV_VAR = "EVENTLOG_SLOTS"

# scheme -> "module:factory"; factories take the full spec string.
_ADAPTERS: dict[str, str] = {
    "zk": "lockstore.zookeeper:from_uri",
    "zookeeper": "lockstore.zookeeper:from_uri",
}


class UnknownSlotStoreError(LockstoreError):
    """A slot store spec with a scheme no adapter handles."""

    def __init__(self, spec: str, reason: str = "") -> None:
        schemes = sorted({"memory", "file", *_ADAPTERS, *_OBJECT_STORE_SCHEMES})
        detail = f": {reason}" if reason else f"; supported schemes: {schemes}"
        super().__init__(f"unknown slot store {spec!r}{detail}")
        self.spec = spec
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.spec, self.reason))


# Schemes served by lockstore.objectstore (S3 conditional writes through s3fs).
_OBJECT_STORE_SCHEMES = ("s3", "s3a")


@dataclass
class _Entry:
    store: weakref.ref[SlotStore]
    uses: int


# One store (one ZooKeeper session, one connection) per spec per process: opening many
# tables, or one table many times, must not leak connections. Keyed by pid so a forked
# child never reuses its parent's session. Held weakly (see the module docstring). The lock
# is reentrant: a garbage collection while it is held may finalize a table, whose finalizer
# releases its store here on the same thread; every loop below iterates over a copy.
_SHARED: dict[tuple[int, str, str], _Entry] = {}
_SHARED_LOCK = threading.RLock()
_OPENING: dict[tuple[int, str, str], threading.Lock] = {}  # one opener per key at a time


def open_slot_store(
    spec: str,
    *,
    shared: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    filesystem: fsspec.AbstractFileSystem | None = None,
) -> SlotStore:
    """The slot store named by ``spec`` (see the module docstring).

    ``storage_options`` and ``filesystem`` serve object-store specs (``s3://``): the file
    system's options (credentials, endpoint), or a ready fsspec file system (the table's);
    other schemes ignore them.

    Shared per process unless ``shared=False``: every call with one spec (and the same
    options and file system) returns the same store while it is open, and counts one use
    of it. Give the use back with :func:`release_slot_store`; the last use closes the
    store. A store nobody references is closed when it is garbage collected (or at
    exit). ``store.close()`` closes it for every user at once; the next call then opens a
    new one. With ``shared=False`` the caller owns a new store and closes it.
    """
    if not shared:
        return _open(spec, storage_options, filesystem)
    key = (os.getpid(), spec, _options_key(storage_options, filesystem))
    store = _take_shared(key)
    if store is not None:
        return store
    with _SHARED_LOCK:
        opening = _OPENING.setdefault(key, threading.Lock())
    # Connecting may take seconds: only openers of this spec wait for it, and the registry
    # stays free meanwhile (a store collected meanwhile, on any thread, is given back
    # through it: holding it here deadlocked with a client thread running that release).
    with opening:
        store = _take_shared(key)  # opened by another thread while this one waited
        if store is not None:
            return store
        store = _open(spec, storage_options, filesystem)
        with _SHARED_LOCK:
            _SHARED[key] = _Entry(weakref.ref(store), 1)
        return store


def _take_shared(key: tuple[int, str, str]) -> SlotStore | None:
    """One more use of the open store under ``key``, if there is one."""
    with _SHARED_LOCK:
        _forget_dead()
        entry = _SHARED.get(key)
        store = entry.store() if entry is not None else None
        if entry is None or store is None or store.closed:
            return None
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
        stores = [e.store() for (pid, _, _), e in _SHARED.items() if pid == os.getpid()]
    return [s for s in stores if s is not None and not s.closed]


def _forget_dead(store: SlotStore | None = None) -> None:
    """Drop entries whose store was collected, is closed, or is ``store`` (lock held)."""
    for key, entry in list(_SHARED.items()):
        current = entry.store()
        if current is None or current is store or current.closed:
            del _SHARED[key]


def _options_key(
    storage_options: Mapping[str, Any] | None, filesystem: fsspec.AbstractFileSystem | None
) -> str:
    """What besides the spec tells stores apart: a digest of the storage options (never the
    secrets in clear: the key may show up in a debugger or a log) and the file system's
    identity (a store keeps its file system alive, so the id is not reused meanwhile)."""
    if not storage_options and filesystem is None:
        return ""
    canonical = json.dumps(dict(storage_options or {}), sort_keys=True, default=repr, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{digest}:{id(filesystem) if filesystem is not None else ''}"


def _open_object_store(
    spec: str, storage_options: Mapping[str, Any] | None, filesystem: fsspec.AbstractFileSystem | None
) -> SlotStore:
    """An ObjectStoreSlotStore for ``s3://bucket/prefix[?lease_ttl=..&poll_interval=..]``."""
    from lockstore.objectstore import ObjectStoreSlotStore

    location, _, query = spec.partition("?")
    tuning: dict[str, float] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if name not in ("lease_ttl", "poll_interval"):
            raise UnknownSlotStoreError(spec, f"unknown parameter {name!r} (lease_ttl, poll_interval)")
        try:
            tuning[name] = float(values[-1])
        except ValueError:
            raise UnknownSlotStoreError(spec, f"{name} must be a number of seconds") from None
    if filesystem is None:
        if importlib.util.find_spec("s3fs") is None:
            raise UnknownSlotStoreError(
                spec, "S3 slots need s3fs: install the 's3' extra (pip install 'eventlog-tables[s3]')"
            )
        import fsspec.core

        url = "s3://" + location.split("://", 1)[1]
        filesystem, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    else:
        root = location.split("://", 1)[1]
    if not root.strip("/"):
        raise UnknownSlotStoreError(spec, "name a bucket (and a prefix): s3://bucket/prefix")
    return ObjectStoreSlotStore(filesystem, root, **tuning)


def _local(path: str) -> LocalFileSlotStore:
    """A local-file store; a table's own ``<table>/_eventlog/slots`` named explicitly is
    that table's embedded store (one table, whatever its key: :mod:`lockstore.embedded`)."""
    return EmbeddedSlotStore(path) if is_embedded_root(path) else LocalFileSlotStore(path)


def _open(
    spec: str,
    storage_options: Mapping[str, Any] | None = None,
    filesystem: fsspec.AbstractFileSystem | None = None,
) -> SlotStore:
    if spec.startswith("/"):
        return _local(spec)
    parsed = urlparse(spec)
    if parsed.scheme == "memory":
        return InMemorySlotStore.shared()
    if parsed.scheme == "file":
        return _local(parsed.path)
    if parsed.scheme in _OBJECT_STORE_SCHEMES:
        return _open_object_store(spec, storage_options, filesystem)
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
