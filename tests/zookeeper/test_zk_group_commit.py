"""Group commit with version slots in a real ZooKeeper.

Processes through one ZooKeeper (the invariants of :mod:`tests.support.invariants`, group
aware), a deterministic three-member group across separate ZooKeeper sessions, and the
store pieces group commit relies on: members in claims, the ``await_latest`` watch, and
batched completion marks.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from eventlog import CommitResult, Table
from eventlog.log.commit import GROUP_FIELD, member_txn_ids
from eventlog.log.storage import LogStore
from eventlog.txn import groupcommit
from eventlog.txn.groupcommit import QueuedName
from lockstore import SlotClaim
from lockstore.zookeeper import ZooKeeperSlotStore
from tests.conftest import SCHEMA as ROWS_SCHEMA
from tests.conftest import rows, sorted_ids
from tests.support.invariants import (
    SCHEMA,
    check_invariants,
    commit_concurrently,
    hold_until_queued,
    run_writers,
)

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(300)]


def _spec(hosts: str) -> str:
    return f"zk://{hosts}/t-{uuid.uuid4().hex[:12]}?timeout=10"


def test_four_processes_group_commit_through_zookeeper(tmp_path: Path, zk_hosts: str) -> None:
    spec = _spec(zk_hosts)
    uri = str(tmp_path / "t")
    created = Table.create(uri, SCHEMA, slots=spec)
    store, key = created.slots, created.key
    assert isinstance(store, ZooKeeperSlotStore)
    try:
        results = run_writers(uri, workers=4, ops=40, slots=spec, group_commit=True)
        acks = [a for r in results for a in r.acks]
        assert len(acks) == 160 and not any(r.errors for r in results)
        assert sum(a["kind"] == "delete" for a in acks) > 0
        table = check_invariants(uri, acks, slots=spec)
        # Grouping depends on timing; never more versions than acknowledged commits.
        assert table.version <= len(acks)
        assert table.version == len({a["version"] for a in acks})
        assert not [n for n in LogStore(uri).list_staged() if QueuedName.parse(n) is not None]

        # Every slot is marked complete once this handle sent its own pending marks (the
        # writers flushed theirs when they closed their stores at exit).
        store.flush_marks(timeout=5)
        latest = store.latest(key)
        assert latest == table.version
        history = {h["version"]: h for h in table.history()}
        for version in range(latest + 1):
            record = store.get(key, version)
            assert record is not None and record.complete, f"slot {version} is not complete: {record}"
            if GROUP_FIELD in history[version]:  # a group's claim lists its members
                assert sorted(record.claim.members) == sorted(member_txn_ids(history[version]))
            else:
                assert record.claim.members == ()
        # A member's transaction id is found through the claims (what an unknown outcome uses).
        for ack in sorted(acks, key=lambda a: a["version"])[-5:]:
            assert store.find_txn(key, ack["txn"], ack["version"]) == ack["version"]
    finally:
        store.close()  # the process-wide store of this spec: not left open at exit


def test_three_sessions_share_one_version(
    tmp_path: Path, zk_chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three writers, each with its own ZooKeeper session (as three processes would have),
    queue together: one version carries all three; the members learn it from the watch."""
    uri = str(tmp_path / "t")
    stores = [ZooKeeperSlotStore(zk_chroot, timeout=10) for _ in range(4)]
    try:
        Table.create(uri, ROWS_SCHEMA, slots=stores[0])
        txns = []
        for i, store in enumerate(stores[1:]):
            txn = Table.open(uri, slots=store, group_commit=True).transaction()
            txn.append(rows([i * 10, i * 10 + 1]))
            txns.append(txn)
        hold_until_queued(monkeypatch, 3)
        outcomes = commit_concurrently(txns)
        assert all(isinstance(o, CommitResult) for o in outcomes), outcomes
        assert [o.version for o in outcomes if isinstance(o, CommitResult)] == [1, 1, 1]
        table = Table.open(uri, slots=stores[0])
        assert table.version == 1
        assert sorted(member_txn_ids(table.history(1)[0])) == sorted(t.txn_id for t in txns)
        assert sorted_ids(table) == [0, 1, 10, 11, 20, 21]
        assert LogStore(uri).list_staged() == []
        # Exactly one claim (the leader's) carries all three, seen from another session.
        record = stores[0].get(table.key, 1)
        assert record is not None and sorted(record.claim.members) == sorted(t.txn_id for t in txns)
        assert [stores[0].find_txn(table.key, t.txn_id) for t in txns] == [1, 1, 1]
        assert stores[0].latest(table.key) == 1
    finally:
        for store in stores:
            store.close()


def _queued(uri: str) -> list[QueuedName]:
    return [q for q in (QueuedName.parse(n) for n in LogStore(uri).list_staged()) if q is not None]


def _lead_then_die(uri: str, spec: str, members: int) -> None:
    """Queue an append, lead a group of ``members`` others, claim, die before publishing."""
    original = groupcommit.GroupCommitLoop._gather

    def gather_once_all_queued(self: groupcommit.GroupCommitLoop, version: int) -> Any:
        deadline = time.monotonic() + 30
        while len(_queued(uri)) < members + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        return original(self, version)

    def die(*args: Any, **kwargs: Any) -> bool:
        os.kill(os.getpid(), signal.SIGKILL)
        return False  # pragma: no cover - never reached

    groupcommit.GroupCommitLoop._gather = gather_once_all_queued  # type: ignore[method-assign]
    Table.publish_claimed = die  # type: ignore[method-assign]
    Table.open(uri, slots=spec, group_commit=True).append(rows([424242]))


def test_leader_killed_between_group_claim_and_publish(
    tmp_path: Path, zk_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's claim is the commit point of every member: when it dies before
    publishing, the waiting members publish the group's commit from its staged file and
    are acknowledged; nothing lands twice, and later groups do not carry it again."""
    spec = _spec(zk_hosts)
    uri = str(tmp_path / "t")
    Table.create(uri, ROWS_SCHEMA, slots=spec)
    # Members wait for the leader however long it takes (no leading after a timeout).
    monkeypatch.setattr(groupcommit, "LEAD_AFTER_SECONDS", 30.0)
    victim = mp.get_context("spawn").Process(target=_lead_then_die, args=(uri, spec, 2))
    victim.start()
    try:
        deadline = time.monotonic() + 60
        while not _queued(uri) and time.monotonic() < deadline:
            time.sleep(0.01)
        (leader,) = _queued(uri)
        txns = []
        for i in (1, 2):
            txn = Table.open(uri, slots=spec, group_commit=True).transaction()
            txn.append(rows([i]))
            txns.append(txn)
        outcomes = commit_concurrently(txns, timeout=60)
        victim.join(timeout=60)
    finally:
        if victim.is_alive():
            victim.kill()
    assert victim.exitcode == -signal.SIGKILL
    assert [o.version if isinstance(o, CommitResult) else o for o in outcomes] == [1, 1]
    table = Table.open(uri, slots=spec)
    assert LogStore.commit_versions(LogStore(uri).list_log()) == [0, 1]
    assert sorted(member_txn_ids(table.history(1)[0])) == sorted([leader.txn_id, *(t.txn_id for t in txns)])
    assert sorted_ids(table) == [1, 2, 424242]
    # The dead leader's own queued file is still there; a later group must not carry it again.
    assert [q.txn_id for q in _queued(uri)] == [leader.txn_id]
    started = time.monotonic()
    later = Table.open(uri, slots=spec, group_commit=True).append(rows([3]))
    assert later.version == 2
    # It did not wait for the dead leader's file (members would wait up to 30 s here), and
    # it removed that file: what it carried is published.
    assert time.monotonic() - started < 10
    assert _queued(uri) == []
    carried = [t for h in Table.open(uri, slots=spec).history() for t in member_txn_ids(h)]
    assert carried.count(leader.txn_id) == 1
    assert sorted_ids(Table.open(uri, slots=spec)) == [1, 2, 3, 424242]


def test_await_latest_is_woken_by_another_sessions_claim(zk_chroot: str) -> None:
    waiter = ZooKeeperSlotStore(zk_chroot, timeout=10)
    claimer = ZooKeeperSlotStore(zk_chroot, timeout=10)
    table = "s3://bucket/group-commit"
    try:
        assert claimer.claim(table, 0, SlotClaim("a", "a.json"))
        assert waiter.await_latest(table, -1, 5.0) == 0  # already past
        started = time.monotonic()
        assert waiter.await_latest(table, 0, 0.3) == 0  # nothing happens: the timeout
        assert 0.25 <= time.monotonic() - started < 3.0

        def claim_later() -> None:
            time.sleep(0.3)
            assert claimer.claim(table, 1, SlotClaim("b", "b.json"))

        thread = threading.Thread(target=claim_later)
        started = time.monotonic()
        thread.start()
        try:
            assert waiter.await_latest(table, 0, 8.0) == 1
            assert time.monotonic() - started < 5.0  # the watch fired, not the timeout
        finally:
            thread.join(timeout=10)
    finally:
        waiter.close()
        claimer.close()


def test_group_claims_and_batched_completion_marks(zk_chroot: str) -> None:
    writer = ZooKeeperSlotStore(zk_chroot, timeout=10)
    other = ZooKeeperSlotStore(zk_chroot, timeout=10)
    table = "s3://bucket/group-claims"
    try:
        group = SlotClaim("group-1", "group-group-1.json", {"host": "h"}, ("m1", "m2"))
        assert writer.claim(table, 0, group)
        assert not other.claim(table, 0, SlotClaim("m1", "m1.json"))
        record = other.get(table, 0)
        assert record is not None and record.claim.members == ("m1", "m2")
        assert [other.find_txn(table, t) for t in ("m1", "m2", "group-1", "m3")] == [0, 0, 0, None]

        writer.mark_complete(table, 0)  # own claim: batched, reported complete at once here
        mine = writer.get(table, 0)
        assert mine is not None and mine.complete
        writer.flush_marks(timeout=5)
        theirs = other.get(table, 0)
        assert theirs is not None and theirs.complete
        assert theirs.claim.members == ("m1", "m2")  # the mark keeps the claim intact

        # Marks of several own claims go out together.
        for version in (1, 2, 3):
            assert writer.claim(table, version, SlotClaim(f"t{version}", f"t{version}.json"))
            writer.mark_complete(table, version)
        writer.flush_marks(timeout=5)
        for version in (1, 2, 3):
            record = other.get(table, version)
            assert record is not None and record.complete
    finally:
        writer.close()
        other.close()
