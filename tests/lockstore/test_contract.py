"""Contract tests for every :class:`lockstore.SlotStore` adapter: one test per slot guarantee in
:mod:`lockstore.base` (exclusive grant, durable record, monotone latest, idempotent
completion, find_txn, bind, independent tables, thread races, close), run against each
adapter through the parametrised ``make_store`` fixture.

The rest of the suite: leases in ``test_contract_leases.py``; tests specific to one adapter
in ``test_contract_memory.py`` and ``test_contract_localfs.py``; what they share in
``contract_support.py``.
"""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from lockstore import SlotClaim, SlotNotClaimedError, SlotStore, TableBindingError

# The "name as name" imports re-export helpers that test_counters.py and test_objectstore.py
# import from this module; they live in contract_support.py.
from tests.lockstore import contract_support as support
from tests.lockstore.contract_support import CHECKPOINT as CHECKPOINT
from tests.lockstore.contract_support import TABLE as TABLE
from tests.lockstore.contract_support import MakeStore as MakeStore
from tests.lockstore.contract_support import _claim as _claim
from tests.lockstore.contract_support import _collect as _collect
from tests.lockstore.contract_support import _Holder as _Holder
from tests.lockstore.contract_support import _query_owner as _query_owner
from tests.lockstore.contract_support import race_processes as race_processes
from tests.lockstore.contract_support import report_from_forked_child as report_from_forked_child
from tests.lockstore.contract_support import run_in_threads

# The suite's fixtures, taken by name (pytest finds a fixture among a module's attributes).
make_store = support.make_store  # every adapter
store = support.store


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

    run_in_threads(threads, run)

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

    run_in_threads(threads, run)

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
