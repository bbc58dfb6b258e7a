"""Leases of the ZooKeeper slot store (see "Leases" in :mod:`lockstore.zookeeper`): an
ephemeral znode of the store's session per lease, created and read by
:class:`ZooKeeperLeases` (a base of :class:`~lockstore.zookeeper.ZooKeeperSlotStore`), and a
lease's local view of whether it is still held.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from lockstore.base import (
    Lease,
    LeaseHeldError,
    LeaseOwner,
    LockstoreError,
    SlotStoreClosedError,
    SlotStoreUnavailableError,
    lease_node_name,
)
from lockstore.zookeeper_session import Connection, ZooKeeperSession, log_async_failure


class ZooKeeperLeases(ZooKeeperSession):
    """The leases of :class:`~lockstore.zookeeper.ZooKeeperSlotStore` (a base of it)."""

    def _lease_path(self, name: str) -> str:
        return f"{self.chroot}/leases/{lease_node_name(name)}"

    def acquire_lease(self, name: str, owner: LeaseOwner) -> Lease:
        """Create the lease's ephemeral znode (see "Leases" in :mod:`lockstore.zookeeper`);
        raise :class:`LeaseHeldError` naming the owner recorded in an existing one."""
        stamped = owner.stamped()
        token = secrets.token_hex(16)
        path = self._lease_path(name)
        payload = json.dumps(dict(stamped.to_dict(), name=name, token=token)).encode()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                # _call retries a lost connection; a retry may find its own first attempt.
                _, stat = self._call(
                    "create", path, payload, acl=self._acl, ephemeral=True, makepath=True, include_data=True
                )
                break
            except NodeExistsError:
                # Held (or our own retried create): read the holder below and decide.
                ...
            try:
                data, stat = self._call("get", path)
            except NoNodeError:  # released (or expired) meanwhile: try again
                if time.monotonic() > deadline:
                    raise SlotStoreUnavailableError(
                        f"lease {name!r}: its znode kept appearing and vanishing for {self.timeout}s"
                    ) from None
                continue
            record = _lease_record(data)
            if record.get("token") == token:
                break  # our own create, applied before its connection was lost
            raise LeaseHeldError(name, LeaseOwner.from_dict(record))
        session: int = stat.ephemeralOwner
        conn = self._conn
        current = _session_id(conn.client)
        if current is not None and current != session:
            # Created by a session that has expired since (the node went with it). While the
            # client is merely disconnected (None) the lease is returned: ``held`` tells.
            raise SlotStoreUnavailableError(
                f"lease {name!r}: the ZooKeeper session that created it ended at once; try again"
            )
        alive = _lease_alive(conn, session)

        def release(blocking: bool) -> None:
            if conn.closed or os.getpid() != conn.pid or _session_id(conn.client) != session:
                return  # the session ended, and the server deleted the node with it
            if not blocking:  # from a finalizer: never wait (it may run on kazoo's thread)
                conn.client.delete_async(path).rawlink(log_async_failure)
                return
            try:
                node = self._call("exists", path)
                if node is not None and node.ephemeralOwner == session:
                    self._call("delete", path, version=node.version)
            except (NoNodeError, BadVersionError, SlotStoreClosedError):
                pass  # gone already, or the store closed (which ended the session)

        return Lease(name, stamped, release=release, alive=alive)

    def lease_owner(self, name: str) -> LeaseOwner | None:
        """The owner recorded in the lease's znode; it exists only while its session lives."""
        try:
            data, _ = self._call("get", self._lease_path(name))
        except NoNodeError:
            return None
        return LeaseOwner.from_dict(_lease_record(data))


def _session_id(client: KazooClient) -> int | None:
    cid = client.client_id  # None unless connected
    return cid[0] if cid else None


def _lease_alive(conn: Connection, session: int) -> Callable[[], bool]:
    """``held`` of a ZooKeeper lease: its session is the client's, connected, not closed."""

    def alive() -> bool:
        return (
            not conn.closed
            and os.getpid() == conn.pid
            and conn.connected.is_set()
            and _session_id(conn.client) == session
        )

    return alive


def _lease_record(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data or b"{}")
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise LockstoreError(f"corrupt lease record: {data[:200]!r}")
    return record
