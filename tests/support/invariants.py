"""Concurrent writer processes and the invariants every concurrency test ends with.

Invariants: versions are gapless 0..N; every acknowledged commit is in the log exactly
once, at the version it was acknowledged with; no blind append ever failed; the table's
contents equal a replay of the history (appends add their ids, deletes remove theirs).

Group commit (``group_commit=True``): one version may carry several acknowledged blind
appends (:func:`eventlog.txn.groupcommit.member_txn_ids`), so a commit is "in the log" when
its transaction id is among the txn ids its version carries; without group commit every
version carries exactly one, and the checks are the plain one-commit-per-version ones.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from eventlog import CommitResult, DeltaConcurrentModificationException, Table, Transaction
from eventlog.log.commit import member_txn_ids
from eventlog.log.commitlog import SlotsSpec
from eventlog.log.storage import LogStore
from eventlog.txn.groupcommit import QueuedName

SCHEMA = pa.schema([("id", pa.int64()), ("worker", pa.int64()), ("batch", pa.int64())])


@dataclass
class WriterResult:
    worker: int
    acks: list[dict[str, Any]] = field(default_factory=list)
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)


def writer(
    uri: str,
    worker: int,
    ops: int,
    seed: int,
    out: Any,
    slots: SlotsSpec = None,
    delete_share: float = 0.3,
    start: Any = None,
    retry_errors: tuple[type[BaseException], ...] = (),
    group_commit: bool = False,
    storage_options: dict[str, Any] | None = None,
    merge_share: float = 0.0,
) -> None:
    """Blind appends of 3-row batches, deletes of this worker's own rows and (with
    ``merge_share``) MERGEs that upsert a new batch by id (acknowledged like appends).

    Deletes retry on conflicts (a fresh snapshot each time). ``retry_errors``: other
    errors a commit may raise and be retried after (e.g. slot store outages in fault
    tests); they are recorded in ``errors``. ``group_commit``: open the table with group
    commit (the appends may share versions; deletes use the normal commit loop).
    Runs in a process (``run_writers``) or a thread (``out`` is then a ``queue.Queue``).
    """
    rng = random.Random(seed)
    table = Table.open(uri, slots=slots, group_commit=group_commit, storage_options=storage_options)
    result = WriterResult(worker)
    mine: list[list[int]] = []
    if start is not None:
        start.wait()
    for batch in range(ops):
        while True:
            try:
                if mine and rng.random() < delete_share:
                    ids = mine[rng.randrange(len(mine))]
                    partial = rng.random() < 0.5
                    target = ids[:1] if partial else ids
                    try:
                        res = table.delete(f"id >= {min(target)} AND id <= {max(target)}")
                    except DeltaConcurrentModificationException:
                        result.conflicts += 1
                        continue
                    mine.remove(ids)
                    if partial and ids[1:]:
                        mine.append(ids[1:])
                    result.acks.append(
                        {"kind": "delete", "version": res.version, "txn": res.txn_id, "ids": target}
                    )
                else:
                    ids = [worker * 1_000_000 + batch * 10 + k for k in range(3)]
                    data = pa.table({"id": ids, "worker": [worker] * 3, "batch": [batch] * 3}, schema=SCHEMA)
                    kind = "merge" if rng.random() < merge_share else "append"
                    if kind == "merge":
                        merge = table.merge(data, on="t.id = s.id", source_alias="s", target_alias="t")
                        try:
                            res = merge.when_matched_update_all().when_not_matched_insert_all().execute()
                        except DeltaConcurrentModificationException:
                            result.conflicts += 1
                            continue
                    else:
                        res = table.append(data)
                    result.acks.append({"kind": kind, "version": res.version, "txn": res.txn_id, "ids": ids})
                    mine.append(ids)
                break
            except retry_errors as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)
    out.put(result)


def run_writers(
    uri: str,
    workers: int,
    ops: int,
    *,
    slots: str | None = None,
    timeout: float = 240.0,
    during: Callable[[], None] | None = None,
    retry_errors: tuple[type[BaseException], ...] = (),
    group_commit: bool = False,
    storage_options: dict[str, Any] | None = None,
    merge_share: float = 0.0,
) -> list[WriterResult]:
    """Run ``workers`` writer processes (spawned, started together); return their results.
    Each process opens the table itself: its own file-system client and slot-store session."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = ctx.Event()
    procs = [
        ctx.Process(
            target=writer,
            args=(uri, w, ops, 1000 + w, queue, slots),
            kwargs={
                "start": start,
                "retry_errors": retry_errors,
                "group_commit": group_commit,
                "storage_options": storage_options,
                "merge_share": merge_share,
            },
        )
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    start.set()
    if during is not None:
        during()
    results = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"writer process exited with {p.exitcode}"
    return results


def run_writer_threads(
    uri: str,
    workers: int,
    ops: int,
    *,
    slots: SlotsSpec = None,
    delete_share: float = 0.3,
    group_commit: bool = False,
    timeout: float = 60.0,
) -> list[WriterResult]:
    """Run ``workers`` :func:`writer` threads of this process (started together)."""
    out: queue.Queue[WriterResult] = queue.Queue()
    start = threading.Event()
    failures: list[BaseException] = []

    def run(w: int) -> None:
        try:
            writer(uri, w, ops, 1000 + w, out, slots, delete_share, start, group_commit=group_commit)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(w,), name=f"writer-{w}") for w in range(workers)]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a writer thread hung"
    assert not failures, f"writer threads failed: {failures!r}"
    return [out.get_nowait() for _ in threads]


def hold_until_queued(monkeypatch: pytest.MonkeyPatch, parties: int) -> None:
    """Group commit: hold the first ``parties`` writers of this process right after each
    queued its append, until all of them have. Every leader then sees every queued file,
    so the first version granted carries all of them (deterministic grouping)."""
    barrier = threading.Barrier(parties, timeout=20)
    original = LogStore.stage
    held = [0]
    lock = threading.Lock()

    def stage(self: LogStore, name: str, data: bytes, *, atomic: bool = False) -> None:
        original(self, name, data, atomic=atomic)
        if QueuedName.parse(name) is None:
            return
        with lock:
            held[0] += 1
            hold = held[0] <= parties
        if hold:
            barrier.wait()

    monkeypatch.setattr(LogStore, "stage", stage)


def commit_concurrently(
    txns: Sequence[Transaction], timeout: float = 30.0
) -> list[CommitResult | BaseException]:
    """Commit each transaction in its own thread; each one's result or exception, in order."""
    out: list[CommitResult | BaseException | None] = [None] * len(txns)

    def run(i: int) -> None:
        try:
            out[i] = txns[i].commit()
        except BaseException as exc:  # returned to the caller
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"commit-{i}") for i in range(len(txns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a commit hung"
    return [o for o in out if o is not None]


def check_invariants(
    uri: str,
    acks: Sequence[dict[str, Any]],
    *,
    slots: SlotsSpec = None,
    unacknowledged: int = 0,
    storage_options: dict[str, Any] | None = None,
) -> Table:
    """Assert the invariants (see the module docstring); return a fresh handle.

    ``unacknowledged``: commits that landed without an acknowledgement (a writer killed
    after its claim, whose commit others then published).
    """
    log = LogStore(uri, storage_options=storage_options)
    versions = LogStore.commit_versions(log.list_log())
    assert versions == list(range(len(versions))), "versions are not gapless"
    table = Table.open(uri, slots=slots, storage_options=storage_options)
    assert table.version == versions[-1]
    history = {h["version"]: h for h in table.history()}
    carried = {version: member_txn_ids(h) for version, h in history.items()}
    txn_ids = [txn for txns in carried.values() for txn in txns]
    assert len(txn_ids) == len(set(txn_ids)), "a commit landed twice"
    for ack in acks:
        assert ack["txn"] in carried[ack["version"]], f"acknowledged commit missing: {ack}"
    acked_versions = {ack["version"] for ack in acks}
    assert len(history) == len(acked_versions) + 1 + unacknowledged  # + CREATE TABLE
    if not unacknowledged:
        # Nothing landed that was not acknowledged (a group carries acknowledged appends only).
        landed = {txn for version, txns in carried.items() if version > 0 for txn in txns}
        assert landed == {ack["txn"] for ack in acks}, "a commit landed without an acknowledgement"
    expected: set[int] = set()
    for ack in sorted(acks, key=lambda a: a["version"]):
        if ack["kind"] in ("append", "merge"):  # a MERGE upserts a new batch: its ids are added
            expected |= set(ack["ids"])
        else:
            expected -= set(ack["ids"])
    got = table.to_arrow().column("id").to_pylist()
    assert len(got) == len(set(got)), "a row is duplicated"
    if not unacknowledged:
        assert set(got) == expected
    else:
        assert expected <= set(got)
    fresh = Table.open(uri, slots=slots, storage_options=storage_options)
    assert fresh.snapshot().files == table.snapshot().files
    return table
