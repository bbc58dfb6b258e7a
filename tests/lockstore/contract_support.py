"""What the slot-store contract suite (``test_contract*.py``) shares: the table and owner the
tests claim with, the parametrised ``make_store`` fixture (every adapter), and the helpers
for real processes: a child holding a lease, a race of spawned claimers, a forked child
reporting back. ``test_counters.py`` and ``test_objectstore.py`` use them too.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
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
    LeaseOwner,
    LocalFileSlotStore,
    ObjectStoreSlotStore,
    SlotClaim,
    SlotStore,
    lease_owner_here,
)
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


CHECKPOINT = "s3://bucket/checkpoints/query-1"


def _query_owner(query: str = "q-1", run: str = "r-1") -> LeaseOwner:
    return lease_owner_here(queryId=query, runId=run)


# ------------------------------------------------------------ helpers for real processes


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


def fork_quietly() -> int:
    """``os.fork()``, without the DeprecationWarning Python 3.12+ gives when threads run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        return os.fork()


def run_in_threads(threads: int, run: Callable[[int], None]) -> None:
    """``run(i)`` for each i below ``threads``, in as many threads; waits up to 60 s for each."""
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)


def report_from_forked_child(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Fork; run ``body`` in the child and return what it reported (JSON through a pipe)."""
    read, write = os.pipe()
    pid = fork_quietly()
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
