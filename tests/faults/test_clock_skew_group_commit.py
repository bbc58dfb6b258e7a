"""Clock skew under group commit (issue 28): writer processes whose wall clock runs 3 h ahead
or behind (libfaketime, :func:`tests.faults.skew_writer.skewed_env`) queue blind appends
beside writers on the true clock (``Table.open(uri, group_commit=True)``).

Group commit orders the queued appends and ignores stale ones (a dead writer's) by when the
storage stamped their queued files, never by the clock of the writer that queued them
(:mod:`eventlog.txn.groupcommit`). What each test holds the engine to:

* a queued append is carried by the next leader whatever either one's clock says (a leader
  3 h ahead saw every other file as stale; a file queued 3 h behind looked stale to all);
* the queued append of a writer that died on a clock 3 h ahead is no longer carried once it
  is stale by the storage's clock: its retry after looking its txn id up lands once;
* writers on three clocks appending and deleting together keep the invariants, no writer
  hangs.

Every test ends with the checks of issue 28: the invariants (gapless versions, every
acknowledged commit once, the contents the acknowledged operations give), ``verify`` and a
new write, with a fresh handle.

The writer processes run this module's :func:`child` (``python -c`` importing
:mod:`tests.faults.skew_writer` first, which replaces ``time.sleep`` under libfaketime).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.log.commit import member_txn_ids
from eventlog.log.storage import LogStore
from eventlog.txn import groupcommit
from eventlog.txn.groupcommit import QueuedName
from tests.faults.skew_writer import REPO, read_json_line, skewed_env
from tests.support.invariants import SCHEMA, check_invariants, writer

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3_600_000
AHEAD, BEHIND = "+3h", "-3h"
_SKEW_MS = {None: 0, AHEAD: 3 * HOUR_MS, BEHIND: -3 * HOUR_MS}


# --------------------------------------------------------------------------- writer processes


def _clock_ms() -> int:
    return int(time.time() * 1000)


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({**record, "clock_ms": _clock_ms()}) + "\n")
    sys.stdout.flush()


def wait_for(path: str, timeout: float) -> None:
    """Until ``path`` exists (a gate the test opens); exits the process after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"gate {path} not opened within {timeout:g} s")
        time.sleep(0.005)


class _Gate:
    """``start`` of :func:`tests.support.invariants.writer` across processes: a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def wait(self) -> None:
        wait_for(self.path, 60)


class _Printer:
    """``out`` of :func:`tests.support.invariants.writer`: its result as a JSON line."""

    def put(self, result: Any) -> None:
        emit({"result": dataclasses.asdict(result)})


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "worker": [0] * len(ids), "batch": [0] * len(ids)}, schema=SCHEMA)


def child(spec: dict[str, Any]) -> None:
    """One writer process: ``writer`` (the invariants' writer, group commit, started by the
    ``gate`` file), ``append`` (one group-commit append) or ``held_append`` (one group-commit
    append held right after it queued its file, reported as ``queued``, until ``gate``
    exists)."""
    op, uri = spec["op"], spec["uri"]
    if op == "writer":
        writer(
            uri,
            spec["worker"],
            spec["ops"],
            spec["seed"],
            _Printer(),
            start=_Gate(spec["gate"]),
            delete_share=0.2,
            group_commit=True,
        )
        return
    if op == "held_append":
        held_append(spec, emit)
        return
    with Table.open(uri, group_commit=True, **_where(spec)) as table:
        result = table.append(_rows(spec["ids"]))
        emit({"version": result.version, "txn": result.txn_id})


def held_append(spec: dict[str, Any], report: Callable[[dict[str, Any]], None]) -> None:
    """One group-commit append of ``ids``, held right after it queued its file (reported as
    ``queued``) until the ``gate`` file exists; then its outcome is reported."""
    with Table.open(spec["uri"], group_commit=True, **_where(spec)) as table:
        original = table.log.stage

        def stage_then_hold(name: str, data: bytes, *, atomic: bool = False) -> None:
            original(name, data, atomic=atomic)
            if QueuedName.parse(name) is not None:
                report({"queued": name})
                wait_for(spec["gate"], 60)

        table.log.stage = stage_then_hold  # type: ignore[method-assign]
        result = table.append(_rows(spec["ids"]))
        report({"version": result.version, "txn": result.txn_id})


def _where(spec: dict[str, Any]) -> dict[str, Any]:
    """The open arguments a spec names: ``slots`` and ``storage_options`` (S3)."""
    return {k: spec[k] for k in ("slots", "storage_options") if k in spec}


def start_child(module: str, spec: dict[str, Any], offset: str | None) -> subprocess.Popen[bytes]:
    """A process running ``module``'s ``child(spec)`` with its clock ``offset`` off (after
    :mod:`tests.faults.skew_writer` replaced ``time.sleep``); its reports on stdout."""
    code = "import json, sys, tests.faults.skew_writer; from {} import child; child(json.loads(sys.argv[1]))"
    return subprocess.Popen(
        [sys.executable, "-c", code.format(module), json.dumps(spec)],
        env=skewed_env(offset),
        cwd=REPO,
        stdout=subprocess.PIPE,
    )


def read_report(proc: subprocess.Popen[bytes], offset: str | None, timeout: float) -> dict[str, Any]:
    """The next JSON line ``proc`` prints (bounded); checks that its clock is ``offset`` off."""
    report = read_json_line(proc, timeout)
    assert abs(report["clock_ms"] - _clock_ms() - _SKEW_MS[offset]) < 60_000, "the clock is not skewed"
    return report


def finish(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill what still runs (a failed test), reap, close the pipes."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def _ends_healthy(uri: str, acks: list[dict[str, Any]], **where: Any) -> None:
    """The invariants, verify and a new write, with fresh handles."""
    table = check_invariants(uri, acks, **where)
    report = table.verify()
    assert report.ok, (report.problem, report.detail)
    with Table.open(uri, group_commit=True, **where) as fresh:
        before = fresh.version
        assert fresh.append(_rows([-1])).version == before + 1


def _ack(report: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    return {"kind": "append", "version": report["version"], "txn": report["txn"], "ids": ids}


def _queued(uri: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    log = LogStore(uri, storage_options=storage_options)
    return sorted(n for n in log.list_staged() if QueuedName.parse(n) is not None)


@pytest.fixture
def uri(tmp_path: Path) -> Iterator[str]:
    location = str(tmp_path / "table")
    Table.create(location, SCHEMA).close()
    yield location


# --------------------------------------------------------------------------- the tests


class _Held:
    """The held writer of :func:`held_append`: a process on clock ``offset``, or (None) a
    thread of this process (one process fewer to start)."""

    def __init__(self, spec: dict[str, Any], offset: str | None) -> None:
        self.offset = offset
        self.proc: subprocess.Popen[bytes] | None = None
        self.reports: queue.Queue[dict[str, Any]] = queue.Queue()
        self.thread = threading.Thread(target=held_append, args=(spec, self.reports.put), daemon=True)
        if offset is None:
            self.thread.start()
        else:
            self.proc = start_child(__name__, spec, offset)

    def report(self, timeout: float) -> dict[str, Any]:
        if self.proc is not None:
            return read_report(self.proc, self.offset, timeout)
        return self.reports.get(timeout=timeout)

    def end(self) -> None:
        """Ended by itself, bounded: the process with 0, the thread at all."""
        if self.proc is not None:
            assert self.proc.wait(timeout=30) == 0
        else:
            self.thread.join(timeout=30)
            assert not self.thread.is_alive(), "the held writer hung"

    def close(self) -> None:
        if self.proc is not None:
            finish([self.proc])


def _append_on(offset: str | None, uri: str, ids: list[int], **where: Any) -> dict[str, Any]:
    """One group-commit append on clock ``offset`` (None: in this process); its report."""
    if offset is None:
        with Table.open(uri, group_commit=True, **where) as table:
            result = table.append(_rows(ids))
        return {"version": result.version, "txn": result.txn_id}
    proc = start_child(__name__, {"op": "append", "uri": uri, "ids": ids, **where}, offset)
    try:
        report = read_report(proc, offset, 60)
        assert proc.wait(timeout=30) == 0
    finally:
        finish([proc])
    return report


def _carried_while_held(
    uri: str, gate: str, queued: str | None, leader: str | None, **where: Any
) -> list[dict[str, Any]]:
    """A writer on clock ``queued`` is held right after queuing its append; a writer on
    clock ``leader`` appends, leads and must carry it: one version, both acknowledged there.
    The acknowledgements, leader first."""
    held = _Held({"op": "held_append", "uri": uri, "ids": [1], "gate": gate, **where}, queued)
    storage_options = where.get("storage_options")
    try:
        name = held.report(60)["queued"]
        assert _queued(uri, storage_options) == [name]
        led = _append_on(leader, uri, [2], **where)
        assert led["version"] == 1
        assert _queued(uri, storage_options) == []  # carried: the leader deleted the member's file
        Path(gate).touch()
        carried = held.report(60)
        assert carried["version"] == 1, "the queued append was left to commit on its own"
        held.end()
    finally:
        Path(gate).touch()
        held.close()
    with Table.open(uri, **where) as table:
        assert sorted(member_txn_ids(table.history(1)[0])) == sorted([led["txn"], carried["txn"]])
    return [_ack(led, [2]), _ack(carried, [1])]


@pytest.mark.parametrize(
    ("queued", "leader"),
    [(BEHIND, None), (None, AHEAD)],
    ids=["queued-behind", "leader-ahead"],
)
def test_a_queued_append_is_carried_whatever_the_clocks(
    uri: str, tmp_path: Path, queued: str | None, leader: str | None
) -> None:
    acks = _carried_while_held(uri, str(tmp_path / "gate"), queued, leader)
    _ends_healthy(uri, acks)


def test_on_s3_a_queued_append_is_carried_whatever_the_clocks(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    """The same on S3, whose LastModified has whole seconds (ties ordered by the name)."""
    where = {"slots": f"s3://{s3_bucket}/slots", "storage_options": s3_storage_options}
    Table.create(s3_uri, SCHEMA, **where).close()
    acks = _carried_while_held(s3_uri, str(tmp_path / "gate"), None, AHEAD, **where)
    _ends_healthy(s3_uri, acks, **where)


def test_a_dead_writers_append_is_not_carried_once_stale_by_the_storages_clock(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer 3 h ahead dies while queued. Once its queued file is stale by the storage's
    clock, no leader carries it (its name says it was queued 3 h from now): the append its
    application retries, after not finding the txn id in the history, lands exactly once."""
    monkeypatch.setattr(groupcommit, "STALE_SECONDS", 1.0)  # 30 s in production
    gate = str(tmp_path / "gate")  # never opened: the writer dies held
    dead = start_child(__name__, {"op": "held_append", "uri": uri, "ids": [1, 2], "gate": gate}, AHEAD)
    try:
        name = read_report(dead, AHEAD, 60)["queued"]
        os.kill(dead.pid, signal.SIGKILL)
        assert dead.wait(timeout=10) == -signal.SIGKILL
    finally:
        finish([dead])
    parsed = QueuedName.parse(name)
    assert parsed is not None and parsed.enqueued_ns > time.time_ns() + 2 * HOUR_MS * 1_000_000
    time.sleep(1.5)  # past the (shortened) staleness horizon, by every clock but the dead one's
    with Table.open(uri) as table:
        assert parsed.txn_id not in {t for h in table.history() for t in member_txn_ids(h)}
    acks = []
    with Table.open(uri, group_commit=True) as table:
        retried = table.append(_rows([1, 2]))  # the application's retry
        acks.append({"kind": "append", "version": retried.version, "txn": retried.txn_id, "ids": [1, 2]})
        other = table.append(_rows([3]))
        acks.append({"kind": "append", "version": other.version, "txn": other.txn_id, "ids": [3]})
    with Table.open(uri) as table:
        landed = [t for h in table.history() for t in member_txn_ids(h)]
        assert parsed.txn_id not in landed, "the dead writer's stale append was carried"
        assert sorted(table.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert _queued(uri) == [name]  # left for VACUUM, never carried
    _ends_healthy(uri, acks)


@pytest.mark.timeout(150)
def test_writers_on_three_clocks_keep_the_invariants(uri: str, tmp_path: Path) -> None:
    """Two writers on the true clock, one 3 h ahead, one 3 h behind: group-commit appends
    and deletes of their own rows, started together."""
    gate = str(tmp_path / "gate")
    offsets = [None, AHEAD, BEHIND, None]
    procs = [
        start_child(
            __name__,
            {"op": "writer", "uri": uri, "worker": w, "ops": 8, "seed": 2800 + w, "gate": gate},
            offset,
        )
        for w, offset in enumerate(offsets)
    ]
    try:
        time.sleep(0.5)
        Path(gate).touch()
        results = [
            read_report(proc, offset, 100)["result"] for proc, offset in zip(procs, offsets, strict=True)
        ]
        assert all(proc.wait(timeout=30) == 0 for proc in procs), "a writer did not end"
    finally:
        Path(gate).touch()
        finish(procs)
    assert all(not r["errors"] for r in results)
    acks = [ack for r in results for ack in r["acks"]]
    assert sum(a["kind"] == "append" for a in acks) >= 4 * 8 // 2
    _ends_healthy(uri, acks)
