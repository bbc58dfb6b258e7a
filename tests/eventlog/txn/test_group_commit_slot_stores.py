"""Group commit and the slot stores: group claims, waiting for the latest claim, and a
queued append withdrawn when the store keeps refusing its claims.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from eventlog import CommitStateUnknownError, Table
from eventlog.log.commit import member_txn_ids
from eventlog.log.storage import LogStore
from eventlog.txn.groupcommit import QueuedName
from eventlog.txn.retry import RetryPolicy
from lockstore import InMemorySlotStore, LocalFileSlotStore, SlotClaim, SlotStore
from tests.conftest import SCHEMA, rows, sorted_ids

# --------------------------------------------------------------------------- slot stores


@pytest.fixture(params=["in-memory", "local-file"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> SlotStore:
    if request.param == "in-memory":
        return InMemorySlotStore()
    return LocalFileSlotStore(str(tmp_path / "slots"))


def test_group_claim_lists_members_and_find_txn_matches_them(store: SlotStore) -> None:
    assert store.claim("t", 0, SlotClaim("solo", "solo.json"))
    group = SlotClaim("group-1", "group-group-1.json", {"host": "h"}, ("m1", "m2", "m3"))
    assert store.claim("t", 1, group)
    assert not store.claim("t", 1, SlotClaim("m2", "m2.json"))  # a member cannot take it again
    record = store.get("t", 1)
    assert record is not None
    assert record.claim.members == ("m1", "m2", "m3") and record.claim.txn_id == "group-1"
    assert record.claim.covers("m2") and record.claim.covers("group-1") and not record.claim.covers("solo")
    assert [store.find_txn("t", txn) for txn in ("m1", "m3", "group-1", "solo")] == [1, 1, 1, 0]
    assert store.find_txn("t", "m1", start=2) is None and store.find_txn("t", "nobody") is None
    plain = store.get("t", 0)
    assert plain is not None and plain.claim.members == ()


def test_await_latest_returns_on_a_claim_or_after_the_timeout(store: SlotStore) -> None:
    assert store.claim("t", 0, SlotClaim("a", "a.json"))
    assert store.await_latest("t", -1, 5.0) == 0  # already past: no wait
    started = time.monotonic()
    assert store.await_latest("t", 0, 0.2) == 0  # nothing happens: the timeout
    assert 0.15 <= time.monotonic() - started < 2.0

    def claim_later() -> None:
        time.sleep(0.2)
        assert store.claim("t", 1, SlotClaim("b", "b.json"))

    claimer = threading.Thread(target=claim_later)
    started = time.monotonic()
    claimer.start()
    try:
        assert store.await_latest("t", 0, 10.0) == 1
        assert time.monotonic() - started < 5.0  # woken by the claim, not the timeout
    finally:
        claimer.join(timeout=10)


class _RefusingStore(InMemorySlotStore):
    """Every claim is taken while ``refuse`` is set (as under endless contention)."""

    refuse = True

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        return False if self.refuse else super().claim(table, version, claim)


def test_giving_up_while_queued_withdraws_the_queued_file(local_uri: str) -> None:
    """Out of budget without knowing the outcome: CommitStateUnknownError, and the queued
    file is withdrawn so that no later leader can carry the append."""
    store = _RefusingStore()
    store.refuse = False
    Table.create(local_uri, SCHEMA, slots=store)
    store.refuse = True
    policy = RetryPolicy(max_attempts=5, max_duration=5.0)
    table = Table.open(local_uri, slots=store, retry_policy=policy, group_commit=True)
    txn = table.transaction()
    txn.append(rows([1]))
    with pytest.raises(CommitStateUnknownError, match="withdrawn from the queue") as info:
        txn.commit()
    assert info.value.txn_id == txn.txn_id
    assert [n for n in LogStore(local_uri).list_staged() if QueuedName.parse(n)] == []
    assert Table.open(local_uri, slots=store).version == 0
    store.refuse = False
    later = Table.open(local_uri, slots=store, group_commit=True).append(rows([2]))
    assert later.version == 1
    reopened = Table.open(local_uri, slots=store)
    assert member_txn_ids(reopened.history(1)[0]) == [later.txn_id]
    assert sorted_ids(reopened) == [2]
