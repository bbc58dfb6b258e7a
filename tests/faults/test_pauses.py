"""Process pauses: the stale lock holder (issue 28).

A writer process stops (SIGSTOP) right after its version claim was granted, for longer
than its ZooKeeper session (or the S3 store's lease TTL), while other writer processes go
on; then it is resumed (SIGCONT). The claim is the commit point: the others publish the
paused writer's commit from its staged file, and the resumed writer finds its own commit
in place and acknowledges it once, at the version it claimed. Nothing is published over
it, nothing is lost or duplicated.

The streaming checkpoint lease: a query process holds its checkpoint's lease and stops
right before committing a batch (after every ownership check); its lease expires, a second
run of the query takes the checkpoint over and goes further; the first, resumed, must not
commit its batch again: it stops with ``ConcurrentTransactionException``
(``DELTA_CONCURRENT_TRANSACTION``), the sink's commit-time backstop. The lease is exercised
through the lease API the sink uses (:mod:`streaming.ownership`) from plain processes, the
way an engine whose driver lives as long as its query holds it; no SparkSession is started.

Every test ends with the checks of issue 28: the invariants with a fresh handle, ``verify``
and a new write, and bounded joins.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.log.storage import LogStore
from lockstore.registry import open_slot_store, release_slot_store
from streaming.ownership import lease_name
from tests.faults.pause_writers import (
    HOLD_FILE,
    ROWS_PER_BATCH,
    STREAM_SCHEMA,
    finished_batches,
    paused_writer,
    streaming_query,
)
from tests.support.invariants import SCHEMA, check_invariants, run_writers

pytestmark = pytest.mark.timeout(180)

SPAWN = mp.get_context("spawn")


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(0.05)


def _state(pid: int | None) -> str:
    """The process's state letter from /proc (``T``: stopped)."""
    assert pid is not None, "the process was not started"
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _held(proc: Any, hold_dir: Path) -> dict[str, Any]:
    """The hold record of ``proc`` once it stopped itself at its hold point."""
    marker = hold_dir / HOLD_FILE
    _wait(lambda: marker.exists() or not proc.is_alive(), 90, "the process to reach its hold point")
    assert marker.exists(), f"the process exited ({proc.exitcode}) before its hold point"
    _wait(lambda: _state(proc.pid) == "T", 10, "the process to stop")
    record: dict[str, Any] = json.loads(marker.read_text())
    assert record["pid"] == proc.pid
    return record


def _resume(proc: Any, out: Any) -> Any:
    """SIGCONT ``proc`` and return what it reports; it must exit cleanly, in bounded time."""
    os.kill(proc.pid, signal.SIGCONT)
    result = out.get(timeout=90)
    proc.join(timeout=60)
    assert proc.exitcode == 0, f"the resumed process exited with {proc.exitcode}"
    return result


def _ends_healthy(table: Table) -> None:
    """verify passes and the table takes a new write (the handle is fresh)."""
    report = table.verify()
    assert report.ok, (report.problem, report.detail)
    before = table.version
    rows = pa.table({"id": [-1], "worker": [-1], "batch": [-1]}, schema=SCHEMA)
    assert table.append(rows).version == before + 1


def _pause_after_claim(
    uri: str, slots: str, options: dict[str, Any] | None, tmp_path: Path, during_pause: Callable[[int], None]
) -> None:
    """The stale-claim-holder scenario on any slot store (see the module docstring)."""
    Table.create(uri, SCHEMA, slots=slots, storage_options=options).close()
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    out = SPAWN.Queue()
    victim = SPAWN.Process(target=paused_writer, args=(uri, 9, 3, out, slots, options, str(hold_dir)))
    victim.start()
    try:
        held = _held(victim, hold_dir)
        version = held["version"]
        log = LogStore(uri, storage_options=options)
        assert not log.commit_exists(version)  # claimed, not published
        during_pause(version)
        results = run_writers(uri, workers=3, ops=4, slots=slots, storage_options=options, timeout=120)
        # While it stayed stopped, the others published its claimed commit from its staged file.
        assert _state(victim.pid) == "T"
        with Table.open(uri, slots=slots, storage_options=options) as table:
            commit = table.history()
            landed = next(h for h in commit if h["version"] == version)
            assert landed["txnId"] == held["txn"]
        mine = _resume(victim, out)
    finally:
        if victim.is_alive():
            victim.kill()
            victim.join(timeout=10)
    # Acknowledged exactly once, at the version it claimed; then it went on writing.
    assert mine.acks[0]["version"] == version and mine.acks[0]["txn"] == held["txn"]
    assert len(mine.acks) == 3 and not mine.errors
    acks = [a for r in [*results, mine] for a in r.acks]
    assert len(acks) == 15
    table = check_invariants(uri, acks, slots=slots, storage_options=options)
    try:
        _ends_healthy(table)
    finally:
        table.close()


@pytest.mark.zookeeper
def test_a_writer_paused_past_its_zookeeper_session_after_its_claim(zk_chroot: str, tmp_path: Path) -> None:
    """The regression test of the ZooKeeper case: the session expires while the writer is
    stopped (its owner is seen gone), yet its claim stands and is acknowledged once."""
    slots = f"zk://{zk_chroot}?timeout=2"
    uri = str(tmp_path / "table")

    def session_expires(version: int) -> None:
        with Table.open(uri, slots=slots) as table:
            _wait(lambda: table.slots.owner_alive(table.key, version) is False, 30, "the session to expire")

    _pause_after_claim(uri, slots, None, tmp_path, session_expires)


def test_a_writer_paused_past_the_s3_lease_ttl_after_its_claim(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    """S3 conditional-write slots: a claim is a permanent object, not a lease, so a paused
    claimer's commit is published by the others and the resumed writer finds it in place."""
    slots = f"s3://{s3_bucket}/slots?lease_ttl=2"

    def outlast_the_ttl(version: int) -> None:
        time.sleep(3.5)  # longer than lease_ttl + the store's 1 s of clock slack

    _pause_after_claim(s3_uri, slots, s3_storage_options, tmp_path, outlast_the_ttl)


def test_a_streaming_query_paused_past_its_checkpoint_lease(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    slots = f"s3://{s3_bucket}/slots?lease_ttl=3"
    options = s3_storage_options
    checkpoint = str(tmp_path / "checkpoint")
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    query_id = str(uuid.uuid4())
    common = {"query_id": query_id, "checkpoint": checkpoint}
    out = SPAWN.Queue()
    first = SPAWN.Process(
        target=streaming_query,
        args=(s3_uri, slots, options),
        kwargs={**common, "run_id": "run-1", "app": "app-1", "batches": 5, "out": out,
                "hold_at": 2, "hold_dir": str(hold_dir)},
    )  # fmt: skip
    first.start()
    store = open_slot_store(slots, storage_options=options)
    second = None
    try:
        _held(first, hold_dir)
        assert finished_batches(checkpoint) == [0, 1]
        # Stopped, it stops beating: the lease is its own until the TTL runs out, then free.
        _wait(
            lambda: store.lease_owner(lease_name(checkpoint)) is None,
            30,
            "the paused query's lease to expire",
        )
        second = SPAWN.Process(
            target=streaming_query,
            args=(s3_uri, slots, options),
            kwargs={**common, "run_id": "run-2", "app": "app-2", "batches": 3, "out": out},
        )
        second.start()
        taker = out.get(timeout=90)
        second.join(timeout=60)
        assert second.exitcode == 0
        assert [b for b, _ in taker["committed"]] == [2, 3, 4] and taker["error"] is None
        assert _state(first.pid) == "T"
        paused = _resume(first, out)
    finally:
        for proc in (first, second):
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        release_slot_store(store)
    # The resumed query committed nothing more: the backstop refused its batch 2, typed.
    assert paused["committed"] == [(0, 0), (1, 1)]
    assert paused["error"] == {
        "type": "ConcurrentTransactionException",
        "error_class": "DELTA_CONCURRENT_TRANSACTION",
        "winning_version": 4,  # the taker's commit of batch 4: it went past this batch
        "batch": 2,
    }
    assert paused["held_after"] is False  # its lease was taken over while it was stopped
    _exactly_once(s3_uri, options, slots, query_id, batches=5)


def _exactly_once(uri: str, options: dict[str, Any], slots: str, query_id: str, *, batches: int) -> None:
    """Every batch committed once, in order, nothing else; then verify and a new write."""
    log = LogStore(uri, storage_options=options)
    versions = LogStore.commit_versions(log.list_log())
    assert versions == list(range(batches))
    with Table.open(uri, slots=slots, storage_options=options) as table:
        epochs = [int(h["operationParameters"]["epochId"]) for h in reversed(table.history())]
        assert epochs == list(range(batches))
        assert table.snapshot().txn_version(query_id) == batches - 1
        ids = table.to_arrow().column("id").to_pylist()
        assert sorted(ids) == [b * 100 + k for b in range(batches) for k in range(ROWS_PER_BATCH)]
        # The refused batch's files were deleted: only committed files remain.
        fs, root = log.fs, log.root
        data = {p[len(root) + 1 :] for p in fs.find(root) if "/_" not in p[len(root) :]}
        assert data == {a.path for a in table.snapshot().files.values()}
        report = table.verify()
        assert report.ok, (report.problem, report.detail)
        rows = pa.table({"id": [-1], "batch": [-1]}, schema=STREAM_SCHEMA)
        assert table.append(rows).version == batches
