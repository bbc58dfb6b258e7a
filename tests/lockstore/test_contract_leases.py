"""Contract tests of the lease guarantees in :mod:`lockstore.base`, for every adapter through
``make_store``; then leases across processes (a child holding a lease, SIGKILLed, or
exiting) on the local-file, ZooKeeper and S3 object-store adapters.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from lockstore import (
    InMemorySlotStore,
    Lease,
    LeaseHeldError,
    LeaseOwner,
    LockstoreError,
    SlotStore,
    lease_owner_here,
)
from lockstore.base import lease_node_name
from lockstore.registry import open_slot_store
from tests.lockstore import contract_support as support
from tests.lockstore.contract_support import CHECKPOINT, MakeStore, _Holder, _query_owner, run_in_threads

# The suite's fixtures, taken by name (pytest finds a fixture among a module's attributes).
make_store = support.make_store  # every adapter
store = support.store


# ----------------------------------------------------------------------------- leases


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

    run_in_threads(threads, run)
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
