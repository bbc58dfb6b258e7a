"""Writer and streaming-query processes that stop themselves at a chosen point, for the
process-pause fault tests (tests/faults/test_pauses.py).

A process "holds" by writing a marker file (JSON, atomically renamed into place) and then
sending itself SIGSTOP, so the stop lands exactly at the point under test: right after a
version claim was granted (before publishing it), or right before a streaming batch
commits (after every ownership check). The test resumes it with SIGCONT.

* :func:`paused_writer`: the writer of :mod:`tests.support.invariants`, with a hook that
  stops the process at its ``at_publish``-th publish of a claimed version.
* :func:`streaming_query`: an engine-neutral streaming query driven the way the Spark sink
  drives :mod:`streaming` (lease at start, owner checked at planning and before the commit,
  then :func:`streaming.sink.commit_batch`), with a deterministic source and a checkpoint
  directory whose ``commits/<batch>`` files say which batches the query finished.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from eventlog import ConcurrentTransactionException, Table
from eventlog.log.commitlog import Published, SlotsSpec
from streaming.batchfiles import abort_batch
from streaming.ownership import acquire_checkpoint, verify_checkpoint
from streaming.plan import SinkOptions
from streaming.sink import MicroBatchSink, commit_batch
from tests.support.invariants import writer

HOLD_FILE = "held.json"
STREAM_SCHEMA = pa.schema([("id", pa.int64()), ("batch", pa.int64())])
ROWS_PER_BATCH = 4


def hold(hold_dir: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``<hold_dir>/held.json`` (atomically), then stop this process."""
    target = Path(hold_dir) / HOLD_FILE
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({**record, "pid": os.getpid()}))
    tmp.rename(target)
    os.kill(os.getpid(), signal.SIGSTOP)


def stop_after_claim(hold_dir: str, at_publish: int) -> None:
    """Stop this process at its ``at_publish``-th publish of a claimed version: the claim is
    granted (the commit is decided) and nothing is published yet."""
    original: Callable[..., Published] = Table.publish_claimed
    calls = [0]

    def publish_claimed(self: Table, version: int, staged_name: str, data: bytes, txn_id: str) -> Published:
        calls[0] += 1
        if calls[0] == at_publish:
            hold(hold_dir, {"version": version, "txn": txn_id, "staged": staged_name})
        return original(self, version, staged_name, data, txn_id)

    Table.publish_claimed = publish_claimed  # type: ignore[method-assign]


def paused_writer(
    uri: str,
    worker: int,
    ops: int,
    out: Any,
    slots: SlotsSpec,
    storage_options: dict[str, Any] | None,
    hold_dir: str,
    at_publish: int = 1,
) -> None:
    """:func:`tests.support.invariants.writer`, stopped once right after a granted claim."""
    stop_after_claim(hold_dir, at_publish)
    writer(uri, worker, ops, 1000 + worker, out, slots, storage_options=storage_options)


# --------------------------------------------------------------------------- streaming


def batch_rows(batch: int) -> pa.Table:
    """The deterministic source's batch ``batch``: ids ``batch * 100 + k``."""
    ids = [batch * 100 + k for k in range(ROWS_PER_BATCH)]
    return pa.table({"id": ids, "batch": [batch] * ROWS_PER_BATCH}, schema=STREAM_SCHEMA)


def finished_batches(checkpoint: str) -> list[int]:
    """The batches the query's checkpoint records as committed (Spark's commit log)."""
    commits = Path(checkpoint) / "commits"
    return sorted(int(p.name) for p in commits.iterdir()) if commits.is_dir() else []


def _record_finished(checkpoint: str, batch: int) -> None:
    commits = Path(checkpoint) / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    (commits / str(batch)).write_text("{}")


def _acquire(
    store: Any, checkpoint: str, *, query_id: str, run_id: str, uri: str, app: str, wait: float
) -> Any:
    """The checkpoint's lease, retried while another live query holds it (up to ``wait`` s)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return acquire_checkpoint(
                store, checkpoint, query_id=query_id, run_id=run_id, table=uri, info={"app": app}
            )
        except ConcurrentTransactionException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def streaming_query(
    uri: str,
    slots: str,
    storage_options: dict[str, Any] | None,
    checkpoint: str,
    *,
    query_id: str,
    run_id: str,
    app: str,
    batches: int,
    out: Any,
    hold_at: int | None = None,
    hold_dir: str | None = None,
    lease_wait: float = 30.0,
) -> None:
    """Run ``batches`` micro-batches from the one after the checkpoint's last finished batch,
    holding the checkpoint's lease for the whole run (an engine whose driver process lives
    as long as the query). Stops itself right before committing batch ``hold_at``.

    Puts one dict on ``out``: ``committed`` [(batch, version or None)], and ``error`` (the
    typed outcome of a batch that failed: type, error class, winning version, batch) or None,
    and ``held_after`` (whether the lease was still held when the run ended).
    """
    from lockstore.registry import open_slot_store, release_slot_store

    store = open_slot_store(slots, storage_options=storage_options)
    sink = MicroBatchSink(
        uri,
        query_id=query_id,
        run_id=run_id,
        options=SinkOptions(slots=slots),
        storage_options=storage_options,
    )
    lease = _acquire(store, checkpoint, query_id=query_id, run_id=run_id, uri=uri, app=app, wait=lease_wait)
    committed: list[tuple[int, int | None]] = []
    error: dict[str, Any] | None = None
    start = max(finished_batches(checkpoint), default=-1) + 1
    try:
        for batch in range(start, start + batches):
            verify_checkpoint(store, checkpoint, app=app, table=uri)  # planning side
            data = batch_rows(batch)
            plan = sink.plan(data.schema)
            files = sink.write(plan, batch, data)
            verify_checkpoint(store, checkpoint, app=app, table=uri)  # commit side
            if batch == hold_at and hold_dir is not None:
                hold(hold_dir, {"batch": batch})
            try:
                result = commit_batch(plan, [files], query_id=query_id, run_id=run_id, batch_id=batch)
            except ConcurrentTransactionException as exc:
                abort_batch(sink.location, query_id=query_id, batch_id=batch, files=[files], slots=slots)
                error = {
                    "type": type(exc).__name__,
                    "error_class": exc.error_class,
                    "winning_version": exc.winning_version,
                    "batch": batch,
                }
                break
            _record_finished(checkpoint, batch)
            committed.append((batch, result.version))
        out.put({"committed": committed, "error": error, "held_after": lease.held, "pid": os.getpid()})
    finally:
        lease.release()
        release_slot_store(store)
