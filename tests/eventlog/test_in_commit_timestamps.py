"""In-commit timestamps (``delta.enableInCommitTimestamps``): every commit dates itself in its
first action, monotonically, and time travel and history read those dates instead of file
modification times (PROTOCOL.md, "In-Commit Timestamps")."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventlog import InvalidTablePropertyError, Table, VersionNotFoundError
from eventlog.errors import InvalidInputError
from eventlog.log import in_commit_timestamps as ict
from eventlog.log import recovery
from eventlog.log.commit import member_txn_ids
from eventlog.log.storage import LogStore
from eventlog.snapshot.features import FEATURES, Support
from lockstore import EmbeddedSlotStore, SlotClaim
from tests.conftest import SCHEMA, rows, sorted_ids
from tests.eventlog.txn.test_retry_and_errors import FlakySlots
from tests.support.invariants import commit_concurrently, hold_until_queued

ON = {ict.ENABLE_KEY: "true"}
BASE = 1_800_000_000_000  # a wall clock in ms (2027)


def first_info(uri: str, version: int) -> dict[str, Any]:
    """The first action of commit ``version``, which must be its commitInfo."""
    first = orjson.loads(Path(uri, "_delta_log", f"{version:020d}.json").read_bytes().split(b"\n")[0])
    assert list(first) == ["commitInfo"], f"commit {version} does not start with commitInfo"
    info: dict[str, Any] = first["commitInfo"]
    return info


def icts(uri: str, versions: range) -> list[int | None]:
    return [first_info(uri, v).get("inCommitTimestamp") for v in versions]


def set_mtime(uri: str, version: int, ms: int) -> None:
    os.utime(Path(uri, "_delta_log", f"{version:020d}.json"), (ms / 1000, ms / 1000))


class Clock:
    """The writers' wall clock, set by the test (``ict.wall_clock_ms``)."""

    def __init__(self, now: int) -> None:
        self.now = now
        self.reads: list[int] = []

    def __call__(self) -> int:
        self.reads.append(self.now)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    fake = Clock(BASE)
    monkeypatch.setattr(ict, "wall_clock_ms", fake)
    yield fake


# --------------------------------------------------------------------------- writers


def test_enabled_at_create_every_commit_leads_with_its_timestamp(local_uri: str) -> None:
    assert FEATURES["inCommitTimestamp"].write is Support.FULL
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1]))
    t.delete("id = 1")
    stamped = icts(local_uri, range(3))
    assert all(isinstance(s, int) for s in stamped)
    assert stamped == sorted(set(stamped))  # strictly increasing
    # commitInfo.timestamp is the same value, so our history and Delta's agree.
    assert [first_info(local_uri, v)["timestamp"] for v in range(3)] == stamped
    protocol = t.refresh().protocol
    assert protocol.min_writer_version == 7 and "inCommitTimestamp" in (protocol.writer_features or ())
    # On from the start: no enablement record.
    assert ict.ENABLEMENT_VERSION_KEY not in t.properties


def test_enabling_later_records_where_timestamps_begin(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    assert t.set_properties(ON).version == 2
    t.append(rows([2]))
    assert icts(local_uri, range(2)) == [None, None]
    enabled_at, after = icts(local_uri, range(2, 4))
    assert enabled_at is not None and after is not None and after > enabled_at
    props = t.properties
    assert props[ict.ENABLEMENT_VERSION_KEY] == "2"
    assert props[ict.ENABLEMENT_TIMESTAMP_KEY] == str(enabled_at)
    # The enabling commit is dated after the previous commit's file.
    assert enabled_at > (LogStore(local_uri).commit_mtime_ms(1) or 0)
    assert "inCommitTimestamp" in (t.refresh().protocol.writer_features or ())
    # A later metadata change keeps the record.
    t.set_properties({"delta.appendOnly": "false"})
    assert t.properties[ict.ENABLEMENT_VERSION_KEY] == "2"


def test_enablement_properties_are_not_user_settable(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    with pytest.raises(InvalidTablePropertyError):
        t.set_properties({ict.ENABLE_KEY: "yes"})
    with pytest.raises(InvalidInputError):
        t.set_properties({ict.ENABLEMENT_VERSION_KEY: "0"})
    assert t.version == 0


def test_a_clock_that_goes_back_cannot_date_a_commit_before_the_last(local_uri: str, clock: Clock) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1]))
    clock.now = BASE - 3_600_000  # an hour behind: a skewed writer
    t.append(rows([2]))
    t.append(rows([3]))
    clock.now = BASE + 60_000  # ahead again
    t.append(rows([4]))
    assert icts(local_uri, range(5)) == [BASE, BASE + 1, BASE + 2, BASE + 3, BASE + 60_000]


def test_timestamp_is_fixed_while_retrying_a_version(local_uri: str, clock: Clock) -> None:
    """Claims refused with no winner to rebase on: the commit stays at its version, and at
    the timestamp taken when it was first staged there."""
    t = Table.create(local_uri, SCHEMA, slots=FlakySlots(refusals=2), properties=ON)
    clock.reads.clear()
    clock.now = BASE + 1000
    result = t.append(rows([1]))
    assert (result.version, result.attempts) == (1, 3)
    assert clock.reads == [BASE + 1000]  # read once, at the first staging
    assert icts(local_uri, range(1, 2)) == [BASE + 1000]


def test_rebase_over_a_winner_takes_the_timestamp_again(local_uri: str, clock: Clock) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    loser = Table.open(local_uri).transaction()
    loser.append(rows([1]))  # read version 0
    clock.now = BASE + 5000
    assert Table.open(local_uri).append(rows([2])).version == 1
    clock.now = BASE + 10  # the loser's clock is behind the winner's
    result = loser.commit()
    assert (result.version, result.attempts) == (2, 2)
    assert icts(local_uri, range(3)) == [BASE, BASE + 5000, BASE + 5001]
    assert sorted_ids(t) == [1, 2]


def test_a_write_in_flight_when_timestamps_are_enabled_commits_after_with_one(
    local_uri: str, clock: Clock
) -> None:
    """Enabling in-commit timestamps is on Delta's allow-list: a concurrent write is rebased,
    not failed, and carries a timestamp after the enabling commit's."""
    Table.create(local_uri, SCHEMA)
    loser = Table.open(local_uri).transaction()
    loser.delete("id = 1")  # read the whole table at version 0
    clock.now = BASE + 5000
    assert Table.open(local_uri).set_properties(ON).version == 1
    clock.now = BASE  # the loser's clock is behind
    result = loser.commit()
    assert (result.version, result.attempts) == (2, 2)
    assert icts(local_uri, range(3)) == [None, BASE + 5000, BASE + 5001]
    assert Table.open(local_uri).properties[ict.ENABLEMENT_VERSION_KEY] == "1"


def test_group_commit_dates_the_combined_commit(local_uri: str, clock: Clock, monkeypatch: Any) -> None:
    Table.create(local_uri, SCHEMA, properties=ON)
    txns = []
    for ids in ([1], [2, 3]):
        txn = Table.open(local_uri, group_commit=True).transaction()
        txn.append(rows(ids))
        txns.append(txn)
    hold_until_queued(monkeypatch, 2)
    clock.now = BASE - 50  # behind version 0's timestamp
    results = commit_concurrently(txns)
    assert [getattr(r, "version", r) for r in results] == [1, 1]
    info = first_info(local_uri, 1)
    assert sorted(member_txn_ids(info)) == sorted(t.txn_id for t in txns)
    assert info["inCommitTimestamp"] == info["timestamp"] == BASE + 1


def _append_worker(uri: str, worker: int, ops: int, start: Any, out: Any) -> None:
    table = Table.open(uri)
    start.wait(timeout=60)
    acks = [(table.append(rows([worker * 1000 + i])).version) for i in range(ops)]
    table.close()
    out.put(acks)


def test_two_processes_keep_timestamps_monotonic_and_versions_gapless(local_uri: str) -> None:
    ops = 12
    Table.create(local_uri, SCHEMA, properties=ON).close()
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_append_worker, args=(local_uri, w, ops, start, out)) for w in (1, 2)]
    for p in procs:
        p.start()
    acked = sorted(v for _ in procs for v in out.get(timeout=240))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert acked == list(range(1, 2 * ops + 1))
    assert LogStore.commit_versions(LogStore(local_uri).list_log()) == list(range(2 * ops + 1))
    stamped = icts(local_uri, range(2 * ops + 1))
    assert all(b is not None and a is not None and b > a for a, b in itertools.pairwise(stamped))
    report = Table.open(local_uri).verify()
    assert (report.ok, report.problem) == (True, None)


# --------------------------------------------------------------------------- readers


def test_rewritten_file_times_cannot_reorder_history(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1]))
    t.append(rows([2]))
    v0, v1, v2 = icts(local_uri, range(3))
    assert v0 is not None and v1 is not None and v2 is not None
    # Copies and object-store moves reset file times: here in reverse order of the versions.
    for version in range(3):
        set_mtime(local_uri, version, BASE - version * 3_600_000)
    assert t.version_at(v1) == 1
    assert t.version_at(v2 - 1) == 1
    assert t.version_at(v2) == 2
    assert t.version_at(v2 + 3_600_000) == 2
    assert Table.open(local_uri).snapshot(timestamp=v2 - 1).version == 1
    with pytest.raises(VersionNotFoundError):
        t.version_at(v0 - 1)
    assert [(h["version"], h["timestamp"]) for h in t.history()] == [(2, v2), (1, v1), (0, v0)]


def test_time_travel_across_the_enablement_uses_file_times_before_it(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    # Versions 0 and 1 are dated by their files: an hour and half an hour ago.
    mtime0, mtime1 = ict.wall_clock_ms() - 3_600_000, ict.wall_clock_ms() - 1_800_000
    set_mtime(local_uri, 0, mtime0)
    set_mtime(local_uri, 1, mtime1)
    t.set_properties(ON)
    t.append(rows([2]))
    enabled_at, last = icts(local_uri, range(2, 4))
    assert enabled_at is not None and last is not None
    assert t.version_at(mtime0) == 0
    assert t.version_at(mtime1 + 1) == 1
    assert t.version_at(enabled_at - 1) == 1  # before the enablement: versions before it only
    assert t.version_at(enabled_at) == 2
    assert t.version_at(last + 10) == 3
    with pytest.raises(VersionNotFoundError):
        t.version_at(mtime0 - 1)
    history = [(h["version"], h["timestamp"]) for h in t.history()]
    assert history == [(3, last), (2, enabled_at), (1, mtime1), (0, mtime0)]


def test_verify_accepts_timestamps_and_flags_one_that_goes_back(
    local_uri: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1]))
    assert t.verify().ok
    # A writer that ignores the previous commit's timestamp, with a clock behind it.
    monkeypatch.setattr(ict, "next_timestamp", lambda previous, now: now)
    clock.now = BASE - 1
    t.append(rows([2]))
    report = t.verify()
    assert (report.ok, report.problem, report.first_bad_version) == (False, "non-monotonic", 2)


def test_a_repair_of_a_lost_version_is_dated_between_its_neighbours(
    local_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1]))
    slots = EmbeddedSlotStore(os.path.join(local_uri, "_eventlog", "slots"))
    assert slots.claim(t.key, 2, SlotClaim("lost-txn", "lost-txn.json", digest="ab" * 32))  # never staged
    monkeypatch.setattr(recovery, "REPAIR_GRACE_SECONDS", 0.0)  # its writer is provably gone
    assert t.append(rows([3])).version == 3  # the writer resolves version 2 with a REPAIR first
    assert first_info(local_uri, 2)["operation"] == "REPAIR"
    v1, v2, v3 = icts(local_uri, range(1, 4))
    assert v1 is not None and v2 is not None and v3 is not None and v1 < v2 < v3
    assert t.verify().ok
