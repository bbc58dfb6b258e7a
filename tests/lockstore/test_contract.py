"""Contract tests for every :class:`lockstore.SlotStore` adapter.

One test per guarantee in :mod:`lockstore.base`, run against each adapter through the
parametrised ``make_store`` fixture (leases included), then leases across processes (a
child holding a lease, SIGKILLed, or exiting; local-file, ZooKeeper and S3 object-store
adapters), followed
by tests specific to one adapter: in-memory sharing and fork, local-file lease files and
fork, real multi-process slot races (``spawn`` start method), torn-read checks, the
``_latest`` hint and OS-error translation.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import json
import multiprocessing
import os
import pickle
import queue
import shutil
import signal
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue as MPQueue
from multiprocessing.synchronize import Barrier as MPBarrier
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from lockstore import (
    InMemorySlotStore,
    Lease,
    LeaseHeldError,
    LeaseOwner,
    LocalFileSlotStore,
    LockstoreError,
    ObjectStoreSlotStore,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    SlotStoreUnavailableError,
    TableBindingError,
    lease_owner_here,
)
from lockstore.base import lease_node_name
from lockstore.localfs import table_dir_name
from lockstore.registry import open_slot_store

TABLE = "file:///data/warehouse/events"
OWNER = {"host": "test-host", "pid": "4242"}

MakeStore = Callable[[], SlotStore]


def _claim(txn_id: str, staged: str | None = None) -> SlotClaim:
    return SlotClaim(txn_id, staged or f"_staged/{txn_id}.json", dict(OWNER))


@pytest.fixture(
    params=[
        "memory",
        "localfs",
        pytest.param("zookeeper", marks=pytest.mark.zookeeper),
        "objectstore-memory",
        "objectstore-s3",
    ]
)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    """A factory of handles onto one fresh backing store.

    Every call returns a handle onto the *same* slots: the same object for the in-memory
    adapter (which lives in one process), a new object on the same root for the file and
    object-store adapters, so reopening is part of what the contract tests check. The
    object-store adapter runs on fsspec's in-memory file system (a fresh root per test) and
    on the suite's S3 server (moto; a fresh bucket per test, one s3fs client per test).
    """
    handles: list[SlotStore] = []
    cleanup: Callable[[], object] | None = None
    if request.param == "objectstore-memory":
        memory_fs = MemoryFileSystem()
        memory_root = f"/objectstore-contract/{uuid.uuid4().hex}"

        def factory() -> SlotStore:
            store = ObjectStoreSlotStore(memory_fs, memory_root)
            handles.append(store)
            return store

        def cleanup() -> None:
            if memory_fs.exists(memory_root):
                memory_fs.rm(memory_root, recursive=True)
    elif request.param == "objectstore-s3":
        import s3fs  # type: ignore[import-untyped]

        bucket = request.getfixturevalue("s3_bucket")
        s3 = s3fs.S3FileSystem(skip_instance_cache=True, **request.getfixturevalue("s3_storage_options"))

        def factory() -> SlotStore:
            store = ObjectStoreSlotStore(s3, f"{bucket}/slots")
            handles.append(store)
            return store
    elif request.param == "memory":
        memory = InMemorySlotStore()

        def factory() -> SlotStore:
            return memory
    elif request.param == "zookeeper":
        from lockstore.zookeeper import ZooKeeperSlotStore

        hosts = request.getfixturevalue("zk_chroot")

        def factory() -> SlotStore:
            store = ZooKeeperSlotStore(hosts, chroot="/slots", timeout=10.0)
            handles.append(store)
            return store
    else:
        root = tmp_path / "slots"

        def factory() -> SlotStore:
            store = LocalFileSlotStore(root)
            handles.append(store)
            return store

    yield factory
    for handle in handles:
        handle.close()
    if cleanup is not None:
        cleanup()


@pytest.fixture
def store(make_store: MakeStore) -> SlotStore:
    return make_store()


# ------------------------------------------------------------------- exclusive grant


def test_exclusive_grant_second_claim_is_refused_and_changes_nothing(make_store: MakeStore) -> None:
    store, other = make_store(), make_store()
    first = _claim("txn-a")
    assert store.claim(TABLE, 0, first) is True
    assert store.claim(TABLE, 0, _claim("txn-b")) is False
    assert other.claim(TABLE, 0, _claim("txn-c", "_staged/other.json")) is False
    assert store.claim(TABLE, 0, first) is False  # not even the winner gets it twice

    record = other.get(TABLE, 0)
    assert record is not None
    assert record.claim == first
    assert store.latest(TABLE) == 0


def test_exclusive_grant_under_thread_contention(make_store: MakeStore) -> None:
    """Eight threads claim the same version at the same instant: exactly one wins, 20 times."""
    store = make_store()
    threads, rounds = 8, 20
    barrier = threading.Barrier(threads)
    wins: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            for version in range(rounds):
                barrier.wait(timeout=30)
                if store.claim(TABLE, version, _claim(f"t{index}-v{version}")):
                    wins[index].append(version)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert errors == []
    granted = sorted(v for won in wins for v in won)
    assert granted == list(range(rounds))  # each round: exactly one winner
    for index, won in enumerate(wins):
        for version in won:
            record = store.get(TABLE, version)
            assert record is not None
            assert record.claim.txn_id == f"t{index}-v{version}"


# -------------------------------------------------------------------- durable record


def test_durable_record_returns_the_same_claim(make_store: MakeStore) -> None:
    store = make_store()
    owner = {"host": "writer-1", "pid": "77", "app_id": "ingest"}
    claim = SlotClaim("txn-7f3a", "_staged/00000000000000000000.7f3a.json", owner)
    before = time.time()
    assert store.claim(TABLE, 0, claim) is True
    after = time.time()

    owner["host"] = "mutated-after-claim"  # the store must have copied the owner
    for handle in (store, make_store()):
        record = handle.get(TABLE, 0)
        assert record is not None
        assert record.version == 0
        assert record.claim.txn_id == "txn-7f3a"
        assert record.claim.staged == "_staged/00000000000000000000.7f3a.json"
        assert dict(record.claim.owner) == {"host": "writer-1", "pid": "77", "app_id": "ingest"}
        assert record.complete is False
        assert before - 0.01 <= record.claimed_at <= after + 0.01
        assert 0.0 <= record.age < 60.0

    returned = store.get(TABLE, 0)
    assert returned is not None
    assert isinstance(returned.claim.owner, dict)
    returned.claim.owner["host"] = "mutated-by-reader"  # a reader cannot alter the record either
    again = store.get(TABLE, 0)
    assert again is not None
    assert again.claim.owner["host"] == "writer-1"


def test_get_of_unclaimed_versions_is_none(store: SlotStore) -> None:
    assert store.get(TABLE, 0) is None
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    assert store.get(TABLE, 1) is None
    assert store.get(TABLE, -1) is None
    assert store.get("file:///some/other/table", 0) is None


# ------------------------------------------------------------------- monotone latest


def test_latest_is_minus_one_then_follows_claims(make_store: MakeStore) -> None:
    store = make_store()
    assert store.latest(TABLE) == -1
    for expected in range(25):
        version = store.latest(TABLE) + 1
        assert version == expected
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
        assert store.latest(TABLE) == expected
    assert make_store().latest(TABLE) == 24
    records = [store.get(TABLE, v) for v in range(25)]
    assert [r.version if r else None for r in records] == list(range(25))


def test_claims_may_skip_versions_but_latest_never_goes_down(store: SlotStore) -> None:
    """The store does not enforce N-1 (the engine does); a lower claim must not lower latest."""
    assert store.claim(TABLE, 5, _claim("txn-5")) is True
    assert store.latest(TABLE) == 5
    assert [store.get(TABLE, v) for v in range(5)] == [None] * 5
    assert store.claim(TABLE, 2, _claim("txn-2")) is True
    assert store.latest(TABLE) == 5
    assert store.claim(TABLE, 6, _claim("txn-6")) is True
    assert store.latest(TABLE) == 6


def test_negative_versions_are_rejected(store: SlotStore) -> None:
    with pytest.raises(ValueError, match="version must be >= 0"):
        store.claim(TABLE, -1, _claim("txn-neg"))
    with pytest.raises(SlotNotClaimedError):
        store.mark_complete(TABLE, -1)
    assert store.latest(TABLE) == -1


# -------------------------------------------------------------- idempotent completion


def test_mark_complete_is_idempotent_from_any_handle(make_store: MakeStore) -> None:
    store, other = make_store(), make_store()
    claim = _claim("txn-done")
    assert store.claim(TABLE, 0, claim) is True
    store.mark_complete(TABLE, 0)
    store.mark_complete(TABLE, 0)
    other.mark_complete(TABLE, 0)

    record = other.get(TABLE, 0)
    assert record is not None
    assert record.complete is True
    assert record.claim == claim  # completion does not touch the claim
    assert store.latest(TABLE) == 0


def test_mark_complete_of_an_unclaimed_version_fails(store: SlotStore) -> None:
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    with pytest.raises(SlotNotClaimedError) as info:
        store.mark_complete(TABLE, 1)
    assert (info.value.table, info.value.version) == (TABLE, 1)
    assert store.get(TABLE, 1) is None  # the failed call created nothing
    assert store.latest(TABLE) == 0
    # the error crosses process boundaries intact (multiprocessing pickles it)
    clone = pickle.loads(pickle.dumps(info.value))
    assert (type(clone), clone.table, clone.version) == (SlotNotClaimedError, TABLE, 1)


# ------------------------------------------------------------------------- find_txn


def test_find_txn_locates_the_version_of_a_transaction(store: SlotStore) -> None:
    assert store.find_txn(TABLE, "txn-1") is None  # empty table
    for version in range(5):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    assert store.find_txn(TABLE, "txn-3") == 3
    assert store.find_txn(TABLE, "txn-0") == 0
    assert store.find_txn(TABLE, "txn-4", start=2) == 4
    assert store.find_txn(TABLE, "txn-1", start=2) is None  # before the search window
    assert store.find_txn(TABLE, "txn-unknown") is None
    assert store.find_txn("file:///other", "txn-3") is None


# ----------------------------------------------------------------------------- bind


def test_bind_persists_and_refuses_another_table_id(make_store: MakeStore) -> None:
    store = make_store()
    store.bind(TABLE, "id-1")
    store.bind(TABLE, "id-1")  # same id: accepted again
    make_store().bind(TABLE, "id-1")

    with pytest.raises(TableBindingError) as info:
        make_store().bind(TABLE, "id-2")
    assert (info.value.table, info.value.bound_id, info.value.requested_id) == (TABLE, "id-1", "id-2")
    clone = pickle.loads(pickle.dumps(info.value))
    assert (clone.table, clone.bound_id, clone.requested_id) == (TABLE, "id-1", "id-2")

    store.bind("file:///data/warehouse/other", "id-2")  # bindings are per table
    with pytest.raises(TableBindingError):
        store.bind("file:///data/warehouse/other", "id-1")
    # binding does not interfere with slots
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    assert store.latest(TABLE) == 0


# ------------------------------------------------------------- independent tables


def test_tables_do_not_share_versions(make_store: MakeStore) -> None:
    store = make_store()
    # The first two keys sanitise to the same directory text; only the hash keeps them apart.
    tables = ["s3://bucket/t", "s3:/bucket/t", "s3://bucket/t2"]
    for index, table in enumerate(tables):
        assert store.claim(table, 0, _claim(f"txn-{index}")) is True
    for _ in range(3):
        assert store.claim(tables[0], store.latest(tables[0]) + 1, _claim("txn-more")) is True

    reopened = make_store()
    assert [reopened.latest(t) for t in tables] == [3, 0, 0]
    for index, table in enumerate(tables):
        record = reopened.get(table, 0)
        assert record is not None
        assert record.claim.txn_id == f"txn-{index}"
    assert reopened.get(tables[1], 1) is None
    assert reopened.find_txn(tables[1], "txn-0") is None


# ------------------------------------------------------------------ thread race


def test_thread_race_grants_every_version_exactly_once(make_store: MakeStore) -> None:
    store = make_store()
    threads, target = 8, 200
    barrier = threading.Barrier(threads)
    wins: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            while (version := store.latest(TABLE) + 1) < target:
                if store.claim(TABLE, version, _claim(f"t{index}-v{version}")):
                    wins[index].append(version)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert errors == []
    granted = [v for won in wins for v in won]
    assert len(granted) == target  # nobody was granted a version twice
    assert sorted(granted) == list(range(target))  # gapless
    assert store.latest(TABLE) == target - 1
    for index, won in enumerate(wins):
        for version in won:
            record = store.get(TABLE, version)
            assert record is not None
            assert record.claim.txn_id == f"t{index}-v{version}"


def test_close_is_idempotent_and_keeps_slots(make_store: MakeStore) -> None:
    with make_store() as store:
        assert store.claim(TABLE, 0, _claim("txn-0")) is True
    store.close()
    store.close()
    record = make_store().get(TABLE, 0)
    assert record is not None
    assert record.claim.txn_id == "txn-0"


def test_close_is_safe_from_many_threads_at_once(make_store: MakeStore) -> None:
    store = make_store()
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    assert not store.closed
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def close() -> None:
        barrier.wait()
        try:
            store.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    closers = [threading.Thread(target=close) for _ in range(8)]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(30)
    assert errors == [] and not any(c.is_alive() for c in closers)
    # A store holding a connection reports it closed; the others hold none and stay usable.
    assert store.closed is (type(store).__name__ == "ZooKeeperSlotStore")
    record = make_store().get(TABLE, 0)
    assert record is not None and record.claim.txn_id == "txn-0"


# ----------------------------------------------------------------------------- leases

CHECKPOINT = "s3://bucket/checkpoints/query-1"


def _query_owner(query: str = "q-1", run: str = "r-1") -> LeaseOwner:
    return lease_owner_here(queryId=query, runId=run)


def test_lease_acquire_release_reacquire(make_store: MakeStore) -> None:
    store, other = make_store(), make_store()
    assert store.lease_owner(CHECKPOINT) is None
    before = int(time.time() * 1000)
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    assert isinstance(lease, Lease)
    assert lease.name == CHECKPOINT and lease.held
    assert (lease.owner.host, lease.owner.pid) == (socket.gethostname(), os.getpid())
    assert dict(lease.owner.info) == {"queryId": "q-1", "runId": "r-1"}
    assert before - 1000 <= lease.owner.acquired_ms <= int(time.time() * 1000) + 1000
    for handle in (store, other):
        assert handle.lease_owner(CHECKPOINT) == lease.owner

    lease.release()
    assert not lease.held
    assert store.lease_owner(CHECKPOINT) is None and other.lease_owner(CHECKPOINT) is None
    again = other.acquire_lease(CHECKPOINT, _query_owner("q-1", "r-2"))
    assert again.held and store.lease_owner(CHECKPOINT) == again.owner
    again.release()


def test_lease_owner_without_time_is_stamped_and_given_time_is_kept(store: SlotStore) -> None:
    with store.acquire_lease("a", LeaseOwner("h", 7, {"queryId": "q"})) as lease:
        assert lease.owner.acquired_ms > 0
        assert (lease.owner.host, lease.owner.pid, dict(lease.owner.info)) == ("h", 7, {"queryId": "q"})
    with store.acquire_lease("a", LeaseOwner("h", 7, {}, acquired_ms=1234)) as lease:
        assert lease.owner.acquired_ms == 1234
        assert store.lease_owner("a") == LeaseOwner("h", 7, {}, 1234)


def test_second_acquire_raises_lease_held_naming_the_owner(make_store: MakeStore) -> None:
    store, other = make_store(), make_store()
    lease = store.acquire_lease(CHECKPOINT, _query_owner("q-1", "r-1"))
    for handle in (store, other):  # the same store, and another handle on the same backing store
        with pytest.raises(LeaseHeldError) as info:
            handle.acquire_lease(CHECKPOINT, _query_owner("q-2", "r-9"))
        error = info.value
        assert isinstance(error, LockstoreError)
        assert error.name == CHECKPOINT
        assert error.owner == lease.owner
        message = str(error)
        for part in ("queryId=q-1", "runId=r-1", f"host={socket.gethostname()}", f"pid={os.getpid()}"):
            assert part in message
        assert CHECKPOINT in message
        # The error crosses process boundaries intact (Spark and multiprocessing pickle it).
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is LeaseHeldError
        assert (clone.name, clone.owner, str(clone)) == (CHECKPOINT, lease.owner, message)
    assert store.lease_owner(CHECKPOINT) == lease.owner  # the failed attempts changed nothing
    assert lease.held
    lease.release()


def test_lease_release_is_idempotent_and_context_manager_releases(make_store: MakeStore) -> None:
    store = make_store()
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    lease.release()
    lease.release()
    assert not lease.held
    with store.acquire_lease(CHECKPOINT, _query_owner("q-2")) as held:
        assert held.held
        lease.release()  # a stale handle's release does not touch the new owner's lease
        assert held.held and store.lease_owner(CHECKPOINT) == held.owner
    assert not held.held
    assert make_store().lease_owner(CHECKPOINT) is None
    with pytest.raises(RuntimeError), store.acquire_lease(CHECKPOINT, _query_owner("q-3")):
        raise RuntimeError("the query failed")
    assert store.lease_owner(CHECKPOINT) is None  # released on the way out of a failure too


def test_leases_are_independent_and_names_are_arbitrary(store: SlotStore) -> None:
    names = [
        "s3://bucket/ck",
        "s3:/bucket/ck",  # sanitises like the first: only the hash keeps them apart
        "file:///tmp/ck with spaces/ü/🙂",
        "/",
        "..",
        "",
        "x" * 2000,
    ]
    leases = [store.acquire_lease(name, _query_owner(str(i))) for i, name in enumerate(names)]
    for index, name in enumerate(names):
        owner = store.lease_owner(name)
        assert owner is not None and owner.info["queryId"] == str(index)
    assert len({lease_node_name(n) for n in names}) == len(names)
    assert all(len(lease_node_name(n)) < 100 for n in names)
    for lease in leases:
        lease.release()
    assert [store.lease_owner(n) for n in names] == [None] * len(names)


def test_lease_race_between_threads_has_one_winner(make_store: MakeStore) -> None:
    stores = [make_store() for _ in range(2)]
    threads, rounds = 8, 10
    barrier = threading.Barrier(threads)
    results: list[list[Lease | LeaseOwner]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            for round_ in range(rounds):
                barrier.wait(timeout=30)
                try:
                    lease = stores[index % 2].acquire_lease(f"race-{round_}", _query_owner(f"t{index}"))
                    results[round_].append(lease)
                except LeaseHeldError as exc:
                    results[round_].append(exc.owner)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert errors == []
    for outcome in results:
        won = [r for r in outcome if isinstance(r, Lease)]
        assert len(won) == 1 and len(outcome) == threads
        # every loser was told who won
        assert all(r == won[0].owner for r in outcome if isinstance(r, LeaseOwner))
        won[0].release()


def test_close_releases_the_stores_leases(make_store: MakeStore) -> None:
    store, observer = make_store(), make_store()
    if store is observer:  # the in-memory adapter: one object per backing store; use another
        store = InMemorySlotStore()
        observer = store
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    kept = observer.acquire_lease("another", _query_owner()) if observer is not store else None
    store.close()
    assert not lease.held
    lease.release()  # harmless after close
    if not store.closed:  # stores without a connection stay usable, and the lease is free
        assert store.lease_owner(CHECKPOINT) is None
        store.acquire_lease(CHECKPOINT, _query_owner("q-2")).release()
    assert observer.closed or observer.lease_owner(CHECKPOINT) is None
    fresh = make_store()
    assert fresh.lease_owner(CHECKPOINT) is None
    fresh.acquire_lease(CHECKPOINT, _query_owner("q-3")).release()
    if kept is not None:  # leases of other stores are untouched
        assert kept.held and fresh.lease_owner("another") == kept.owner
        kept.release()


def test_a_collected_lease_handle_is_released(make_store: MakeStore) -> None:
    store = make_store()
    store.acquire_lease(CHECKPOINT, _query_owner())  # handle dropped at once
    gc.collect()
    deadline = time.monotonic() + 10  # the ZooKeeper adapter deletes the node asynchronously
    while store.lease_owner(CHECKPOINT) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.lease_owner(CHECKPOINT) is None
    store.acquire_lease(CHECKPOINT, _query_owner("q-2")).release()


def test_lease_owner_describe_and_helpers() -> None:
    owner = LeaseOwner("host-1", 123, {"queryId": "q", "runId": "r"}, 5)
    assert owner.describe() == "queryId=q runId=r host=host-1 pid=123"
    assert LeaseOwner("h", 1).describe() == "host=h pid=1"
    assert LeaseOwner.from_dict(owner.to_dict()) == owner
    assert pickle.loads(pickle.dumps(owner)) == owner
    assert hash(owner) == hash(LeaseOwner("host-1", 123, {}, 5))  # info is not hashed
    info = {"queryId": "q"}
    copied = LeaseOwner("h", 1, info)
    info["queryId"] = "changed"
    assert copied.info == {"queryId": "q"}  # the owner keeps its own copy
    here = lease_owner_here(queryId="q")
    assert (here.host, here.pid, dict(here.info)) == (socket.gethostname(), os.getpid(), {"queryId": "q"})
    assert abs(here.acquired_ms - time.time() * 1000) < 60_000


# --------------------------------------------------- leases across processes (file, ZooKeeper)


_KEPT: list[Any] = []


def _lease_holder(spec: str, name: str, query: str, ready: MPQueue[Any], stop: str, release: bool) -> None:
    """Child process: hold the lease until the file ``stop`` appears (or it is killed)."""
    store = open_slot_store(spec, shared=False)
    lease = store.acquire_lease(name, lease_owner_here(queryId=query, runId=f"run-{os.getpid()}"))
    ready.put((os.getpid(), socket.gethostname()))
    deadline = time.monotonic() + 120
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.02)
    if release:
        lease.release()
        store.close()
    else:
        # Exit holding it: neither released nor closed nor collected (kept referenced).
        _KEPT.append((store, lease))


# The object store's leases live as long as their heartbeat: a short TTL keeps the SIGKILL
# test to seconds (the holder beats every TTL / 3; S3 timestamps have 1 s resolution).
OBJECTSTORE_LEASE_TTL = 3.0


@pytest.fixture(params=["localfs", pytest.param("zookeeper", marks=pytest.mark.zookeeper), "objectstore-s3"])
def lease_specs(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str, float]:
    """(spec for the child, spec for the parent, how long a dead owner's lease may outlive it)."""
    if request.param == "objectstore-s3":
        bucket = request.getfixturevalue("s3_bucket")
        # The spec carries no endpoint or secret: both processes find them in the environment,
        # as s3fs does by default (the fixtures set fake credentials; the child inherits it).
        monkeypatch.setenv("AWS_ENDPOINT_URL", request.getfixturevalue("s3_server"))
        spec = f"s3://{bucket}/slots?lease_ttl={OBJECTSTORE_LEASE_TTL}"
        return spec, spec, OBJECTSTORE_LEASE_TTL + 1.0
    if request.param == "zookeeper":
        hosts = request.getfixturevalue("zk_chroot")
        # The child's session times out after 2 s (the test server allows down to 1 s).
        return f"zk://{hosts}?timeout=2", f"zk://{hosts}?timeout=10", 30.0
    root = str(tmp_path / "slots")
    return root, root, 0.0


class _Holder:
    """A child process holding the lease; ``stop()`` lets it go on, ``end()`` reaps it."""

    def __init__(self, spec: str, query: str, stop_file: Path, release: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")
        ready: MPQueue[Any] = ctx.Queue()
        self.stop_file = stop_file
        # A file, not an Event: setting an Event another process waits on deadlocks once
        # that process was SIGKILLed.
        self.proc = ctx.Process(
            target=_lease_holder, args=(spec, CHECKPOINT, query, ready, str(stop_file), release)
        )
        self.proc.start()
        self.pid, self.host = _collect(ready, [self.proc], 1, timeout=60)[0]

    def stop(self) -> None:
        self.stop_file.touch()

    def end(self) -> None:
        self.stop()
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=30)


def _acquire_within(store: SlotStore, grace: float, owner: LeaseOwner) -> Lease:
    deadline = time.monotonic() + grace + 5.0
    while True:
        try:
            return store.acquire_lease(CHECKPOINT, owner)
        except LeaseHeldError:
            assert time.monotonic() < deadline, "the dead owner's lease was never taken over"
            time.sleep(0.05)


def test_live_child_holds_the_lease_and_a_sigkilled_one_loses_it(
    lease_specs: tuple[str, str, float], tmp_path: Path
) -> None:
    child_spec, spec, grace = lease_specs
    child = _Holder(child_spec, "child-query", tmp_path / "stop")
    proc, pid, host = child.proc, child.pid, child.host
    store = open_slot_store(spec, shared=False)
    try:
        owner = store.lease_owner(CHECKPOINT)
        assert owner is not None
        assert (owner.pid, owner.host, owner.info["queryId"]) == (pid, host, "child-query")
        with pytest.raises(LeaseHeldError) as info:
            store.acquire_lease(CHECKPOINT, _query_owner("parent-query"))
        assert info.value.owner.pid == pid and info.value.owner.info["runId"] == f"run-{pid}"
        assert f"pid={pid}" in str(info.value) and "queryId=child-query" in str(info.value)

        os.kill(pid, signal.SIGKILL)
        proc.join(timeout=30)
        assert proc.exitcode == -signal.SIGKILL
        started = time.monotonic()
        lease = _acquire_within(store, grace, _query_owner("parent-query"))
        if grace == 0.0:
            assert time.monotonic() - started < 1.0  # the OS dropped the lock with the process
        assert lease.held and store.lease_owner(CHECKPOINT) == lease.owner
        assert lease.owner.pid == os.getpid()
        lease.release()
    finally:
        child.end()
        store.close()


@pytest.mark.parametrize("release", [True, False], ids=["released", "exited"])
def test_child_that_releases_or_exits_frees_the_lease(
    lease_specs: tuple[str, str, float], release: bool, tmp_path: Path
) -> None:
    child_spec, spec, _grace = lease_specs
    child = _Holder(child_spec, "child-query", tmp_path / "stop", release=release)
    store = open_slot_store(spec, shared=False)
    try:
        held = store.lease_owner(CHECKPOINT)
        assert held is not None and held.pid == child.pid
        child.stop()
        child.proc.join(timeout=30)
        assert child.proc.exitcode == 0
        # Released, or the process ended: the lock dies with the process; a clean exit closes
        # the ZooKeeper session (the store's finalizer), so no session timeout is waited for.
        owner = store.lease_owner(CHECKPOINT)
        assert owner is None, owner
        store.acquire_lease(CHECKPOINT, _query_owner("next")).release()
    finally:
        child.end()
        store.close()


# ===================================================================== in-memory only


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


def report_from_forked_child(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Fork; run ``body`` in the child and return what it reported (JSON through a pipe)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write, json.dumps(body()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        report: dict[str, Any] = json.loads(os.read(read, 4096))
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return report


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


# ==================================================================== local file only


def test_lease_file_layout_and_record(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    path = Path(store.lease_path(CHECKPOINT))
    assert path.parent == tmp_path / "_leases"
    assert path.name == lease_node_name(CHECKPOINT) + ".lease"
    assert path.name.startswith("s3_bucket_checkpoints_query-1-")
    record = json.loads(path.read_text())
    assert record == {**lease.owner.to_dict(), "name": CHECKPOINT}  # the original name is kept
    fd = _held_fd(path)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # never inherited by exec
    lease.release()
    assert path.exists()  # lease files are never removed (see the module docstring)
    assert store.lease_owner(CHECKPOINT) is None  # the stale record counts for nothing
    assert store.latest(TABLE) == -1  # leases do not touch slots, and vice versa
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_leases", table_dir_name(TABLE)]


def _held_fd(path: Path) -> int:
    from lockstore import localfs

    return localfs._HELD[str(path)].fd


def test_a_dead_owners_record_is_taken_over(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    path = Path(store.lease_path(CHECKPOINT))
    path.parent.mkdir(parents=True)
    dead = LeaseOwner("some-host", 999_999, {"queryId": "dead"}, 1).to_dict()
    path.write_text(json.dumps({**dead, "name": CHECKPOINT}))  # a record nobody locks
    assert store.lease_owner(CHECKPOINT) is None
    with store.acquire_lease(CHECKPOINT, _query_owner("alive")) as lease:
        assert json.loads(path.read_text())["info"] == {"queryId": "alive", "runId": "r-1"}
        assert LocalFileSlotStore(tmp_path).lease_owner(CHECKPOINT) == lease.owner
    path.write_text("")  # an owner that died between creating the file and writing it
    assert store.lease_owner(CHECKPOINT) is None
    store.acquire_lease(CHECKPOINT, _query_owner()).release()


def test_lease_held_by_another_open_file_in_this_process_is_detected(tmp_path: Path) -> None:
    """flock belongs to open file descriptions: an outside holder in this process counts."""
    store = LocalFileSlotStore(tmp_path)
    store.acquire_lease(CHECKPOINT, _query_owner("first")).release()
    path = store.lease_path(CHECKPOINT)
    record = {**LeaseOwner("elsewhere", 4321, {"queryId": "outside"}, 9).to_dict(), "name": CHECKPOINT}
    Path(path).write_text(json.dumps(record))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert store.lease_owner(CHECKPOINT) == LeaseOwner("elsewhere", 4321, {"queryId": "outside"}, 9)
        with pytest.raises(LeaseHeldError) as info:
            store.acquire_lease(CHECKPOINT, _query_owner())
        assert info.value.owner.pid == 4321
    finally:
        os.close(fd)
    store.acquire_lease(CHECKPOINT, _query_owner()).release()


def test_forked_child_does_not_keep_the_lease_alive(tmp_path: Path) -> None:
    """The child closes its inherited copy: the parent's release frees the lease while the
    child still lives, and the child can neither use nor release the parent's lease."""
    store = LocalFileSlotStore(tmp_path)
    lease = store.acquire_lease(CHECKPOINT, _query_owner("parent"))
    to_parent, from_child = os.pipe()
    to_child, from_parent = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(to_parent)
            os.close(from_parent)
            report: dict[str, Any] = {"held": lease.held}
            lease.release()  # a no-op: it must not unlock the parent's descriptor
            owner = store.lease_owner(CHECKPOINT)
            report["owner_pid"] = owner.pid if owner else None
            try:
                store.acquire_lease(CHECKPOINT, _query_owner("child"))
                report["acquired"] = True
            except LeaseHeldError:
                report["acquired"] = False
            os.write(from_child, json.dumps(report).encode())
            os.read(to_child, 1)  # stay alive until the parent has checked
        finally:
            os._exit(0)
    os.close(from_child)
    os.close(to_child)
    try:
        report = json.loads(os.read(to_parent, 4096))
        assert report == {"held": False, "owner_pid": os.getpid(), "acquired": False}
        assert lease.held
        lease.release()
        assert store.lease_owner(CHECKPOINT) is None  # although the child is still alive
        store.acquire_lease(CHECKPOINT, _query_owner("parent-again")).release()
    finally:
        os.close(from_parent)
        os.close(to_parent)
        os.waitpid(pid, 0)


def test_lease_os_errors_become_slot_store_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "a-file"
    root.write_text("not a directory")
    store = LocalFileSlotStore(root)
    with pytest.raises(SlotStoreUnavailableError):
        store.acquire_lease(CHECKPOINT, _query_owner())
    with pytest.raises(SlotStoreUnavailableError):
        store.lease_owner(CHECKPOINT)


# ==================================================================== local file only (slots)


def _collect(results: MPQueue[Any], procs: list[SpawnProcess], count: int, timeout: float) -> list[Any]:
    """Read ``count`` results, failing fast if a child died instead of waiting out the timeout."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        try:
            out.append(results.get(timeout=0.5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"worker process failed with exit codes {dead}"
            assert time.monotonic() < deadline, "timed out waiting for worker processes"
    return out


def _race_claimer(
    make_store: Callable[[], SlotStore],
    table: str,
    worker: int,
    target: int,
    barrier: MPBarrier,
    results: MPQueue[Any],
) -> None:
    """Child process: its own store; claim latest()+1 until the table holds ``target`` versions."""
    store = make_store()
    won: list[int] = []
    lost = 0
    barrier.wait(timeout=60)  # start all workers together so they really race
    while (version := store.latest(table) + 1) < target:
        if store.claim(table, version, SlotClaim(f"w{worker}-v{version}", f"_staged/{version}.w{worker}")):
            won.append(version)
        else:
            lost += 1
    results.put((worker, os.getpid(), won, lost))


def race_processes(
    make_store: Callable[[], SlotStore], *, workers: int, target: int, timeout: float
) -> list[tuple[int, int, list[int], int]]:
    """``workers`` spawned processes, each with its own store from ``make_store`` (picklable),
    race for versions 0..target-1; then every version was granted exactly once, its record
    names its winner, and more than one process won (a real race). Returns each worker's
    report: (worker, pid, versions won, claims lost)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    results: MPQueue[Any] = ctx.Queue()
    procs = [
        ctx.Process(target=_race_claimer, args=(make_store, TABLE, i, target, barrier, results))
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        reports = _collect(results, procs, workers, timeout=timeout)
    finally:
        for proc in procs:
            proc.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * workers

    winner: dict[int, tuple[int, int]] = {}  # version -> (worker, pid)
    for worker, pid, won, _lost in reports:
        for version in won:
            assert version not in winner, f"version {version} granted twice"
            winner[version] = (worker, pid)
    assert sorted(winner) == list(range(target))
    store = make_store()
    assert store.latest(TABLE) == target - 1
    for version, (worker, pid) in winner.items():
        record = store.get(TABLE, version)
        assert record is not None
        assert record.claim.txn_id == f"w{worker}-v{version}"
        assert record.claim.staged == f"_staged/{version}.w{worker}"
        assert record.claim.owner["pid"] == str(pid)
    assert sum(1 for _w, _p, won, _l in reports if won) >= 2
    return reports


def test_multiprocess_race_grants_every_version_exactly_once(tmp_path: Path) -> None:
    make_store = functools.partial(LocalFileSlotStore, str(tmp_path / "slots"))
    race_processes(make_store, workers=4, target=400, timeout=90)


BIG = 256 * 1024  # large enough that a naive write-in-place is observable half-written


def _big_claim(version: int) -> SlotClaim:
    return SlotClaim(f"txn-big-{version}", f"_staged/{version}-" + "x" * BIG, {"host": "h", "pid": "1"})


def _mp_big_writer(root: str, table: str, count: int, barrier: MPBarrier, results: MPQueue[Any]) -> None:
    """Child process: claim ``count`` versions with large payloads."""
    store = LocalFileSlotStore(root)
    barrier.wait(timeout=60)
    granted = []
    for version in range(count):
        # The pause lets the reader catch up, so it is spinning on get(version) at the very
        # moment the slot appears: that is the window a torn write would be visible in.
        time.sleep(0.002)
        granted.append(store.claim(table, version, _big_claim(version)))
    results.put(granted)


def test_reader_never_sees_a_partially_written_slot(tmp_path: Path) -> None:
    """The parent spins on get(next) while a child claims: the first non-None read is whole."""
    ctx = multiprocessing.get_context("spawn")
    root, count = str(tmp_path / "slots"), 60
    barrier = ctx.Barrier(2)
    results: MPQueue[Any] = ctx.Queue()
    proc = ctx.Process(target=_mp_big_writer, args=(root, TABLE, count, barrier, results))
    proc.start()
    store = LocalFileSlotStore(root)
    seen: list[SlotRecord] = []
    misses = 0
    try:
        barrier.wait(timeout=60)
        deadline = time.monotonic() + 60
        while len(seen) < count:
            record = store.get(TABLE, len(seen))  # raises LockstoreError on a torn read
            if record is None:
                misses += 1
                assert proc.exitcode in (None, 0), "writer process failed"
                assert time.monotonic() < deadline, "timed out waiting for the writer"
                continue
            assert record.claim == _big_claim(len(seen))
            assert store.latest(TABLE) >= len(seen)
            seen.append(record)
        assert _collect(results, [proc], 1, timeout=60) == [[True] * count]
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == 0
    assert [r.version for r in seen] == list(range(count))
    assert misses > 0  # the reader really polled ahead of the writer


def test_latest_does_not_list_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalFileSlotStore(tmp_path)
    for version in range(50):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True

    def forbidden(*_args: object) -> Any:
        raise AssertionError("latest() listed the directory")

    monkeypatch.setattr(os, "listdir", forbidden)
    monkeypatch.setattr(os, "scandir", forbidden)
    assert store.latest(TABLE) == 49
    assert LocalFileSlotStore(tmp_path).latest(TABLE) == 49


def test_latest_does_not_trust_a_bad_hint(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    for version in range(10):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    directory = Path(store.table_dir(TABLE))
    hint = directory / "_latest"
    # Contiguous claims refresh the hint only every 16 versions; the probe covers the rest.
    assert os.readlink(hint) == "00000000000000000000.slot"
    assert store.latest(TABLE) == 9

    hint.unlink()  # stale: pointing at an older slot
    hint.symlink_to("00000000000000000003.slot")
    assert store.latest(TABLE) == 9

    hint.unlink()  # missing entirely (a crash between link and hint update)
    assert store.latest(TABLE) == 9
    assert os.readlink(hint) == "00000000000000000009.slot"  # repaired

    hint.unlink()
    hint.write_text("garbage")  # not a symlink at all
    assert store.latest(TABLE) == 9
    assert os.readlink(hint) == "00000000000000000009.slot"  # repaired

    hint.unlink()  # ahead of reality: its slot was removed (repair)
    hint.symlink_to("00000000000000000042.slot")
    (directory / "00000000000000000009.slot").unlink()
    assert store.latest(TABLE) == 8
    assert store.claim(TABLE, 9, _claim("txn-9b")) is True
    assert store.latest(TABLE) == 9


def test_latest_repairs_a_far_behind_hint(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    for version in range(50):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    hint = Path(store.table_dir(TABLE)) / "_latest"
    hint.unlink()
    hint.symlink_to("00000000000000000003.slot")
    assert store.latest(TABLE) == 49
    assert os.readlink(hint) == "00000000000000000049.slot"
    hint.unlink()
    hint.symlink_to("00000000000000000045.slot")  # a short lag is left alone
    assert store.latest(TABLE) == 49
    assert os.readlink(hint) == "00000000000000000045.slot"


def test_file_layout_and_payload(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    claim = _claim("txn-layout")
    assert store.claim(TABLE, 0, claim) is True
    assert store.claim(TABLE, 0, _claim("txn-loser")) is False
    store.mark_complete(TABLE, 0)
    store.bind(TABLE, "table-id-1")

    directory = Path(store.table_dir(TABLE))
    assert directory.parent == tmp_path
    assert directory.name == table_dir_name(TABLE)
    assert directory.name.startswith("file_data_warehouse_events-")
    assert table_dir_name("s3://bucket/t") != table_dir_name("s3:/bucket/t")
    assert sorted(p.name for p in directory.iterdir()) == [
        "00000000000000000000.done",
        "00000000000000000000.slot",
        "_latest",
        "_table_id",
    ]  # no temp files left behind, winner's or loser's
    payload = json.loads(os.readlink(directory / "00000000000000000000.slot"))  # the claim is a symlink
    assert payload["claim"] == claim.to_dict()
    assert abs(payload["claimed_at"] - time.time()) < 60
    assert (directory / "_table_id").read_text() == "table-id-1"


def test_missing_root_is_created_on_first_claim(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet" / "there"
    store = LocalFileSlotStore(root)
    assert store.latest(TABLE) == -1
    assert store.get(TABLE, 0) is None
    assert not root.exists()  # reads do not create anything
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    assert root.is_dir()
    assert store.latest(TABLE) == 0


def test_root_removed_under_a_live_store_is_recreated(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalFileSlotStore(root)
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    shutil.rmtree(root)
    assert store.latest(TABLE) == -1
    assert store.claim(TABLE, 0, _claim("txn-again")) is True
    record = store.get(TABLE, 0)
    assert record is not None
    assert record.claim.txn_id == "txn-again"


def test_os_errors_become_slot_store_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "a-file"
    root.write_text("not a directory")
    store = LocalFileSlotStore(root)
    calls: list[Callable[[], object]] = [
        lambda: store.claim(TABLE, 0, _claim("txn-0")),
        lambda: store.latest(TABLE),
        lambda: store.get(TABLE, 0),
        lambda: store.mark_complete(TABLE, 0),
        lambda: store.bind(TABLE, "id-1"),
    ]
    for call in calls:
        with pytest.raises(SlotStoreUnavailableError) as info:
            call()
        assert isinstance(info.value, LockstoreError)
        assert isinstance(info.value.__cause__, NotADirectoryError)
    assert root.read_text() == "not a directory"


def test_corrupt_slot_file_is_reported(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    slot = Path(store.table_dir(TABLE)) / "00000000000000000000.slot"
    slot.unlink()
    slot.write_text('{"claim": {"txn_id": "tr')
    with pytest.raises(LockstoreError, match="corrupt slot file"):
        store.get(TABLE, 0)


def test_fsync_mode_is_compatible(tmp_path: Path) -> None:
    durable, plain = LocalFileSlotStore(tmp_path, fsync=True), LocalFileSlotStore(tmp_path)
    assert durable.claim(TABLE, 0, _claim("txn-0")) is True
    assert plain.claim(TABLE, 0, _claim("txn-x")) is False
    assert plain.claim(TABLE, 1, _claim("txn-1")) is True
    assert durable.latest(TABLE) == 1
    durable.mark_complete(TABLE, 0)
    durable.bind(TABLE, "id-1")
    with pytest.raises(TableBindingError):
        plain.bind(TABLE, "id-2")
    record = plain.get(TABLE, 0)
    assert record is not None
    assert (record.claim.txn_id, record.complete) == ("txn-0", True)
