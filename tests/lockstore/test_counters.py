"""Contract tests of :meth:`lockstore.SlotStore.reserve_range` (the "Counters" guarantees
of :mod:`lockstore.base`), run against every adapter through ``make_store``; then a race
of spawned processes on the local-file and embedded stores."""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import random
import threading
from collections.abc import Callable
from multiprocessing.queues import Queue as MPQueue
from multiprocessing.synchronize import Barrier as MPBarrier
from pathlib import Path
from typing import Any

import pytest

from lockstore import EmbeddedSlotStore, LocalFileSlotStore, SlotStore
from tests.lockstore import test_contract as contract
from tests.lockstore.test_contract import TABLE, MakeStore, _collect

make_store = contract.make_store  # the contract suite's parametrised fixture: every adapter

OTHER = "file:///data/warehouse/other"


def _assert_disjoint(ranges: list[tuple[int, int]]) -> None:
    ordered = sorted(ranges)
    for (first, count), (nxt, _) in itertools.pairwise(ordered):
        assert first + count <= nxt, f"ranges overlap: {ordered}"


def test_counter_starts_at_zero_and_moves_by_count(make_store: MakeStore) -> None:
    store = make_store()
    assert store.reserve_range(TABLE, "id", 5) == 0
    assert store.reserve_range(TABLE, "id", 1) == 5
    assert store.reserve_range(TABLE, "id", 10) == 6
    # another handle onto the same store continues the same counter
    assert make_store().reserve_range(TABLE, "id", 2) == 16


def test_floor_lifts_the_counter_and_a_lower_floor_never_lowers_it(make_store: MakeStore) -> None:
    store = make_store()
    assert store.reserve_range(TABLE, "id", 3, floor=100) == 100
    assert store.reserve_range(TABLE, "id", 3, floor=7) == 103
    assert store.reserve_range(TABLE, "id", 1, floor=106) == 106
    assert make_store().reserve_range(TABLE, "id", 1) == 107


def test_counters_are_per_table_and_per_name(make_store: MakeStore) -> None:
    store = make_store()
    assert store.reserve_range(TABLE, "a", 4) == 0
    assert store.reserve_range(TABLE, "b", 4) == 0
    assert store.reserve_range(OTHER, "a", 4) == 0
    assert store.reserve_range(TABLE, "a", 4) == 4
    assert store.reserve_range(TABLE, "b/with spaces:and*odd chars", 1) == 0


@pytest.mark.parametrize("count, floor", [(0, 0), (-1, 0), (1, -1), (True, 0), (1.5, 0)])
def test_invalid_requests_are_refused_without_moving_the_counter(
    make_store: MakeStore, count: Any, floor: Any
) -> None:
    store = make_store()
    with pytest.raises(ValueError):
        store.reserve_range(TABLE, "id", count, floor)
    assert store.reserve_range(TABLE, "id", 1) == 0


def test_ranges_reserved_by_racing_threads_are_disjoint(make_store: MakeStore) -> None:
    ranges: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(seed: int) -> None:
        store = make_store()  # a handle per thread where the adapter has handles
        rng = random.Random(seed)
        try:
            barrier.wait(timeout=30)
            for _ in range(15):
                count = rng.randint(1, 50)
                first = store.reserve_range(TABLE, "id", count, floor=rng.choice([0, 0, 300]))
                with lock:
                    ranges.append((first, count))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(ranges) == 60
    _assert_disjoint(ranges)
    # every reservation after a floor of 300 was seen starts at or above it
    assert make_store().reserve_range(TABLE, "id", 1) >= max(f + c for f, c in ranges)


def _reserver(make: Callable[[], SlotStore], worker: int, barrier: MPBarrier, results: MPQueue[Any]) -> None:
    store = make()
    barrier.wait(timeout=60)
    got = [(store.reserve_range(TABLE, "id", 1 + (i + worker) % 7), 1 + (i + worker) % 7) for i in range(100)]
    results.put(got)


@pytest.mark.parametrize("adapter", [LocalFileSlotStore, EmbeddedSlotStore])
def test_ranges_reserved_by_racing_processes_are_disjoint(tmp_path: Path, adapter: type[SlotStore]) -> None:
    make = functools.partial(adapter, str(tmp_path / "slots"))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    results: MPQueue[Any] = ctx.Queue()
    procs = [ctx.Process(target=_reserver, args=(make, i, barrier, results)) for i in range(4)]
    for proc in procs:
        proc.start()
    try:
        reports = _collect(results, procs, 4, timeout=120)
    finally:
        for proc in procs:
            proc.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * 4
    ranges = [r for report in reports for r in report]
    assert len(ranges) == 400
    _assert_disjoint(ranges)
    total = sum(c for _, c in ranges)
    assert max(f + c for f, c in ranges) == total  # no gaps without failures
    assert make().reserve_range(TABLE, "id", 1) == total
