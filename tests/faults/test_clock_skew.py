"""Clock skew (issue 28): writer processes whose wall clock runs hours ahead or behind
(libfaketime, :func:`tests.faults.skew_writer.skewed_env`), interleaved with writers on the
true clock. Storage timestamps (file modification times, S3's LastModified) stay true: the
kernel and the S3 server stamp them.

What each test holds the engine to:

* commit timestamps: with in-commit timestamps every commit is dated after the one before
  it whatever its writer's clock says, and time travel by timestamp resolves each version's
  timestamp to that version; without them a commit carries its writer's clock (documented,
  with the known consequence for time travel as a strict expected failure);
* VACUUM run on a clock hours ahead deletes nothing still within the retention by the
  storage's clock, and a file removed by a writer whose clock runs behind stays for the
  retention too;
* log cleanup run on a clock hours ahead deletes only log files expired by the storage's
  clock;
* S3-slot leases, judged on the S3 server's clock: a live holder's lease is never taken
  whatever the holder's or the contender's clock, and a dead holder's lease is free within
  the TTL (plus the store's slack).

Every test ends with the checks of issue 28: gapless versions, every acknowledged commit
once, the contents the acknowledged writes give, ``verify``, and a new write.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog import Table
from eventlog.errors import VersionNotFoundError
from eventlog.log.storage import LogStore
from tests.faults.skew_writer import REPO, SCHEMA, read_json_line, skewed_env

pytestmark = pytest.mark.timeout(180)

HOUR_MS = 3_600_000
AHEAD, BEHIND = "+3h", "-3h"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _run(spec: dict[str, Any], offset: str | None, timeout: float = 60) -> dict[str, Any]:
    """Run one operation in a writer process with its clock ``offset`` off; its report."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.skew_writer", json.dumps(spec)],
        env=skewed_env(offset),
        cwd=REPO,
        capture_output=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    skew = {None: 0, AHEAD: 3 * HOUR_MS, BEHIND: -3 * HOUR_MS}[offset]
    assert abs(report["clock_ms"] - _now_ms() - skew) < 60_000, "the writer's clock is not skewed as asked"
    return report


def _append(uri: str, ids: list[int], offset: str | None, acks: list[dict[str, Any]]) -> int:
    report = _run({"op": "append", "uri": uri, "ids": ids}, offset)
    acks.append({"kind": "append", "version": report["version"], "txn": report["txn"], "ids": ids})
    return int(report["version"])


def _ends_healthy(uri: str, acks: list[dict[str, Any]], expected: set[int], **open_kw: Any) -> None:
    """Gapless versions from the oldest kept, each acknowledged commit once at its version,
    the expected rows, verify, and a new write (a fresh handle)."""
    log = LogStore(uri, storage_options=open_kw.get("storage_options"))
    versions = LogStore.commit_versions(log.list_log())
    assert versions == list(range(versions[0], versions[0] + len(versions)))
    with Table.open(uri, **open_kw) as table:
        txns = {h["version"]: h.get("txnId") for h in table.history()}
        for ack in acks:
            if ack["version"] >= versions[0]:
                assert txns[ack["version"]] == ack["txn"], f"acknowledged commit missing: {ack}"
        assert len({a["txn"] for a in acks}) == len(acks)
        ids = table.to_arrow().column("id").to_pylist()
        assert sorted(ids) == sorted(expected)
        report = table.verify()
        assert report.ok, (report.problem, report.detail)
        before = table.version
        assert table.append(pa.table({"id": [-1]}, schema=SCHEMA)).version == before + 1


# --------------------------------------------------------------------------- commit timestamps


def test_in_commit_timestamps_stay_monotonic_and_time_travel_follows_them(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    Table.create(uri, SCHEMA, properties={"delta.enableInCommitTimestamps": "true"}).close()
    acks: list[dict[str, Any]] = []
    offsets = [None, AHEAD, None, BEHIND, BEHIND, None]
    started = _now_ms()
    for i, offset in enumerate(offsets):
        _append(uri, [i], offset, acks)
    with Table.open(uri) as table:
        history = {h["version"]: h for h in table.history()}
        stamps = [history[v]["inCommitTimestamp"] for v in range(len(offsets) + 1)]
        assert all(history[v]["timestamp"] == stamps[v] for v in history)
        assert all(a < b for a, b in itertools.pairwise(stamps)), stamps
        # The writer ahead dated its commit by its own clock; every commit after it (true or
        # slow clocks, all behind it) is dated one millisecond after the one before.
        ahead = acks[1]["version"]
        assert stamps[ahead] - started > 3 * HOUR_MS - 60_000
        assert all(stamps[v] == stamps[v - 1] + 1 for v in range(ahead + 1, len(stamps)))
        # Time travel follows the in-commit timestamps exactly, across the skewed commits.
        for version, ts in enumerate(stamps):
            assert table.version_at(ts) == version
            if version > 0:
                assert table.version_at(ts - 1) == version - 1
            got = table.to_arrow(timestamp=ts).column("id").to_pylist()
            assert sorted(got) == list(range(version))
    _ends_healthy(uri, acks, set(range(len(offsets))))


def test_without_in_commit_timestamps_each_commit_carries_its_writers_clock(tmp_path: Path) -> None:
    """commitInfo.timestamp is the writer's clock (Delta's too); the file modification
    times stay true, and history and time travel date versions by them, as Delta does."""
    uri = str(tmp_path / "table")
    Table.create(uri, SCHEMA).close()
    acks: list[dict[str, Any]] = []
    before = _now_ms()
    for i, offset in enumerate([AHEAD, BEHIND, None]):
        _append(uri, [i], offset, acks)
    after = _now_ms()
    log = LogStore(uri)
    with Table.open(uri) as table:
        written = {v: json.loads((log.read_commit(v) or b"").split(b"\n", 1)[0]) for v in (1, 2, 3)}
        stamped = {v: c["commitInfo"]["timestamp"] for v, c in written.items()}
        assert stamped[1] > after + 3 * HOUR_MS - 60_000  # ahead
        assert stamped[2] < before - 3 * HOUR_MS + 60_000  # behind
        assert before <= stamped[3] <= after
        dated = {h["version"]: h["timestamp"] for h in table.history()}
        for version in (1, 2, 3):
            mtime = log.commit_mtime_ms(version)
            assert mtime is not None and before - 2_000 <= mtime <= after + 2_000
            assert before - 2_000 <= dated[version] <= after + 2_000
        assert dated[1] < dated[2] < dated[3]
    _ends_healthy(uri, acks, {0, 1, 2})


def test_without_in_commit_timestamps_time_travel_ignores_a_skewed_writer(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    Table.create(uri, SCHEMA).close()
    acks: list[dict[str, Any]] = []
    _append(uri, [0], AHEAD, acks)
    _append(uri, [1], None, acks)
    time.sleep(0.05)
    with Table.open(uri) as table:
        # Dated by the files' modification times, as the protocol and Delta Spark do: the
        # commit of the writer 3 h ahead is dated when the storage wrote it.
        written = json.loads((LogStore(uri).read_commit(1) or b"").split(b"\n", 1)[0])
        assert written["commitInfo"]["timestamp"] > _now_ms() + HOUR_MS  # its commitInfo: 3 h ahead
        assert table.version_at(_now_ms()) == 2
        first = LogStore(uri).commit_mtime_ms(1)
        assert first is not None and table.version_at(first) == 1
        assert sorted(table.to_arrow(timestamp=first).column("id").to_pylist()) == [0]


# --------------------------------------------------------------------------- VACUUM


def _data_files(uri: str) -> set[str]:
    return {p.name for p in Path(uri).glob("*.parquet")}


def _orphan(uri: str, name: str, age_hours: float) -> None:
    """A data file no commit references (a writer in flight, or one that died)."""
    path = Path(uri) / name
    pq.write_table(pa.table({"id": [99]}, schema=SCHEMA), path)
    stamp = time.time() - age_hours * 3600
    os.utime(path, (stamp, stamp))


def test_vacuum_on_a_clock_ahead_keeps_what_the_retention_keeps(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    props = {"delta.deletedFileRetentionDuration": "interval 1 hours"}
    Table.create(uri, SCHEMA, properties=props).close()
    acks: list[dict[str, Any]] = []
    _append(uri, [1], None, acks)
    _append(uri, [2], None, acks)
    with Table.open(uri) as table:
        first = {a.path for a in table.snapshot().files.values()}
        res = table.delete("id = 1")  # its file is now a tombstone, within the retention
        acks.append({"kind": "delete", "version": res.version, "txn": res.txn_id, "ids": [1]})
    _orphan(uri, "part-in-flight.parquet", 0)  # written by a writer that has not committed yet
    _orphan(uri, "part-abandoned.parquet", 2)  # older than the retention: VACUUM's to delete
    report = _run({"op": "vacuum", "uri": uri}, AHEAD)
    assert [Path(p).name for p in report["deleted"]] == ["part-abandoned.parquet"]
    assert first <= _data_files(uri) and "part-in-flight.parquet" in _data_files(uri)
    with Table.open(uri) as table:
        assert sorted(table.to_arrow(version=2).column("id").to_pylist()) == [1, 2]
    # A remove written by a writer whose clock runs behind is within the retention too, even
    # for a file written long before (its own age does not keep it).
    with Table.open(uri) as table:
        (second,) = [a.path for a in table.snapshot().files.values()]
    old = time.time() - 2 * 3600
    os.utime(Path(uri) / second, (old, old))
    report = _run({"op": "delete", "uri": uri, "predicate": "id = 2"}, BEHIND)
    acks.append({"kind": "delete", "version": report["version"], "txn": report["txn"], "ids": [2]})
    assert _run({"op": "vacuum", "uri": uri}, None)["deleted"] == []
    with Table.open(uri) as table:
        assert table.to_arrow(version=3).column("id").to_pylist() == [2]
    (Path(uri) / "part-in-flight.parquet").unlink()  # its writer gave up
    _ends_healthy(uri, acks, set())


# --------------------------------------------------------------------------- log cleanup


def test_log_cleanup_on_a_clock_ahead_deletes_only_expired_commits(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    props = {
        "delta.logRetentionDuration": "interval 1 hours",
        "eventlog.auditRetentionDuration": "interval 1 hours",
    }
    Table.create(uri, SCHEMA, properties=props).close()
    acks: list[dict[str, Any]] = []
    with Table.open(uri) as table:
        for i in range(4):
            res = table.append(pa.table({"id": [i]}, schema=SCHEMA))
            acks.append({"kind": "append", "version": res.version, "txn": res.txn_id, "ids": [i]})
    log = LogStore(uri)
    stamp = time.time() - 2 * 3600
    for version in (0, 1):  # written two hours ago by the storage's clock: expired
        os.utime(log.commit_path(version), (stamp, stamp))
    assert _run({"op": "checkpoint", "uri": uri}, AHEAD)["checkpoint"] == 4
    assert LogStore.commit_versions(log.list_log()) == [2, 3, 4]
    with Table.open(uri) as table:
        assert [h["version"] for h in table.history()] == [4, 3, 2]
        with pytest.raises(VersionNotFoundError):  # expired by the storage's clock: gone
            table.to_arrow(version=1)
    _ends_healthy(uri, acks, {0, 1, 2, 3})


# --------------------------------------------------------------------------- S3-slot leases


@pytest.mark.parametrize(("holder", "contender"), [(AHEAD, BEHIND), (BEHIND, AHEAD)])
def test_s3_slot_leases_are_judged_on_the_servers_clock(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], holder: str, contender: str
) -> None:
    ttl = 3.0
    slots = f"s3://{s3_bucket}/slots?lease_ttl={ttl:g}"
    spec = {"slots": slots, "storage_options": s3_storage_options, "name": "checkpoint-under-skew"}

    def start(op: dict[str, Any], offset: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.skew_writer", json.dumps({**spec, **op})],
            env=skewed_env(offset),
            cwd=REPO,
            stdout=subprocess.PIPE,
        )

    owner = start({"op": "hold_lease"}, holder)
    rival = None
    try:
        assert read_json_line(owner, 60)["held"] is True
        rival = start({"op": "acquire_lease", "wait": 40}, contender)
        time.sleep(2 * ttl + 1)  # the holder beats: its lease stays its own, whatever the clocks
        assert rival.poll() is None, "the lease was taken from a live holder"
        os.kill(owner.pid, signal.SIGKILL)  # dies without releasing: the TTL frees it
        killed = time.monotonic()
        won = read_json_line(rival, 45)
        assert won["won"] is True and won["refused"] >= 3
        # Free within the TTL plus the store's second of slack (and S3's whole seconds).
        assert killed < won["at_monotonic"] < killed + ttl + 4
        assert rival.wait(timeout=30) == 0
    finally:
        for proc in (owner, rival):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.wait(timeout=10)
                assert proc.stdout is not None
                proc.stdout.close()
    Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options).close()
    acks: list[dict[str, Any]] = []
    report = _run(
        {"op": "append", "uri": s3_uri, "ids": [7], "slots": slots, "storage_options": s3_storage_options},
        contender,
    )
    acks.append({"kind": "append", "version": report["version"], "txn": report["txn"], "ids": [7]})
    _ends_healthy(s3_uri, acks, {7}, slots=slots, storage_options=s3_storage_options)
