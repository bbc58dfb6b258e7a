"""Contract tests for every :class:`lockstore.SlotStore` adapter.

One test per guarantee in :mod:`lockstore.base`, run against each adapter through the
parametrised ``make_store`` fixture, followed by tests specific to the local-file adapter:
real multi-process races (``spawn`` start method), torn-read checks, the ``_latest`` hint
and OS-error translation.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue as MPQueue
from multiprocessing.synchronize import Barrier as MPBarrier
from pathlib import Path
from typing import Any

import pytest

from lockstore import (
    InMemorySlotStore,
    LocalFileSlotStore,
    LockstoreError,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    SlotStoreUnavailableError,
    TableBindingError,
)
from lockstore.localfs import table_dir_name

TABLE = "file:///data/warehouse/events"
OWNER = {"host": "test-host", "pid": "4242"}

MakeStore = Callable[[], SlotStore]


def _claim(txn_id: str, staged: str | None = None) -> SlotClaim:
    return SlotClaim(txn_id, staged or f"_staged/{txn_id}.json", dict(OWNER))


@pytest.fixture(params=["memory", "localfs", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    """A factory of handles onto one fresh backing store.

    Every call returns a handle onto the *same* slots: the same object for the in-memory
    adapter (which lives in one process), a new object on the same root for the file
    adapter, so reopening is part of what the contract tests check.
    """
    handles: list[SlotStore] = []
    if request.param == "memory":
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


# ==================================================================== local file only


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


def _mp_claimer(
    root: str, table: str, worker: int, target: int, barrier: MPBarrier, results: MPQueue[Any]
) -> None:
    """Child process: claim latest()+1 until the table holds ``target`` versions."""
    store = LocalFileSlotStore(root)
    won: list[int] = []
    lost = 0
    barrier.wait(timeout=60)  # start all workers together so they really race
    while (version := store.latest(table) + 1) < target:
        if store.claim(table, version, SlotClaim(f"w{worker}-v{version}", f"_staged/{version}.w{worker}")):
            won.append(version)
        else:
            lost += 1
    results.put((worker, os.getpid(), won, lost))


def test_multiprocess_race_grants_every_version_exactly_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    root, workers, target = str(tmp_path / "slots"), 4, 400
    barrier = ctx.Barrier(workers)
    results: MPQueue[Any] = ctx.Queue()
    procs = [
        ctx.Process(target=_mp_claimer, args=(root, TABLE, i, target, barrier, results))
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        reports = _collect(results, procs, workers, timeout=90)
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

    store = LocalFileSlotStore(root)
    assert store.latest(TABLE) == target - 1
    for version, (worker, pid) in winner.items():
        record = store.get(TABLE, version)
        assert record is not None
        assert record.claim.txn_id == f"w{worker}-v{version}"
        assert record.claim.staged == f"_staged/{version}.w{worker}"
        assert record.claim.owner["pid"] == str(pid)
    # It was a real race: more than one process won versions.
    assert sum(1 for _w, _p, won, _l in reports if won) >= 2


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
