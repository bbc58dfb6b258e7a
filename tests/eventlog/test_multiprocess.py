"""Real processes appending and deleting on one table; invariants checked at the end.

Invariants: versions are gapless 0..N; every acknowledged commit is in the log exactly
once, at the version it was acknowledged with; no append ever failed (blind appends
cannot conflict); the table's contents equal a replay of the acknowledged history.
"""

from __future__ import annotations

import multiprocessing as mp
import random
from typing import Any

import pyarrow as pa
import pytest

from eventlog import DeltaConcurrentModificationException, Table
from eventlog.storage import LogStore

WORKERS = 4
OPS_PER_WORKER = 40
SCHEMA = pa.schema([("id", pa.int64()), ("worker", pa.int64()), ("batch", pa.int64())])


def _worker(uri: str, worker: int, seed: int, out: Any) -> None:
    rng = random.Random(seed)
    table = Table.open(uri)
    acks: list[dict[str, Any]] = []
    conflicts = 0
    mine: list[list[int]] = []  # id batches this worker appended and has not deleted
    for batch in range(OPS_PER_WORKER):
        if mine and rng.random() < 0.3:
            ids = mine.pop(rng.randrange(len(mine)))
            partial = rng.random() < 0.5
            target = ids[:1] if partial else ids  # partial deletes rewrite a file
            lo, hi = min(target), max(target)
            while True:  # deletes may conflict with other deletes: retry on a fresh snapshot
                try:
                    res = table.delete(f"id >= {lo} AND id <= {hi}")
                    break
                except DeltaConcurrentModificationException:
                    conflicts += 1
                    continue
            acks.append({"kind": "delete", "version": res.version, "txn": res.txn_id, "ids": target})
            if partial:
                mine.append(ids[1:])
        else:
            ids = [worker * 1_000_000 + batch * 10 + k for k in range(3)]
            data = pa.table({"id": ids, "worker": [worker] * 3, "batch": [batch] * 3}, schema=SCHEMA)
            res = table.append(data)  # must never fail: blind appends cannot conflict
            acks.append({"kind": "append", "version": res.version, "txn": res.txn_id, "ids": ids})
            mine.append(ids)
    out.put((worker, conflicts, acks))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["rewrite", "deletion-vectors"])
def test_four_processes_append_and_delete(tmp_path: Any, deletion_vectors: bool) -> None:
    """With deletion vectors, deletes of different rows of one file resolve row by row."""
    uri = str(tmp_path / "t")
    props = {"delta.enableDeletionVectors": "true"} if deletion_vectors else {}
    Table.create(uri, SCHEMA, properties=props)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(uri, w, 1000 + w, queue)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    acks = [a for _, _, worker_acks in results for a in worker_acks]
    assert len(acks) == WORKERS * OPS_PER_WORKER

    # Gapless versions 0..N in the log.
    log = LogStore(uri)
    versions = LogStore.commit_versions(log.list_log())
    assert versions == list(range(len(versions)))
    table = Table.open(uri)
    assert table.version == versions[-1]

    # Every acknowledged commit present exactly once, at its acknowledged version.
    by_version = {h["version"]: h for h in table.history()}
    txn_ids = [h.get("txnId") for h in by_version.values()]
    assert len(txn_ids) == len(set(txn_ids))
    for ack in acks:
        assert by_version[ack["version"]]["txnId"] == ack["txn"]
    assert len(by_version) == len(acks) + 1  # + CREATE TABLE

    # Contents equal a replay of the acknowledged history in version order.
    expected: set[int] = set()
    for ack in sorted(acks, key=lambda a: a["version"]):
        if ack["kind"] == "append":
            expected |= set(ack["ids"])
        else:
            expected -= set(ack["ids"])
    got = table.to_arrow().column("id").to_pylist()
    assert len(got) == len(set(got))  # no duplicated row
    assert set(got) == expected
    if deletion_vectors:  # partial deletes were recorded as deletion vectors
        assert any(a.deletion_vector is not None for a in table.snapshot().add_files)
    # And a fresh replay of the log from version 0 agrees with the cached handle.
    assert Table.open(uri).snapshot().files == table.snapshot().files
