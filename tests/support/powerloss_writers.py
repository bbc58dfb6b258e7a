"""Writer processes for the power-loss and slow-disk tests, and the checks of the image.

Each writer appends 3-row batches and deletes some of its own rows, and logs every
operation to its own file on the real disk (not on the mount), line by line: an
``attempt`` line before the commit (kind and ids), an ``ack`` line once ``commit()``
returned (version and txn id). A writer killed at the power loss leaves at most one
attempt without its ack: the commit in flight, which may or may not have landed.

Rows are the writer's own (ids ``worker * 1_000_000 + ...``), so each writer's rows in the
table must equal a replay of its acknowledged operations, or that replay plus its one
in-flight operation when that landed: :func:`check_durable_image` checks exactly that,
besides the invariants of :mod:`tests.support.invariants` (checked here directly).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pyarrow as pa

from eventlog import DeltaConcurrentModificationException, Table
from eventlog.log.commit import member_txn_ids
from eventlog.log.storage import LogStore
from tests.support.invariants import SCHEMA

ID_BASE = 1_000_000


def writer(uri: str, worker: int, seed: int, log_dir: str, durable: bool, start: Any, max_ops: int) -> None:
    """Append and delete until killed (or ``max_ops`` operations), logging each one."""
    rng = random.Random(seed)
    table = Table.open(uri, durable=durable)
    mine: list[list[int]] = []
    with (Path(log_dir) / f"{worker}.jsonl").open("a", buffering=1) as out:
        start.wait(60)
        for batch in range(max_ops):
            if mine and rng.random() < 0.3:
                ids = mine[rng.randrange(len(mine))]
                target = ids[:1] if rng.random() < 0.5 else ids
                out.write(json.dumps({"event": "attempt", "kind": "delete", "ids": target}) + "\n")
                while True:
                    try:
                        res = table.delete(f"id >= {min(target)} AND id <= {max(target)}")
                        break
                    except DeltaConcurrentModificationException:
                        continue
                mine.remove(ids)
                if ids[len(target) :]:
                    mine.append(ids[len(target) :])
                kind = "delete"
            else:
                target = [worker * ID_BASE + batch * 10 + k for k in range(3)]
                out.write(json.dumps({"event": "attempt", "kind": "append", "ids": target}) + "\n")
                data = pa.table({"id": target, "worker": [worker] * 3, "batch": [batch] * 3}, schema=SCHEMA)
                res = table.append(data)
                mine.append(target)
                kind = "append"
            ack = {"event": "ack", "kind": kind, "version": res.version, "txn": res.txn_id, "ids": target}
            out.write(json.dumps(ack) + "\n")


@dataclass
class WriterLog:
    """What one writer's file says: its acks, and its attempt without an ack (if any)."""

    worker: int
    acks: list[dict[str, Any]] = field(default_factory=list)
    in_flight: dict[str, Any] | None = None


def read_logs(log_dir: Path, workers: int) -> list[WriterLog]:
    logs = []
    for worker in range(workers):
        log = WriterLog(worker)
        path = log_dir / f"{worker}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:  # a line cut by the kill: its write never finished
                continue
            if event["event"] == "attempt":
                log.in_flight = event
            else:
                log.acks.append(event)
                log.in_flight = None
        logs.append(log)
    return logs


def all_acks(logs: list[WriterLog]) -> list[dict[str, Any]]:
    return [ack for log in logs for ack in log.acks]


class Writers:
    """``workers`` writer processes (spawned) on the table at ``uri``, logging to ``log_dir``."""

    def __init__(
        self, uri: str, workers: int, log_dir: Path, *, durable: bool, seed: int, max_ops: int = 100_000
    ) -> None:
        self.workers = workers
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        ctx = mp.get_context("spawn")
        start = self._start = ctx.Event()  # kept: the children unpickle it after start()
        self.procs: list[BaseProcess] = [
            ctx.Process(target=writer, args=(uri, w, seed * 100 + w, str(log_dir), durable, start, max_ops))
            for w in range(workers)
        ]
        for p in self.procs:
            p.start()
        start.set()

    def logs(self) -> list[WriterLog]:
        return read_logs(self.log_dir, self.workers)

    def wait_acks(self, count: int, timeout: float) -> list[dict[str, Any]]:
        """Wait until the writers acknowledged ``count`` commits in all; assert none died."""
        deadline = time.monotonic() + timeout
        while True:
            acks = all_acks(self.logs())
            if len(acks) >= count:
                return acks
            dead = [p.exitcode for p in self.procs if not p.is_alive()]
            assert not dead, f"a writer died before the power loss: exit codes {dead}"
            assert time.monotonic() < deadline, (
                f"only {len(acks)} of {count} commits acknowledged in {timeout}s"
            )
            time.sleep(0.02)

    def join(self, timeout: float) -> None:
        """Wait for writers that run to completion; assert each exited cleanly in time."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        assert all(p.exitcode == 0 for p in self.procs), [p.exitcode for p in self.procs]

    def kill(self) -> None:
        """SIGKILL every writer (the power is gone); bounded joins."""
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.join(timeout=30)
        assert not any(p.is_alive() for p in self.procs), "a writer outlived SIGKILL"


def worker_rows(table: Table) -> dict[int, set[int]]:
    rows: dict[int, set[int]] = {}
    for row_id in table.to_arrow(columns=["id"]).column("id").to_pylist():
        rows.setdefault(row_id // ID_BASE, set()).add(row_id)
    return rows


def _replay(ops: list[dict[str, Any]]) -> set[int]:
    rows: set[int] = set()
    for op in ops:
        if op["kind"] == "append":
            rows |= set(op["ids"])
        else:
            rows -= set(op["ids"])
    return rows


def check_durable_image(uri: str, logs: list[WriterLog]) -> Table:
    """The checks after a power loss in durable mode, on fresh handles: versions gapless;
    every acknowledged commit present exactly once, at its version; every other commit one
    that a writer had in flight (at most one per writer); each writer's rows equal to the
    replay of its acknowledged operations, plus its in-flight one exactly when that landed;
    ``verify`` passing; a new write accepted. (The shared ``check_invariants`` assumes
    that a commit landed without its ack only adds rows; here an in-flight delete may land.)"""
    table = Table.open(uri)  # a reader publishes claimed commits from their staged files
    versions = LogStore.commit_versions(table.log.list_log())
    assert versions == list(range(table.version + 1)), "versions are not gapless"
    carried = {h["version"]: member_txn_ids(h) for h in table.history()}
    landed = [txn for v, txns in carried.items() if v > 0 for txn in txns]
    assert len(landed) == len(set(landed)), "a commit landed twice"
    acks = all_acks(logs)
    for ack in acks:
        assert ack["txn"] in carried[ack["version"]], f"acknowledged commit missing: {ack}"
    unacknowledged = len(set(landed) - {ack["txn"] for ack in acks})
    assert unacknowledged <= sum(log.in_flight is not None for log in logs)
    got = table.to_arrow(columns=["id"]).column("id").to_pylist()
    assert len(got) == len(set(got)), "a row is duplicated"
    rows = worker_rows(table)
    applied = 0
    for log in logs:
        acked = _replay(log.acks)
        mine = rows.get(log.worker, set())
        if mine != acked:
            assert log.in_flight is not None, f"writer {log.worker}: rows differ from its acknowledged replay"
            assert mine == _replay([*log.acks, log.in_flight]), f"writer {log.worker}: rows torn"
            applied += 1
    assert applied == unacknowledged, "an unacknowledged commit landed that no writer had in flight"
    assert Table.open(uri).snapshot().files == table.snapshot().files
    return finish(uri)


def finish(uri: str) -> Table:
    """``verify`` passes and a new write is accepted, on a fresh handle."""
    fresh = Table.open(uri)
    report = fresh.verify()
    assert report.ok, report
    before = fresh.version
    extra = pa.table({"id": [-1], "worker": [-1], "batch": [-1]}, schema=SCHEMA)
    assert fresh.append(extra).version == before + 1
    assert -1 in fresh.to_arrow(columns=["id"]).column("id").to_pylist()
    assert LogStore.commit_versions(fresh.log.list_log()) == list(range(before + 2))
    return fresh
