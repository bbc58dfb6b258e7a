"""Leases in ZooKeeper against a real server: the ephemeral znode, session expiry, a retried
create, closing, and ``held`` while the connection is suspended.

The contract (acquire, release, LeaseHeldError, lease_owner, a SIGKILLed child's lease taken
over after its session timeout) runs in ``tests/lockstore/test_contract.py`` for every adapter.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from lockstore import LeaseHeldError, lease_owner_here
from lockstore.base import SlotStoreClosedError, lease_node_name
from lockstore.zookeeper import ZooKeeperSlotStore
from tests.support.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zookeeper
CHECKPOINT = "s3://bucket/checkpoints/query-1"


def _expire(store: ZooKeeperSlotStore, hosts: str) -> int:
    """Expire the store's session on the server (another client attaches and closes it)."""
    sid, password = store._client.client_id
    other = KazooClient(hosts=hosts.split("/")[0], client_id=(sid, password))
    other.start(timeout=5)
    other.stop()
    other.close()
    return int(sid)


def _wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_lease_is_an_ephemeral_znode_of_the_stores_session(zk_chroot: str) -> None:
    with ZooKeeperSlotStore(zk_chroot, timeout=10) as store:
        lease = store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="q", runId="r"))
        path = f"/eventlog/leases/{lease_node_name(CHECKPOINT)}"
        data, stat = store._client.get(path)
        assert stat.ephemeralOwner == store.session_id
        record = json.loads(data)
        assert record["name"] == CHECKPOINT  # the original name is kept in the record
        assert {k: record[k] for k in ("host", "pid", "info", "acquired_ms")} == lease.owner.to_dict()
        assert len(record["token"]) == 32
        lease.release()
        assert store._client.exists(path) is None


def test_session_expiry_loses_the_lease_to_the_next_owner(zk_chroot: str) -> None:
    with ZooKeeperSlotStore(zk_chroot, timeout=5) as store, ZooKeeperSlotStore(zk_chroot, timeout=5) as other:
        lease = store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="first"))
        with pytest.raises(LeaseHeldError):
            other.acquire_lease(CHECKPOINT, lease_owner_here(queryId="second"))
        old = _expire(store, zk_chroot)
        _wait_for(lambda: not lease.held)  # as soon as the client sees its connection go
        _wait_for(lambda: store.session_id not in (None, old) and store._connected.is_set())
        assert not lease.held  # and for good: a new session does not hold the old one's leases
        assert other.lease_owner(CHECKPOINT) is None  # the server deleted the ephemeral node

        taken = other.acquire_lease(CHECKPOINT, lease_owner_here(queryId="second"))
        lease.release()  # the lost lease's release must not delete the new owner's node
        assert store.lease_owner(CHECKPOINT) == taken.owner
        with pytest.raises(LeaseHeldError) as info:
            store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="first"))
        assert info.value.owner.info == {"queryId": "second"}
        taken.release()
        store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="first")).release()


def test_a_retried_create_finds_its_own_first_attempt(
    zk_chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The create reaches the server but its reply is lost: the retry meets the node and
    recognises it by its token, instead of reporting the lease held by itself."""
    with ZooKeeperSlotStore(zk_chroot, timeout=10) as store:
        client = store._client
        create = client.create_async
        lost: list[str] = []

        def create_then_lose_the_reply(path: str, *args: Any, **kwargs: Any) -> Any:
            request = create(path, *args, **kwargs)
            if kwargs.get("ephemeral") and not lost:
                request.get(timeout=5)  # applied on the server
                lost.append(path)
                failed = client.handler.async_result()
                failed.set_exception(ConnectionLoss())
                return failed
            return request

        monkeypatch.setattr(client, "create_async", create_then_lose_the_reply)
        lease = store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="q"))
        assert lost and lease.held
        assert store.lease_owner(CHECKPOINT) == lease.owner
        with pytest.raises(LeaseHeldError):  # a different acquisition still fails
            store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="q"))
        lease.release()
        assert store.lease_owner(CHECKPOINT) is None


def test_close_ends_the_session_and_its_leases(zk_chroot: str) -> None:
    store = ZooKeeperSlotStore(zk_chroot, timeout=10)
    with ZooKeeperSlotStore(zk_chroot, timeout=10) as other:
        lease = store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="q"))
        assert other.lease_owner(CHECKPOINT) == lease.owner
        store.close()
        assert not lease.held
        lease.release()  # harmless: the node went with the session
        assert other.lease_owner(CHECKPOINT) is None  # no session timeout to wait for
        with pytest.raises(SlotStoreClosedError):
            store.acquire_lease(CHECKPOINT, lease_owner_here())
        with pytest.raises(SlotStoreClosedError):
            store.lease_owner(CHECKPOINT)
        other.acquire_lease(CHECKPOINT, lease_owner_here(queryId="next")).release()


def test_held_is_false_while_suspended_and_back_when_the_session_resumes() -> None:
    with ZooKeeperServer() as server:
        store = ZooKeeperSlotStore(server.hosts, timeout=20.0)
        try:
            lease = store.acquire_lease(CHECKPOINT, lease_owner_here(queryId="q"))
            session = store.session_id
            server.kill()
            _wait_for(lambda: not lease.held)  # suspended: not provably held
            server.restart()
            # The session outlived the outage (20 s timeout): its ephemeral node too.
            _wait_for(lambda: lease.held, timeout=30)
            assert store.session_id == session
            assert store.lease_owner(CHECKPOINT) == lease.owner
            lease.release()
            assert store.lease_owner(CHECKPOINT) is None
        finally:
            store.close()
