"""Releasing ZooKeeper connections, against real servers.

A store that is closed or garbage collected, and a table that is closed (``with``) or
collected, stop their kazoo client and every thread of it; a client whose servers are gone
stops reconnecting after ``reconnect_timeout``. Otherwise clients outlive their servers and
retry forever (in the test suite: "Connection refused" printed after the summary line).
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from kazoo.protocol.states import KeeperState

from eventlog import Table, TableNotFoundError
from lockstore import SlotClaim, SlotStoreUnavailableError
from lockstore.base import SlotStoreClosedError
from lockstore.registry import shared_slot_stores
from lockstore.zookeeper import ZooKeeperSlotStore
from tests.conftest import SCHEMA, rows, sorted_ids
from tests.support.fixtures import running_kazoo_clients
from tests.support.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zookeeper
TABLE = "s3://bucket/warehouse/lifecycle"


def _threads(store: ZooKeeperSlotStore) -> list[threading.Thread]:
    """Every thread working for ``store``: kazoo's connection loop, its callback and
    completion workers, and the store's mark flusher (if it started)."""
    client = store._client
    threads = list(client.handler._workers)
    routine = client._connection._connection_routine
    if routine is not None:
        threads.append(routine)
    flusher = store._conn._flusher
    if flusher is not None:
        threads.append(flusher)
    return threads


def _assert_released(client: Any, threads: list[threading.Thread], within: float = 0.0) -> None:
    """The client is stopped and none of ``threads`` runs (now, or within ``within`` seconds)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and (client.connected or any(t.is_alive() for t in threads)):
        time.sleep(0.05)
    assert not client.connected
    assert client.client_state == KeeperState.CLOSED
    assert [t.name for t in threads if t.is_alive()] == []
    assert client not in running_kazoo_clients()


def _zk_stores() -> list[ZooKeeperSlotStore]:
    return [s for s in shared_slot_stores() if isinstance(s, ZooKeeperSlotStore)]


# ------------------------------------------------------------------ stores


def test_close_stops_the_client_and_every_thread(zk_chroot: str) -> None:
    store = ZooKeeperSlotStore(zk_chroot, timeout=10)
    assert store.claim(TABLE, 0, SlotClaim("t0", "t0.json"))
    store.mark_complete(TABLE, 0)  # starts the mark flusher; close sends the pending mark
    client, threads = store._client, _threads(store)
    assert len(threads) == 4 and all(t.is_alive() for t in threads)
    store.close()
    _assert_released(client, threads)  # at once: close returns when everything stopped
    store.close()  # idempotent
    assert store.closed
    with pytest.raises(SlotStoreClosedError):
        store.latest(TABLE)
    with pytest.raises(SlotStoreClosedError):
        store.claim(TABLE, 1, SlotClaim("t1", "t1.json"))
    with ZooKeeperSlotStore(zk_chroot, timeout=10) as other:
        record = other.get(TABLE, 0)
        assert record is not None and record.complete  # sent by close


def test_a_collected_store_closes_its_client(zk_chroot: str) -> None:
    store = ZooKeeperSlotStore(zk_chroot, timeout=10)
    assert store.claim(TABLE, 0, SlotClaim("t0", "t0.json"))
    store.mark_complete(TABLE, 0)  # the flusher thread runs
    assert store.get(TABLE, 7) is None  # a failure (NoNodeError) kazoo keeps in a cycle
    assert store.await_latest(TABLE, 0, timeout=0.05) == 0  # a watch callback left in kazoo
    client, threads, collected = store._client, _threads(store), weakref.ref(store)
    del store  # reference counting alone frees it: nothing kazoo's threads hold refers to it
    assert collected() is None
    _assert_released(client, threads)


def test_close_is_safe_from_any_thread(zk_chroot: str) -> None:
    # From one of kazoo's own threads (a watch callback): stop() joins those threads, so
    # the store stops the client from a helper thread instead of deadlocking.
    store = ZooKeeperSlotStore(zk_chroot, timeout=10)
    client, threads = store._client, _threads(store)
    closed = threading.Event()

    def on_change(_event: Any) -> None:
        store.close()
        closed.set()

    client.exists("/flag", watch=on_change)
    client.create("/flag")
    assert closed.wait(10)
    _assert_released(client, threads, within=10)

    # From many threads at once: one closes, the others return.
    store = ZooKeeperSlotStore(zk_chroot, timeout=10)
    client, threads = store._client, _threads(store)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def close() -> None:
        barrier.wait()
        try:
            store.close()
        except BaseException as exc:  # pragma: no cover - the failure reported below
            errors.append(exc)

    closers = [threading.Thread(target=close) for _ in range(8)]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(30)
    assert errors == [] and not any(c.is_alive() for c in closers)
    _assert_released(client, threads, within=10)


def test_a_client_whose_server_is_gone_stops_and_the_next_call_reconnects() -> None:
    with ZooKeeperServer(tick_ms=500, force_sync=False) as server:
        store = ZooKeeperSlotStore(server.hosts, timeout=2.0, reconnect_timeout=1.0)
        try:
            assert store.claim(TABLE, 0, SlotClaim("t0", "t0.json"))
            client, threads = store._client, _threads(store)
            server.stop()
            # kazoo reconnects for reconnect_timeout, then the store stops it: no retrying forever.
            _assert_released(client, threads, within=20)
            assert not store.closed
            started = time.monotonic()
            with pytest.raises(SlotStoreUnavailableError):
                store.latest(TABLE)  # one attempt at a new session, bounded by timeout
            assert time.monotonic() - started < 10
            _assert_released(client, _threads(store), within=5)  # the attempt left nothing running
            server.restart()
            assert store.latest(TABLE) == 0  # the next call opened a new session
            assert store.claim(TABLE, 1, SlotClaim("t1", "t1.json"))
            assert store.owner_alive(TABLE, 1) is True  # ... and registered it
        finally:
            store.close()
        _assert_released(client, _threads(store))


# ------------------------------------------------------------------ tables


def test_a_table_used_as_a_context_manager_releases_its_connection(tmp_path: Path, zk_chroot: str) -> None:
    spec = f"zk://{zk_chroot}?timeout=10"
    uri = str(tmp_path / "t")
    with Table.create(uri, SCHEMA, slots=spec) as table:
        table.append(rows([1, 2]))
        store = table.slots
        assert isinstance(store, ZooKeeperSlotStore)
        client, threads = store._client, _threads(store)
    assert store.closed and store not in _zk_stores()
    _assert_released(client, threads)
    with pytest.raises(SlotStoreClosedError):
        store.latest(table.key)
    with Table.open(uri, slots=spec) as again:  # the next table opens a new connection
        assert again.slots is not store and sorted_ids(again) == [1, 2]
        record = again.slots.get(again.key, 1)
        assert record is not None and record.complete  # the append's mark was sent at close
    assert _zk_stores() == []


def test_tables_sharing_a_store_close_it_with_the_last(tmp_path: Path, zk_chroot: str) -> None:
    spec = f"zk://{zk_chroot}?timeout=10"
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, slots=spec).close()
    first, second = Table.open(uri, slots=spec), Table.open(uri, slots=spec)
    store = first.slots
    assert isinstance(store, ZooKeeperSlotStore) and second.slots is store  # one session per spec
    client, threads = store._client, _threads(store)
    first.close()
    first.close()  # idempotent: gives back this table's use once
    assert not store.closed and second.version == 0
    del second  # collected unclosed: gives back its use too
    assert store.closed
    _assert_released(client, threads)


def test_a_failed_open_releases_and_a_store_passed_in_stays_open(tmp_path: Path, zk_chroot: str) -> None:
    with pytest.raises(TableNotFoundError):
        Table.open(str(tmp_path / "missing"), slots=f"zk://{zk_chroot}?timeout=10")
    assert _zk_stores() == []
    uri = str(tmp_path / "t")
    with ZooKeeperSlotStore(zk_chroot, timeout=10) as store:
        with Table.create(uri, SCHEMA, slots=store) as table:
            table.append(rows([1]))
        assert not store.closed  # a table leaves a store it was given to its owner
        with Table.open(uri, slots=store) as again:
            assert again.version == 1
        assert not store.closed
    assert store.closed


def test_an_unreachable_slot_store_at_open_is_the_engines_error(tmp_path: Path) -> None:
    """A ZooKeeper slot store that cannot be reached when a table is opened raises
    eventlog's SlotStoreError (as reads document it), with lockstore's error chained."""
    import socket

    from eventlog import SlotStoreError

    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA).append(rows([1]))
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SlotStoreError) as err:
        Table.open(uri, f"zk://127.0.0.1:{port}/unreachable")
    assert time.monotonic() - started < 30  # bounded by the store's connect timeout
    assert err.value.uri == Table.open(uri).uri
    assert isinstance(err.value.__cause__, SlotStoreUnavailableError)
    assert Table.open(uri).version == 1  # nothing was written
