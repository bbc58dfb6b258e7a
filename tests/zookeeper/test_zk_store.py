"""The ZooKeeper slot store against a real ZooKeeper: URIs, security, binding, sessions."""

from __future__ import annotations

import time
import weakref

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.protocol.states import KeeperState

from lockstore import SlotClaim, SlotStoreUnavailableError, TableBindingError
from lockstore.registry import UnknownSlotStoreError, open_slot_store, release_slot_store, shared_slot_stores
from lockstore.zookeeper import InvalidSlotStoreUriError, ZooKeeperSlotStore, parse_uri, table_node_name
from tests.support.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zookeeper
TABLE = "s3://bucket/warehouse/events"


def test_uri_parsing_and_unknown_schemes() -> None:
    kw = parse_uri("zk://alice:s%40cret@h1:2181,h2:2182/tables/prod?timeout=3.5&app_id=etl")
    assert kw == {"hosts": "h1:2181,h2:2182", "auth": ("alice", "s@cret"), "chroot": "/tables/prod",
                  "timeout": 3.5, "app_id": "etl"}  # fmt: skip
    assert parse_uri("zk://h1:2181?reconnect_timeout=30")["reconnect_timeout"] == 30.0
    with pytest.raises(InvalidSlotStoreUriError):
        parse_uri("zk:///chroot-without-hosts")
    with pytest.raises(UnknownSlotStoreError) as info:
        open_slot_store("etcd://h1:2379/x")
    assert "etcd://h1:2379/x" in str(info.value)


def test_registry_opens_zookeeper(zk_chroot: str) -> None:
    store = open_slot_store(f"zk://{zk_chroot}?timeout=5")
    try:
        assert isinstance(store, ZooKeeperSlotStore)
        assert store.claim(TABLE, 0, SlotClaim("t0", "t0.json"))
        assert store.latest(TABLE) == 0
    finally:
        store.close()


def test_one_connection_per_spec_per_process(zk_chroot: str) -> None:
    spec = f"zk://{zk_chroot}?timeout=5"
    first = open_slot_store(spec)
    assert open_slot_store(spec) is first  # tables opened with one spec share a session
    release_slot_store(first)
    assert not first.closed  # one use is left
    release_slot_store(first)
    assert first.closed  # the last use closed it
    again = open_slot_store(spec)
    assert again is not first and again.latest(TABLE) == -1  # a closed store is replaced
    assert open_slot_store(spec) is again
    again.close()  # closes it for every user at once
    assert again.closed and again not in shared_slot_stores()
    release_slot_store(again)  # a late give-back of a closed store is harmless
    private = open_slot_store(spec, shared=False)
    assert private is not again and private not in shared_slot_stores()
    private.close()


def test_the_registry_holds_stores_weakly(zk_chroot: str) -> None:
    spec = f"zk://{zk_chroot}?timeout=5"
    store = open_slot_store(spec)  # a use never given back...
    store.latest(TABLE)
    client, collected = store._client, weakref.ref(store)
    del store  # ... but nothing references the store any more: collected, and closed
    assert collected() is None
    assert not client.connected and client.client_state == KeeperState.CLOSED
    fresh = open_slot_store(spec)
    assert fresh.latest(TABLE) == -1
    release_slot_store(fresh)
    assert fresh.closed


def test_digest_auth_and_acls_keep_other_clients_out(zk_chroot: str) -> None:
    store = ZooKeeperSlotStore(zk_chroot, auth=("writer", "pw"), timeout=5)
    intruder = KazooClient(hosts=zk_chroot)
    wrong = KazooClient(hosts=zk_chroot, auth_data=[("digest", "writer:nope")])
    intruder.start(timeout=5)
    wrong.start(timeout=5)
    try:
        assert store.claim(TABLE, 0, SlotClaim("t0", "t0.json"))
        slots = f"/eventlog/tables/{table_node_name(TABLE)}/slots"
        for client in (intruder, wrong):
            with pytest.raises(NoAuthError):
                client.create(f"{slots}/{1:020d}", b"{}")
            with pytest.raises(NoAuthError):
                client.set(f"/eventlog/tables/{table_node_name(TABLE)}/latest", b"99")
            assert client.get(f"{slots}/{0:020d}")[0]  # reading stays open
        assert store.latest(TABLE) == 0
        assert store.claim(TABLE, 1, SlotClaim("t1", "t1.json"))
    finally:
        for client in (intruder, wrong):
            client.stop()
            client.close()
        store._client.delete("/eventlog", recursive=True)  # ACL'd nodes: only the writer may
        store.close()


def test_one_key_one_table_and_one_table_one_key(zk_chroot: str) -> None:
    store = ZooKeeperSlotStore(zk_chroot, timeout=5)
    try:
        store.bind(TABLE, "id-a")
        store.bind(TABLE, "id-a")  # idempotent
        with pytest.raises(TableBindingError):
            store.bind(TABLE, "id-b")  # two tables claiming one path
        with pytest.raises(TableBindingError):
            store.bind("s3://bucket/elsewhere/events", "id-a")  # one table under two paths
    finally:
        store.close()


def _expire(store: ZooKeeperSlotStore, hosts: str) -> int:
    """Expire the store's session on the server (another client attaches and closes it)."""
    sid, password = store._client.client_id
    other = KazooClient(hosts=hosts.split("/")[0], client_id=(sid, password))
    other.start(timeout=5)
    other.stop()
    other.close()
    return int(sid)


def test_session_expiry_reconnects_and_marks_old_claims_orphaned(zk_chroot: str) -> None:
    store = ZooKeeperSlotStore(zk_chroot, timeout=5)
    try:
        assert store.claim(TABLE, 0, SlotClaim("t0", "t0.json"))
        assert store.owner_alive(TABLE, 0) is True
        old = _expire(store, zk_chroot)
        deadline = time.monotonic() + 10
        while (
            store.session_id in (None, old) or not store._connected.is_set()
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.session_id not in (None, old)
        assert store.latest(TABLE) == 0  # the claim outlived the session (persistent znode)
        assert store.owner_alive(TABLE, 0) is False  # ... and its owner is provably gone
        assert store.claim(TABLE, 1, SlotClaim("t1", "t1.json"))
        assert store.owner_alive(TABLE, 1) is True
    finally:
        store.close()


def test_calls_are_bounded_when_zookeeper_is_down() -> None:
    with ZooKeeperServer() as server:
        store = ZooKeeperSlotStore(server.hosts, timeout=2.0)
        assert store.claim(TABLE, 0, SlotClaim("t0", "t0.json"))
        server.kill()
        started = time.monotonic()
        with pytest.raises(SlotStoreUnavailableError):
            store.latest(TABLE)
        with pytest.raises(SlotStoreUnavailableError):
            store.claim(TABLE, 1, SlotClaim("t1", "t1.json"))
        assert time.monotonic() - started < 10.0
        server.restart()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                assert store.latest(TABLE) == 0
                break
            except SlotStoreUnavailableError:
                time.sleep(0.2)
        assert store.claim(TABLE, 1, SlotClaim("t1", "t1.json"))
        store.close()
