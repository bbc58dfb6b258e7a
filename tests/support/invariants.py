"""Concurrent writer processes and the invariants every concurrency test ends with.

Invariants: versions are gapless 0..N; every acknowledged commit is in the log exactly
once, at the version it was acknowledged with; no blind append ever failed; the table's
contents equal a replay of the history (appends add their ids, deletes remove theirs).
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from eventlog import DeltaConcurrentModificationException, Table
from eventlog.storage import LogStore

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
    slots: str | None = None,
    delete_share: float = 0.3,
    start: Any = None,
    retry_errors: tuple[type[BaseException], ...] = (),
) -> None:
    """Blind appends of 3-row batches and deletes of this worker's own rows.

    Deletes retry on conflicts (a fresh snapshot each time). ``retry_errors``: other
    errors a commit may raise and be retried after (e.g. slot store outages in fault
    tests); they are recorded in ``errors``.
    """
    rng = random.Random(seed)
    table = Table.open(uri, slots=slots)
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
                    res = table.append(data)
                    result.acks.append(
                        {"kind": "append", "version": res.version, "txn": res.txn_id, "ids": ids}
                    )
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
) -> list[WriterResult]:
    """Run ``workers`` writer processes (spawned, started together); return their results."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = ctx.Event()
    procs = [
        ctx.Process(
            target=writer,
            args=(uri, w, ops, 1000 + w, queue, slots),
            kwargs={"start": start, "retry_errors": retry_errors},
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


def check_invariants(
    uri: str,
    acks: Sequence[dict[str, Any]],
    *,
    slots: str | None = None,
    unacknowledged: int = 0,
) -> Table:
    """Assert the invariants (see the module docstring); return a fresh handle.

    ``unacknowledged``: commits that landed without an acknowledgement (a writer killed
    after its claim, whose commit others then published).
    """
    log = LogStore(uri)
    versions = LogStore.commit_versions(log.list_log())
    assert versions == list(range(len(versions))), "versions are not gapless"
    table = Table.open(uri, slots=slots)
    assert table.version == versions[-1]
    history = {h["version"]: h for h in table.history()}
    txn_ids = [h.get("txnId") for h in history.values()]
    assert len(txn_ids) == len(set(txn_ids)), "a commit landed twice"
    for ack in acks:
        assert history[ack["version"]]["txnId"] == ack["txn"], f"acknowledged commit missing: {ack}"
    assert len(history) == len(acks) + 1 + unacknowledged  # + CREATE TABLE
    expected: set[int] = set()
    for ack in sorted(acks, key=lambda a: a["version"]):
        if ack["kind"] == "append":
            expected |= set(ack["ids"])
        else:
            expected -= set(ack["ids"])
    got = table.to_arrow().column("id").to_pylist()
    assert len(got) == len(set(got)), "a row is duplicated"
    if not unacknowledged:
        assert set(got) == expected
    else:
        assert expected <= set(got)
    assert Table.open(uri, slots=slots).snapshot().files == table.snapshot().files
    return table
