"""Four writer processes insert into one identity-column table at once, through ZooKeeper
slots and through the embedded store: every insert commits (no failure, no retry the user
sees), identity values are unique, every acknowledged insert is present exactly once,
versions are gapless, ``verify`` passes, and replaying the history gives the table.

Each commit's new rows are read by time travel (version v minus version v-1) and must be
exactly the acknowledged batch, with identity values inside the ranges the commit recorded.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import DeltaConcurrentModificationException, Table, identity_field
from eventlog.files.identity import identity_columns
from eventlog.log.storage import LogStore

SCHEMA = pa.schema(
    [
        identity_field("id", start=100, step=7),
        ("worker", pa.int64()),
        ("batch", pa.int64()),
        ("k", pa.int64()),
    ]
)
WORKERS, OPS = 4, 15


def _insert_worker(uri: str, slots: str | None, worker: int, start: Any, out: Any) -> None:
    table = Table.open(uri, slots=slots)
    acks, failures = [], []
    start.wait(timeout=60)
    for batch in range(OPS):
        n = 1 + (worker + batch) % 4
        data = pa.table({"worker": [worker] * n, "batch": [batch] * n, "k": list(range(n))})
        try:
            result = table.append(data)
        except DeltaConcurrentModificationException as exc:
            failures.append(type(exc).__name__)
            continue
        acks.append(
            {
                "version": result.version,
                "txn": result.txn_id,
                "worker": worker,
                "batch": batch,
                "n": n,
                "attempts": result.attempts,
            }
        )
    table.close()
    out.put((acks, failures))


def _run(uri: str, slots: str | None) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(WORKERS)  # all open their table, then race
    procs = [ctx.Process(target=_insert_worker, args=(uri, slots, w, start, out)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [f for _, failures in reports for f in failures] == []  # zero failed inserts
    return [a for acks, _ in reports for a in acks]


def _check(uri: str, slots: str | None, acks: list[dict[str, Any]]) -> None:
    assert len(acks) == WORKERS * OPS
    assert any(a["attempts"] > 1 for a in acks), "no insert was rebased: the writers did not race"
    versions = LogStore.commit_versions(LogStore(uri).list_log())
    assert versions == list(range(WORKERS * OPS + 1)), "versions are not gapless"
    table = Table.open(uri, slots=slots)
    history = {h["version"]: h for h in table.history()}
    assert sorted(a["version"] for a in acks) == versions[1:]  # each insert once, at its version
    rows = table.to_arrow()
    ids = rows.column("id").to_pylist()
    assert None not in ids and len(ids) == len(set(ids)), "identity values are not unique"
    assert all((i - 100) % 7 == 0 and i >= 100 for i in ids)
    keys = sorted(zip(*(rows.column(c).to_pylist() for c in ("worker", "batch", "k")), strict=True))
    assert keys == sorted((a["worker"], a["batch"], k) for a in acks for k in range(a["n"]))
    # Replay: each version adds exactly its acknowledged batch, with values in its ranges.
    replayed: dict[int, tuple[int, int, int]] = {}
    previous: set[int] = set()
    for ack in sorted(acks, key=lambda a: a["version"]):
        assert history[ack["version"]]["txnId"] == ack["txn"]
        snapshot_rows = table.to_arrow(version=ack["version"]).to_pylist()
        new = [r for r in snapshot_rows if r["id"] not in previous]
        assert sorted((r["worker"], r["batch"], r["k"]) for r in new) == [
            (ack["worker"], ack["batch"], k) for k in range(ack["n"])
        ]
        ((first, last),) = history[ack["version"]]["eventlog.identity"]["id"]
        assert sorted(r["id"] for r in new) == list(range(first, last + 1, 7))
        for r in new:
            replayed[r["id"]] = (r["worker"], r["batch"], r["k"])
        previous = {r["id"] for r in snapshot_rows}
    assert replayed == {r["id"]: (r["worker"], r["batch"], r["k"]) for r in rows.to_pylist()}
    (column,) = identity_columns(table.refresh().schema)
    assert column.high_water_mark is not None and column.high_water_mark >= max(ids)
    assert table.verify().ok
    table.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_four_processes_insert_through_the_embedded_store(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA).close()
    _check(uri, None, _run(uri, None))


@pytest.mark.slow
@pytest.mark.zookeeper
@pytest.mark.timeout(300)
def test_four_processes_insert_through_zookeeper_slots(tmp_path: Path, zk_chroot: str) -> None:
    uri, slots = str(tmp_path / "t"), f"zk://{zk_chroot}?timeout=10"
    Table.create(uri, SCHEMA, slots=slots).close()
    _check(uri, slots, _run(uri, slots))
