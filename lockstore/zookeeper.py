"""Version slots in ZooKeeper (through kazoo), for writers on many machines.

Layout under the store's chroot (default ``/eventlog``)::

    /tables/<sha1(table key)[:20]>      {"key": ..., "table_id": ...}   (bind)
        /latest                          "<N>"  the highest claimed version (a CAS counter)
        /slots/<20-digit N>              {"claim": {...}, "claimed_at": ..., "session": ..., "complete": bool}
        /counters/<sha1(name)[:20]>      "<n>"  a reserve_range counter (version-checked set)
    /ids/<table id>                      {"key": ...}   one table under one key only
    /sessions/<session id hex>           ephemeral: {"host", "pid", "app_id"} while a writer lives
    /leases/<sanitised name>-<sha1[:20]> ephemeral: {"name", "host", "pid", "info", "acquired_ms", "token"}

Claiming version N is one atomic multi-op: ``create(slots/N)`` (put-if-absent) plus
``set_data(latest, N, version=v)`` where ``v`` is the counter's znode version the caller's
``latest()`` read. Either both happen or neither. The counter makes ``latest`` one read
and makes a stale claim (one that read an old counter) fail even after old slots were
pruned. Server-assigned sequential znodes would avoid the CAS retry, but they hand out a
number before the writer has conflict-checked the commits below it, and a version must
only be assigned after that check; ``bench/bench_zookeeper.py`` measures both.

Slot state machine (one slot, version N)::

    (absent) --claim: multi-op create+CAS--> CLAIMED (complete=false; staged file named)
    CLAIMED  --writer publishes <N>.json, mark_complete--> COMPLETE
    CLAIMED  --writer died: any reader/writer publishes <N>.json from the staged file,
               then mark_complete (idempotent: same bytes)--> COMPLETE
    CLAIMED  --staged file provably gone and owner session expired: ``repair`` publishes an
               empty REPAIR commit at N (recorded in the log), mark_complete--> COMPLETE
    COMPLETE --pruned when more than ``retain`` newer slots exist--> (absent, but below the
               counter, so no claim can recreate it)

A group commit (``eventlog.txn.groupcommit``) claims like any writer; its claim lists the
members' transaction ids (``members``) and names the combined commit as its staged file,
so every path above applies to it unchanged.

Completion marks of a handle's own claims are batched: one multi-op of conditional sets
every ``MARK_FLUSH_SECONDS`` (and on close), instead of one write per commit; the handle
reports them complete at once. Group commit's followers wait for the next claim with a
data watch on ``latest`` (:meth:`ZooKeeperSlotStore.await_latest`).

Sessions: slot znodes are persistent, so a claim stands once the multi-op returned, even if
the writer's session is then lost; publishing needs no session and recovery is idempotent,
so a commit completes exactly once. A ``ConnectionLoss`` *during* the multi-op leaves the
outcome unknown: the store raises :class:`SlotStoreUnavailableError` and the engine looks
its transaction id up with :meth:`find_txn` before retrying. While the session is
SUSPENDED, calls wait (bounded by ``timeout``) for it to come back instead of sending;
after LOST, kazoo opens a new session and the store re-registers its session node. No call
waits longer than ``timeout`` seconds.

Leases (:meth:`ZooKeeperSlotStore.acquire_lease`): an ephemeral znode created with the
store's session, holding the owner's record. It exists exactly as long as the lease is
held: ``release`` deletes it, and the server deletes it when the session ends (the store
closes, or the owner died or lost its connection and the session timed out, ``timeout``
seconds after the server last heard from it). Creating it is the put-if-absent; an
existing node names the live owner (:class:`~lockstore.base.LeaseHeldError`). A retried
create that finds its own first attempt (same token) is the lease. ``Lease.held`` is a
local view: True while the session that created the node is connected, False while it is
suspended and for good once it is lost or the store closed; a lease lost with its session
is not taken again automatically. An owner cut off from the ensemble learns of the expiry
only when it reconnects: ``held`` is not a fence (see :mod:`lockstore.base`).

Closing: :meth:`ZooKeeperSlotStore.close` (idempotent, from any thread) sends the pending
completion marks, then stops the kazoo client and its threads; afterwards every call raises
:class:`~lockstore.base.SlotStoreClosedError`. A store that is garbage collected unclosed is
closed by a finalizer (and at interpreter exit at the latest): kazoo's threads refer to the
store's connection only, never to the store, so an unused store can be collected.

Giving up: while no server answers, kazoo reconnects in the background for at most
``reconnect_timeout`` seconds (default 60; counted from the first failed reconnect), then the
store stops the client and its threads, so a client whose servers are gone never retries
forever. The store stays usable: its next call opens a new session, bounded by ``timeout``,
or raises :class:`SlotStoreUnavailableError` (and the next call tries again).

The connection, the session and the batched completion marks are
:mod:`lockstore.zookeeper_session`'s; the leases are :mod:`lockstore.zookeeper_leases`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)
from kazoo.retry import KazooRetry
from kazoo.security import ACL, make_acl, make_digest_acl

from lockstore.base import (
    LockstoreError,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    SlotStoreClosedError,
    SlotStoreUnavailableError,
    TableBindingError,
    check_range_request,
    default_owner,
)
from lockstore.zookeeper_leases import ZooKeeperLeases
from lockstore.zookeeper_session import AMBIGUOUS, Connection, wait
from lockstore.zookeeper_session import MARK_FLUSH_SECONDS as MARK_FLUSH_SECONDS

log = logging.getLogger("lockstore.zookeeper")

DEFAULT_CHROOT = "/eventlog"
DEFAULT_TIMEOUT = 10.0
DEFAULT_RETAIN = 1000
DEFAULT_RECONNECT_TIMEOUT = 60.0  # background reconnecting stops after this long without a server


class InvalidSlotStoreUriError(LockstoreError):
    """A ``zk://`` URI that cannot be parsed."""


def table_node_name(table: str) -> str:
    """The znode name of a table's slot namespace (derived from its key, the table URI)."""
    return hashlib.sha1(table.encode()).hexdigest()[:20]


class ZooKeeperSlotStore(ZooKeeperLeases, SlotStore):
    """Version slots in ZooKeeper; see the module docstring for layout and state machine.

    ``hosts``: "host:port,host:port"; ``chroot``: path prefix for all znodes; ``auth``:
    ``(user, password)`` for digest authentication, which also puts ACLs on every znode
    the store creates (full rights for that user, read for everyone); ``timeout``: upper
    bound, in seconds, on every call (connection, session wait, each request), and the
    session timeout; ``reconnect_timeout``: how long the client keeps reconnecting in the
    background once no server answers, before it stops (see "Giving up" in the module
    docstring; shorter than ``timeout`` ends a session that could have survived).
    ``client``: a kazoo client to use instead of one built from these settings; the store
    starts it, and stops and closes it on :meth:`close`.

    :meth:`close` (or ``with store:``) releases the connection; so does garbage collection.
    """

    def __init__(
        self,
        hosts: str,
        *,
        chroot: str = DEFAULT_CHROOT,
        auth: tuple[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retain: int = DEFAULT_RETAIN,
        app_id: str | None = None,
        client: KazooClient | None = None,
        reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT,
    ) -> None:
        if not chroot.startswith("/"):
            raise InvalidSlotStoreUriError(f"chroot must start with '/', got {chroot!r}")
        if reconnect_timeout <= 0:
            raise ValueError(f"reconnect_timeout must be positive, got {reconnect_timeout}")
        self.hosts = hosts
        self.chroot = chroot.rstrip("/") or ""
        self.timeout = timeout
        self.retain = retain
        self._auth = auth
        self._acl: list[ACL] | None = None
        if auth is not None:
            self._acl = [make_digest_acl(auth[0], auth[1], all=True), make_acl("world", "anyone", read=True)]
        self._owner = default_owner(app_id)
        self._counter_versions: dict[str, tuple[int, int]] = {}  # table -> (latest, znode version)
        # Payloads of slots this store claimed and has not completed: completing them needs
        # no read (the slot znode is still at version 0 unless someone else completed it).
        self._own: dict[tuple[str, int], dict[str, Any]] = {}
        kazoo = client or KazooClient(
            hosts=hosts,
            timeout=timeout,
            # Reconnect quickly, but not forever: after reconnect_timeout without a server
            # the loop ends and the store stops the client (the next call reconnects).
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0, deadline=reconnect_timeout),
            auth_data=[("digest", f"{auth[0]}:{auth[1]}")] if auth else None,
        )
        self._conn = Connection(kazoo, hosts, timeout)
        self._lock = self._conn.lock
        self._connected = self._conn.connected
        self._lost = self._conn.lost
        # Closes the connection when the store is closed, collected, or at exit. It refers to
        # the connection only: nothing that kazoo's threads reach refers to the store.
        self._finalizer = weakref.finalize(self, self._conn.close)
        try:
            self._conn.start()
            self._ensure_session_node()
        except BaseException:
            self._finalizer()
            raise

    # ------------------------------------------------------------------ paths

    def _table_path(self, table: str) -> str:
        return f"{self.chroot}/tables/{table_node_name(table)}"

    def _slot_path(self, table: str, version: int) -> str:
        return f"{self._table_path(table)}/slots/{version:020d}"

    def _ensure_table(self, table: str) -> None:
        base = self._table_path(table)
        if self._call("exists", f"{base}/latest") is not None:
            return
        for path, data in (
            (base, json.dumps({"key": table, "table_id": None}).encode()),
            (f"{base}/slots", b""),
            (f"{base}/latest", b"-1"),
        ):
            try:
                # Created concurrently by another writer of this table: the goal.
                with contextlib.suppress(NodeExistsError):
                    self._call("create", path, data, acl=self._acl, makepath=True)
            except SlotStoreUnavailableError:
                # A retried create may have found its own first attempt: existence is the goal.
                if self._call("exists", path) is None:
                    raise

    # ------------------------------------------------------------------ the port

    def _read_counter(self, table: str, watch: Any = None) -> tuple[int, int]:
        """(latest, znode version) of the table's counter; ``watch`` fires on its next change."""
        path = f"{self._table_path(table)}/latest"
        try:
            data, stat = self._call("get", path, watch=watch)
        except NoNodeError:
            self._ensure_table(table)
            data, stat = self._call("get", path, watch=watch)
        value = int(data.decode() or "-1")
        with self._lock:
            self._counter_versions[table] = (value, stat.version)
        return value, stat.version

    def latest(self, table: str) -> int:
        return self._read_counter(table)[0]

    def await_latest(self, table: str, seen: int, timeout: float) -> int:
        """A data watch on the counter: one read, then sleep until ZooKeeper notifies."""
        deadline = time.monotonic() + min(timeout, self.timeout)
        while True:
            changed = threading.Event()
            latest = self._read_counter(table, watch=_waker(changed))[0]
            remaining = deadline - time.monotonic()
            if latest > seen or remaining <= 0 or not changed.wait(remaining):
                return latest

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        with self._lock:
            cached = self._counter_versions.get(table)
        counter, zversion = cached if cached is not None else self._read_counter(table)
        sid = self.session_id
        payload = json.dumps(
            {
                "claim": claim.to_dict(),
                "claimed_at": time.time(),
                "session": f"{sid:x}" if sid is not None else None,
                "complete": False,
            }
        ).encode()
        deadline = time.monotonic() + self.timeout
        while True:
            if version <= counter and self._call("exists", self._slot_path(table, version)):
                return False  # taken (or below the counter: stale)
            self._await_session()
            txn = self._client.transaction()
            txn.create(self._slot_path(table, version), payload, acl=self._acl)
            if version > counter:
                txn.set_data(f"{self._table_path(table)}/latest", str(version).encode(), version=zversion)
            try:
                results = wait(txn.commit_async(), self.timeout)
            except AMBIGUOUS as exc:
                with self._lock:
                    self._counter_versions.pop(table, None)
                if isinstance(exc, ConnectionClosedError) and self._conn.closed:
                    raise SlotStoreClosedError(
                        f"claim of version {version} of {table!r}: the slot store was closed"
                    ) from exc
                raise SlotStoreUnavailableError(
                    f"claim of version {version} of {table!r}: outcome unknown ({type(exc).__name__})"
                ) from exc
            except NoNodeError:
                self._ensure_table(table)
                counter, zversion = self._read_counter(table)
                continue
            failures = [r for r in results if isinstance(r, Exception)]
            if not failures:
                with self._lock:
                    if version > counter:
                        self._counter_versions[table] = (version, zversion + 1)
                    self._own[(table, version)] = json.loads(payload)
                return True
            if any(isinstance(r, NodeExistsError) for r in results):
                return False
            if any(isinstance(r, NoNodeError) for r in results):
                self._ensure_table(table)
            elif not any(isinstance(r, (BadVersionError, RolledBackError)) for r in results):
                raise LockstoreError(f"claim of version {version} of {table!r} failed: {failures}")
            # The counter moved (another writer claimed a version): re-read it. If it is
            # now at or past ``version``, the slot is taken or the claim was stale.
            counter, zversion = self._read_counter(table)
            if counter >= version or time.monotonic() > deadline:
                return False

    def get(self, table: str, version: int) -> SlotRecord | None:
        if version < 0:
            return None
        path = self._slot_path(table, version)
        try:
            data, _ = self._call("get", path)
        except NoNodeError:
            return None
        with self._lock:
            data = self._conn.pending_marks.get(path, data)
        return _record(version, data)

    def mark_complete(self, table: str, version: int) -> None:
        path = self._slot_path(table, version)
        with self._lock:
            own = self._own.pop((table, version), None)
            if own is not None:
                # Our own claim: completion is only a marker for operators (recovery keys
                # on <N>.json existing, and repair completes stragglers), so it is not sent
                # now: a background flush sends all pending marks of this handle in one
                # multi-op every MARK_FLUSH_SECONDS (one quorum write instead of one per
                # commit). This handle reports them complete at once.
                own["complete"] = True
                self._conn.pending_marks[path] = json.dumps(own).encode()
                self._conn.start_flusher()
        if own is not None:
            self._prune(table, version)
            return
        try:
            data, stat = self._call("get", path)
        except NoNodeError as exc:
            raise SlotNotClaimedError(table, version) from exc
        body, zversion = json.loads(data), stat.version
        if body.get("complete"):
            return
        body["complete"] = True
        try:
            self._call("set", path, json.dumps(body).encode(), version=zversion)
        except BadVersionError:
            pass  # another process completed it concurrently: same outcome
        except NoNodeError as exc:
            raise SlotNotClaimedError(table, version) from exc
        self._prune(table, version)

    def flush_marks(self, timeout: float | None = None) -> None:
        """Send the pending completion marks of this handle's own claims (one multi-op).

        The slot znodes are still at version 0 unless another process completed them,
        whose conditional set then fails harmlessly; a failed multi-op is retried one
        set at a time. ``timeout``: wait for the writes (default: fire and forget).
        """
        self._conn.flush_marks(timeout)

    def _prune(self, table: str, version: int) -> None:
        """Drop the slot ``retain`` versions below a completed one (fire and forget).

        Safe because every claim compares-and-sets the counter: a pruned slot sits below
        the counter, so no claim can recreate it.
        """
        old = version - self.retain
        if old >= 0:
            self._client.delete_async(self._slot_path(table, old))

    def find_txn(self, table: str, txn_id: str, start: int = 0) -> int | None:
        latest = self.latest(table)
        for version in range(latest, max(start, latest - self.retain) - 1, -1):
            record = self.get(table, version)
            if record is not None and record.claim.covers(txn_id):
                return version
        return None

    def reserve_range(self, table: str, name: str, count: int, floor: int = 0) -> int:
        """A compare-and-swap loop on the counter's znode (``set`` with the version read).

        A retried ``set`` whose first attempt landed fails its version check and the loop
        reads again: the lost range is a gap, never handed out twice."""
        check_range_request(count, floor)
        path = f"{self._table_path(table)}/counters/{table_node_name(name)}"
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                data, stat = self._call("get", path)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    self._call("create", path, b"0", acl=self._acl, makepath=True)
                continue
            first = max(int(data.decode() or "0"), floor)
            try:
                self._call("set", path, str(first + count).encode(), version=stat.version)
                return first
            except BadVersionError:
                if time.monotonic() > deadline:
                    raise SlotStoreUnavailableError(
                        f"counter {name!r} of {table!r}: still contended after {self.timeout}s"
                    ) from None

    def bind(self, table: str, table_id: str) -> None:
        self._ensure_table(table)
        base = self._table_path(table)
        data, stat = self._call("get", base)
        body = json.loads(data or b"{}")
        bound = body.get("table_id")
        if bound not in (None, table_id):
            raise TableBindingError(table, bound, table_id)
        id_path = f"{self.chroot}/ids/{table_id}"
        try:
            self._call(
                "create",
                id_path,
                json.dumps({"key": table}).encode(),
                acl=self._acl,
                makepath=True,
            )
        except NodeExistsError:
            owner = json.loads(self._call("get", id_path)[0]).get("key")
            if owner != table:
                raise TableBindingError(owner, table_id, table_id) from None
        if bound is None:
            body["table_id"] = table_id
            try:
                self._call("set", base, json.dumps(body).encode(), version=stat.version)
            except BadVersionError:
                self.bind(table, table_id)  # raced with another binder: verify what it wrote

    # ------------------------------------------------------------------ operations view

    def sessions(self) -> dict[str, dict[str, str]]:
        """Live writer sessions (ephemeral nodes) and their owners."""
        try:
            names: Sequence[str] = self._call("get_children", f"{self.chroot}/sessions")
        except NoNodeError:
            return {}
        out: dict[str, dict[str, str]] = {}
        for name in names:
            try:
                out[name] = json.loads(self._call("get", f"{self.chroot}/sessions/{name}")[0] or b"{}")
            except NoNodeError:
                continue  # expired while listing
        return out

    def owner_alive(self, table: str, version: int) -> bool | None:
        """False once the claiming writer's session expired (its ephemeral node is gone)."""
        session = self.session_of(table, version)
        if session is None:
            return None
        return self.session_alive(session)

    def session_of(self, table: str, version: int) -> str | None:
        try:
            data, _ = self._call("get", self._slot_path(table, version))
        except NoNodeError:
            return None
        session: str | None = json.loads(data).get("session")
        return session

    def tables(self) -> Iterator[tuple[str, str | None]]:
        """(key, table id) of every table with slots in this chroot."""
        try:
            names: Sequence[str] = self._call("get_children", f"{self.chroot}/tables")
        except NoNodeError:
            return
        for name in names:
            body = json.loads(self._call("get", f"{self.chroot}/tables/{name}")[0] or b"{}")
            yield body.get("key", name), body.get("table_id")

    def close(self) -> None:
        """Send the pending completion marks (bounded), then stop the client and its
        threads. Idempotent and safe from any thread, kazoo's own included; later calls
        raise :class:`SlotStoreClosedError`. Closing ends the session, so the server
        deletes this store's lease znodes: its leases end. Closing a store shared through
        :func:`lockstore.registry.open_slot_store` closes it for every user; tables give
        their use back with :func:`lockstore.registry.release_slot_store` instead."""
        self._finalizer()


def _waker(event: threading.Event) -> Any:
    """A watch callback that sets ``event`` (runs on kazoo's event thread)."""

    def wake(_event: Any) -> None:
        event.set()

    return wake


def _record(version: int, data: bytes) -> SlotRecord:
    body = json.loads(data)
    return SlotRecord(
        version=version,
        claim=SlotClaim.from_dict(body["claim"]),
        complete=bool(body.get("complete")),
        claimed_at=float(body.get("claimed_at") or 0.0),
    )


def parse_uri(uri: str) -> dict[str, Any]:
    """``zk://[user:password@]host:port[,host:port...][/chroot][?timeout=S&app_id=A&reconnect_timeout=S]``
    -> kwargs."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("zk", "zookeeper"):
        raise InvalidSlotStoreUriError(f"not a ZooKeeper URI: {uri!r}")
    netloc = parsed.netloc
    auth = None
    if "@" in netloc:
        creds, netloc = netloc.rsplit("@", 1)
        user, _, password = creds.partition(":")
        auth = (unquote(user), unquote(password))
    if not netloc:
        raise InvalidSlotStoreUriError(f"no ZooKeeper hosts in {uri!r}")
    kwargs: dict[str, Any] = {"hosts": netloc, "auth": auth}
    if parsed.path and parsed.path != "/":
        kwargs["chroot"] = parsed.path
    query = parse_qs(parsed.query)
    if "timeout" in query:
        kwargs["timeout"] = float(query["timeout"][0])
    if "app_id" in query:
        kwargs["app_id"] = query["app_id"][0]
    if "reconnect_timeout" in query:
        kwargs["reconnect_timeout"] = float(query["reconnect_timeout"][0])
    return kwargs


def from_uri(uri: str) -> ZooKeeperSlotStore:
    """The registry's factory for ``zk://`` specs."""
    kwargs = parse_uri(uri)
    hosts = kwargs.pop("hosts")
    return ZooKeeperSlotStore(hosts, **kwargs)
