"""Tables whose version slots live in a real ZooKeeper: faults and stress.

Every fault test ends with the invariant check of :mod:`tests.support.invariants`:
gapless versions, every acknowledged commit present exactly once, contents equal to a
replay of the history.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

from eventlog import CommitStateUnknownError, RetryPolicy, SlotStoreError, Table
from eventlog.log.storage import LogStore
from lockstore.zookeeper import ZooKeeperSlotStore
from tests.support.invariants import SCHEMA, check_invariants, run_writers

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(300)]


def _batch(ids: list[int], worker: int = 99) -> pa.Table:
    n = len(ids)
    return pa.table({"id": ids, "worker": [worker] * n, "batch": [0] * n}, schema=SCHEMA)


def _spec(hosts: str, chroot: str | None = None) -> str:
    chroot = chroot or f"/t-{uuid.uuid4().hex[:12]}"
    return f"zk://{hosts}{chroot}?timeout=10"


def test_round_trip_through_zookeeper(tmp_path: Path, zk_hosts: str) -> None:
    spec = _spec(zk_hosts)
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, slots=spec)
    t.append(_batch([1, 2]))
    other = Table.open(uri, slots=spec)
    assert other.version == 1 and sorted(other.to_arrow().column("id").to_pylist()) == [1, 2]
    assert isinstance(other.slots, ZooKeeperSlotStore)
    assert other.slots.latest(other.key) == 1
    assert other.slots.get(other.key, 1).complete  # type: ignore[union-attr]


def _claim_then_die(uri: str, spec: str) -> None:
    def die(*args: Any, **kwargs: Any) -> bool:
        os.kill(os.getpid(), signal.SIGKILL)
        return False  # pragma: no cover - never reached

    Table.publish_claimed = die  # type: ignore[method-assign]
    Table.open(uri, slots=spec).append(_batch([424242]))


def test_writer_killed_between_claim_and_publish_does_not_block(tmp_path: Path, zk_hosts: str) -> None:
    spec = _spec(zk_hosts)
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, slots=spec)
    ctx = mp.get_context("spawn")
    victim = ctx.Process(target=_claim_then_die, args=(uri, spec))
    victim.start()
    victim.join(timeout=60)
    assert victim.exitcode == -signal.SIGKILL
    store = t.slots
    assert store.latest(t.key) == 1 and not store.get(t.key, 1).complete  # type: ignore[union-attr]
    assert not LogStore(uri).commit_exists(1)  # claimed, never published
    results = run_writers(uri, workers=3, ops=15, slots=spec)
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 45
    table = check_invariants(uri, acks, slots=spec, unacknowledged=1)
    # The killed writer's claim was its commit point: others published it from its staged file.
    assert 424242 in table.to_arrow().column("id").to_pylist()
    assert store.get(t.key, 1).complete  # type: ignore[union-attr]


def test_session_expires_in_the_middle_of_a_commit(
    tmp_path: Path, zk_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    store = ZooKeeperSlotStore(zk_hosts, chroot=chroot, timeout=10)
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, slots=store)
    original = Table.publish_claimed
    expired: list[int] = []

    def expire_then_publish(self: Table, *args: Any, **kwargs: Any) -> bool:
        if not expired:
            sid, password = store._client.client_id
            other = KazooClient(hosts=zk_hosts, client_id=(sid, password))
            other.start(timeout=5)
            other.stop()  # closes the session on the server: the writer's session expires
            other.close()
            expired.append(sid)
            deadline = time.monotonic() + 10
            while store.session_id in (None, sid) and time.monotonic() < deadline:
                time.sleep(0.02)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Table, "publish_claimed", expire_then_publish)
    first = t.append(_batch([1]))
    assert expired and store.session_id != expired[0]
    assert first.version == 1 and store.get(t.key, 1).complete  # type: ignore[union-attr]
    second = t.append(_batch([2]))
    assert second.version == 2
    check_invariants(
        uri,
        [
            {"kind": "append", "version": 1, "txn": first.txn_id, "ids": [1]},
            {"kind": "append", "version": 2, "txn": second.txn_id, "ids": [2]},
        ],
        slots=store,  # type: ignore[arg-type]
    )
    store.close()


@pytest.mark.parametrize("group_commit", [False, True], ids=["own-slots", "group-commit"])
def test_killing_the_leader_while_four_processes_commit(
    tmp_path: Path, zk_ensemble: Any, group_commit: bool
) -> None:
    spec = _spec(zk_ensemble.hosts)
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, slots=spec)
    killed: list[int] = []

    def kill_leader() -> None:
        time.sleep(1.5)
        leader = zk_ensemble.leader()
        zk_ensemble.kill(leader)
        killed.append(leader)

    try:
        results = run_writers(
            uri, workers=4, ops=30, slots=spec, during=kill_leader, group_commit=group_commit
        )
    finally:
        for node in killed:
            zk_ensemble.restart(node)
    acks = [a for r in results for a in r.acks]
    assert killed and len(acks) == 120
    assert not any(r.errors for r in results)
    check_invariants(uri, acks, slots=spec)


def test_losing_quorum_fails_commits_in_bounded_time_then_recovers(tmp_path: Path, zk_ensemble: Any) -> None:
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    store = ZooKeeperSlotStore(zk_ensemble.hosts, chroot=chroot, timeout=2.0)
    uri = str(tmp_path / "t")
    policy = RetryPolicy(max_duration=4.0)
    t = Table.create(uri, SCHEMA, slots=store, retry_policy=policy)
    first = t.append(_batch([1]))
    leader = zk_ensemble.leader()
    down = [leader, (leader + 1) % 3]
    for node in down:
        zk_ensemble.kill(node)
    started = time.monotonic()
    try:
        with pytest.raises((SlotStoreError, CommitStateUnknownError)) as info:
            t.append(_batch([2]))
        elapsed = time.monotonic() - started
        assert elapsed < policy.max_duration + 3 * store.timeout + 5
        assert "unreachable" in str(info.value)
        # Nothing half-written: the log still ends at version 1.
        assert LogStore.commit_versions(LogStore(uri).list_log()) == [0, 1]
    finally:
        for node in down:
            zk_ensemble.restart(node)
    deadline = time.monotonic() + 60
    while True:
        try:
            third = t.append(_batch([3]))
            break
        except (SlotStoreError, CommitStateUnknownError):
            assert time.monotonic() < deadline, "commits did not resume after quorum came back"
            time.sleep(0.5)
    acks = [
        {"kind": "append", "version": first.version, "txn": first.txn_id, "ids": [1]},
        {"kind": "append", "version": third.version, "txn": third.txn_id, "ids": [3]},
    ]
    landed = third.version - 1 - first.version  # a commit whose outcome was unknown may have landed
    check_invariants(uri, acks, slots=store, unacknowledged=landed)  # type: ignore[arg-type]
    store.close()


@pytest.mark.slow
def test_stress_four_processes_by_250_commits(tmp_path: Path, zk_hosts: str) -> None:
    spec = _spec(zk_hosts)
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, slots=spec)
    results = run_writers(uri, workers=4, ops=250, slots=spec, timeout=600)
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 1000 and not any(r.errors for r in results)
    assert sum(a["kind"] == "delete" for a in acks) > 100
    check_invariants(uri, acks, slots=spec)
