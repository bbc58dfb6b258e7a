"""The ZooKeeper adapter's connection and session (see "Sessions", "Closing" and "Giving
up" in :mod:`lockstore.zookeeper`): :class:`Connection`, the kazoo client of one store with
all the state kazoo's threads touch (connection state, giving up and reconnecting, the
batched completion marks and their flusher, closing); and :class:`ZooKeeperSession`, the
store's requests through it (bounded waits while suspended, the session node, retries on
connection loss).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import threading
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NodeExistsError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState, KeeperState
from kazoo.security import ACL

from lockstore.base import SlotStoreClosedError, SlotStoreUnavailableError

log = logging.getLogger("lockstore.zookeeper")

MARK_FLUSH_SECONDS = 0.5  # completion marks of own claims are sent in batches this often
# Errors meaning "the server may or may not have applied the request".
AMBIGUOUS = (ConnectionLoss, OperationTimeoutError, KazooTimeoutError, SessionExpiredError)
# Client states in which kazoo's connection loop has ended by itself (unless we stopped it).
_LOOP_ENDED = (KeeperState.CLOSED, KeeperState.AUTH_FAILED)


class Connection:
    """The kazoo client of one store, and all the state kazoo's threads touch.

    Kazoo's threads (state listener, watches, async callbacks) and the mark flusher refer to
    this object only, never to the store: a store nobody uses can be garbage collected, and
    its finalizer closes this connection. Starting, stopping and reconnecting the client are
    serialised by one lock; :meth:`close` is idempotent and safe from any thread (from one of
    kazoo's own threads it stops the client on a helper thread: ``stop()`` joins them).
    """

    def __init__(self, client: KazooClient, hosts: str, timeout: float) -> None:
        self.client = client
        self.hosts = hosts
        self.timeout = timeout
        self.pid = os.getpid()
        self.connected = threading.Event()
        self.lost = threading.Event()
        self.gave_up = threading.Event()  # the loop stopped reconnecting; the next call reconnects
        self.session_node_registered = False
        self.lock = threading.Lock()  # the pending marks (and the store's caches)
        self.pending_marks: dict[str, bytes] = {}  # slot path -> payload marked complete
        self.closed = False
        self._close_lock = threading.Lock()
        self._life_lock = threading.Lock()  # client.start / client.stop
        self._stopping = False  # set while we start or stop the client: its LOST is ours
        self._generation = 0  # bumped by every reconnect: a stale give-up must not stop it
        self._flusher: threading.Thread | None = None
        self._flusher_stop = threading.Event()
        client.add_listener(self._on_state)

    # -- state (kazoo's connection thread) ---------------------------------------------

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: only flip flags here, never call ZooKeeper.
        if state == KazooState.CONNECTED:
            self.connected.set()
        elif state == KazooState.SUSPENDED:
            self.connected.clear()
        elif state == KazooState.LOST:
            self.connected.clear()
            self.lost.set()
            self.session_node_registered = False
            if not self._stopping and not self.closed and self._loop_ended_by_itself():
                # The connection loop ended by itself: reconnect_timeout passed without a
                # server (or authentication failed). Its worker threads would idle forever:
                # stop them, from another thread (stop() joins this one).
                self.gave_up.set()
                log.warning(
                    "ZooKeeper at %s unreachable for the whole reconnect timeout (%s): "
                    "stopped reconnecting; the next call tries again",
                    self.hosts,
                    self.client.client_state,
                )
                threading.Thread(
                    target=self._retire, args=(self._generation,), name="lockstore-zk-retire", daemon=True
                ).start()

    def _loop_ended_by_itself(self) -> bool:
        """The client is CLOSED (or AUTH_FAILED) although nobody called its ``stop()``."""
        stopped = getattr(self.client, "_stopped", None)  # set first thing by KazooClient.stop
        stopped_by_someone = stopped is not None and stopped.is_set()
        return self.client.client_state in _LOOP_ENDED and not stopped_by_someone

    def _retire(self, generation: int) -> None:
        with self._life_lock:
            if self.closed or generation != self._generation or not self.gave_up.is_set():
                return
            self._stop_client()

    def _stop_client(self) -> None:
        """Stop and close the client (its threads end); the caller holds the life lock."""
        self._stopping = True
        try:
            self.client.stop()
            self.client.close()
        except Exception as exc:  # kazoo's WriterNotClosedException, a join from its own thread...
            log.warning("stopping the ZooKeeper client of %s failed: %s", self.hosts, exc)
        finally:
            self._stopping = False

    # -- connecting ----------------------------------------------------------------------

    def start(self) -> None:
        """Connect; SlotStoreUnavailableError when no server answers within ``timeout``."""
        with self._life_lock:
            self._connect()

    def reconnect(self) -> None:
        """A new session after the client gave up reconnecting (bounded by ``timeout``)."""
        with self._life_lock:
            if self.closed:
                raise SlotStoreClosedError(f"the slot store of ZooKeeper at {self.hosts} is closed")
            if not self.gave_up.is_set():
                return  # another caller reconnected meanwhile
            self._generation += 1
            self._stop_client()  # a no-op unless the retiring thread has not run yet
            self._connect()

    def _connect(self) -> None:
        self._stopping = True  # a start that times out stops the client: that LOST is ours
        try:
            self.client.start(timeout=self.timeout)
        except KazooTimeoutError as exc:  # kazoo stopped and closed the client itself
            raise SlotStoreUnavailableError(
                f"cannot connect to ZooKeeper at {self.hosts} within {self.timeout}s"
            ) from exc
        finally:
            self._stopping = False
        self.connected.set()
        self.gave_up.clear()

    # -- completion marks ------------------------------------------------------------------

    def start_flusher(self) -> None:
        """Start the background flush of completion marks (once); the caller holds ``lock``."""
        if self._flusher is None and not self.closed:
            self._flusher = threading.Thread(target=self._flush_loop, name="lockstore-zk-marks", daemon=True)
            self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._flusher_stop.wait(MARK_FLUSH_SECONDS):
            try:
                self.flush_marks()
            except Exception as exc:  # keep flushing: the next round sends the next marks
                log.info("flushing completion marks failed (repair will complete them): %s", exc)

    def flush_marks(self, timeout: float | None = None) -> None:
        """See :meth:`ZooKeeperSlotStore.flush_marks`."""
        with self.lock:
            pending, self.pending_marks = self.pending_marks, {}
        if not pending or (self.closed and timeout is None):
            return
        client = self.client
        txn = client.transaction()
        for path, data in pending.items():
            txn.set_data(path, data, version=0)
        request = txn.commit_async()

        def fallback(result: Any) -> None:
            failed = result.exception is not None or any(isinstance(r, Exception) for r in result.value)
            if failed:  # one of them completed (or pruned) elsewhere: send the others alone
                for path, data in pending.items():
                    client.set_async(path, data, version=0).rawlink(log_async_failure)

        request.rawlink(fallback)
        if timeout is not None:
            with contextlib.suppress(Exception):  # best effort: repair completes stragglers
                wait(request, timeout)

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Send the pending marks, stop the client and its threads. Idempotent, any thread."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
        self._flusher_stop.set()
        if os.getpid() != self.pid:
            return  # a forked child: the socket and the session are its parent's
        if self._on_client_thread():
            threading.Thread(target=self._shutdown, name="lockstore-zk-close", daemon=True).start()
        else:
            self._shutdown()

    def _on_client_thread(self) -> bool:
        current = threading.current_thread()
        workers = getattr(self.client.handler, "_workers", ())
        routine = getattr(getattr(self.client, "_connection", None), "_connection_routine", None)
        return current is routine or current in workers

    def _shutdown(self) -> None:
        try:
            # Marks only help operators (repair completes stragglers): wait briefly, and only
            # for a connection that may come back, never for a client that gave up.
            pending = bool(self.pending_marks) and not self.gave_up.is_set()
            if pending and self.connected.wait(min(self.timeout, 2.0)):
                self.flush_marks(timeout=self.timeout)
        except Exception as exc:
            log.info("sending completion marks at close failed (repair will): %s", exc)
        with self._life_lock:
            self._stop_client()
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join(timeout=4 * MARK_FLUSH_SECONDS)


class ZooKeeperSession:
    """The session handling of :class:`~lockstore.zookeeper.ZooKeeperSlotStore` (a base of
    it): its requests go through :meth:`_call`, which never sends while the session is
    suspended and retries a lost connection, all bounded by ``timeout``."""

    hosts: str
    chroot: str
    timeout: float
    _acl: list[ACL] | None
    _owner: dict[str, str]
    _conn: Connection

    @property
    def _client(self) -> KazooClient:
        return self._conn.client

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def session_id(self) -> int | None:
        cid = self._client.client_id
        return cid[0] if cid else None

    def _await_session(self) -> None:
        """Wait (bounded) while the session is suspended; never send while disconnected."""
        conn = self._conn
        if conn.closed:
            raise SlotStoreClosedError(f"the slot store of ZooKeeper at {self.hosts} is closed")
        if conn.gave_up.is_set():
            conn.reconnect()  # the client stopped reconnecting in the background: a new session
        if not conn.connected.wait(self.timeout):
            raise SlotStoreUnavailableError(
                f"ZooKeeper at {self.hosts} unreachable for {self.timeout}s (session suspended)"
            )
        if not conn.session_node_registered:
            self._ensure_session_node()

    def _ensure_session_node(self) -> None:
        sid = self.session_id
        if sid is None:
            return
        path = f"{self.chroot}/sessions/{sid:x}"
        try:
            # Already present (registered by an earlier call of this session): the goal.
            with contextlib.suppress(NodeExistsError):
                request = self._client.create_async(
                    path, json.dumps(self._owner).encode(), acl=self._acl, ephemeral=True, makepath=True
                )
                wait(request, self.timeout)
        except AMBIGUOUS:
            return  # retried on the next call
        self._conn.session_node_registered = True

    def session_alive(self, session_hex: str) -> bool:
        """Whether the writer session ``session_hex`` still exists (its ephemeral node)."""
        return self._call("exists", f"{self.chroot}/sessions/{session_hex}") is not None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A read or idempotent write, retried on connection loss, bounded by ``timeout``.

        Requests go through kazoo's async API with a deadline: its synchronous calls wait
        without one, and kazoo queues requests while reconnecting, so a request sent just
        as the quorum is lost would otherwise block until the quorum returns.
        """
        self._await_session()
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            remaining = deadline - time.monotonic()
            try:
                return wait(getattr(self._client, f"{method}_async")(*args, **kwargs), max(remaining, 0.001))
            except AMBIGUOUS as exc:
                if isinstance(exc, ConnectionClosedError) or self._conn.closed:
                    # The client was stopped under this call: the store was closed (raises
                    # SlotStoreClosedError), or the client gave up reconnecting (reconnects).
                    self._await_session()
                if time.monotonic() + delay >= deadline:
                    raise SlotStoreUnavailableError(
                        f"ZooKeeper at {self.hosts}: {type(exc).__name__} for {self.timeout}s"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)


def wait(request: Any, timeout: float) -> Any:
    """``request.get(timeout=timeout)``, raising a copy of a failure.

    A kazoo AsyncResult keeps the exception it raises (and kazoo's own closures often keep
    the AsyncResult in a reference cycle). Raised as is, the exception's traceback would
    collect every caller's frame into that cycle, keeping stores and tables alive until
    the cyclic garbage collector runs, and their connections open that long. The copy
    carries our frames; kazoo's keeps none.
    """
    try:
        return request.get(timeout=timeout)
    except Exception as exc:
        exc.__traceback__ = None
        del request  # no local may refer to what the raised copy's traceback holds
        raise _copy_of(exc) from None


def _copy_of(exc: Exception) -> Exception:
    try:
        return copy.copy(exc)
    except Exception:  # an exception type that cannot be copied: the original, then
        return exc


def log_async_failure(request: Any) -> None:
    exc = request.exception
    if exc is not None and not isinstance(exc, BadVersionError):
        log.info("marking a slot complete failed (repair will): %s", exc)
