"""Slot-store contract tests specific to :class:`lockstore.InMemorySlotStore`: the shared
instance, and a lease inherited through fork."""

from __future__ import annotations

import os
import time
from typing import Any

from lockstore import InMemorySlotStore
from tests.lockstore.contract_support import CHECKPOINT, _claim, _query_owner, report_from_forked_child


def test_shared_in_memory_store_is_one_instance() -> None:
    shared = InMemorySlotStore.shared()
    assert InMemorySlotStore.shared() is shared
    assert isinstance(shared, InMemorySlotStore)
    table = f"memory://test-shared/{os.getpid()}/{time.monotonic_ns()}"
    assert shared.claim(table, 0, _claim("txn-shared")) is True
    shared.close()  # closing one user's handle must not drop the slots of others
    record = InMemorySlotStore.shared().get(table, 0)
    assert record is not None
    assert record.claim.txn_id == "txn-shared"
    assert InMemorySlotStore().latest(table) == -1  # a fresh store does not see them


def test_shared_in_memory_store_keeps_leases_when_a_table_closes_it() -> None:
    """Every memory:// table closes the shared store when done: that must not end leases."""
    shared = InMemorySlotStore.shared()
    name = f"memory-ck/{os.getpid()}/{time.monotonic_ns()}"
    with shared.acquire_lease(name, _query_owner()) as lease:
        shared.close()
        assert lease.held and shared.lease_owner(name) == lease.owner
    assert shared.lease_owner(name) is None


def test_in_memory_lease_inherited_through_fork_is_dead_in_the_child() -> None:
    store = InMemorySlotStore()
    lease = store.acquire_lease(CHECKPOINT, _query_owner())

    def in_child() -> dict[str, Any]:
        report = {"held": lease.held, "owner": store.lease_owner(CHECKPOINT) is not None}
        lease.release()  # a no-op in the child
        report["acquired"] = store.acquire_lease(CHECKPOINT, _query_owner("child")).held
        return report

    assert report_from_forked_child(in_child) == {"held": False, "owner": False, "acquired": True}
    assert lease.held and store.lease_owner(CHECKPOINT) == lease.owner  # the parent's is intact
    lease.release()
