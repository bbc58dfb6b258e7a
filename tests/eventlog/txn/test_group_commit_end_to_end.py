"""Group commit end to end: concurrent blind appends share one version.

The tests make grouping deterministic with :func:`tests.support.invariants.hold_until_queued`:
each writer is held right after it queued its append until every writer has, so the first
granted claim comes from a leader that saw every queued file.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from eventlog import (
    CommitResult,
    CommitStateUnknownError,
    ConcurrentTransactionException,
    MetadataChangedException,
    Table,
    Transaction,
)
from eventlog.log.actions import SetTransaction, encode_commit
from eventlog.log.commit import GROUP_FIELD, Commit, member_txn_ids
from eventlog.log.commitlog import SlotsSpec
from eventlog.log.storage import LogStore
from eventlog.txn.groupcommit import QueuedName
from lockstore import InMemorySlotStore
from tests.conftest import SCHEMA, rows, sorted_ids
from tests.support.invariants import SCHEMA as WRITER_SCHEMA
from tests.support.invariants import (
    check_invariants,
    commit_concurrently,
    hold_until_queued,
    run_writer_threads,
)


def _queued_files(uri: str) -> list[str]:
    return [n for n in LogStore(uri).list_staged() if QueuedName.parse(n) is not None]


def _prepared_appends(
    uri: str, batches: Sequence[Sequence[int]], slots: SlotsSpec = None
) -> list[Transaction]:
    """One open group-commit transaction per batch, each on its own handle (all read the
    same version)."""
    txns = []
    for ids in batches:
        txn = Table.open(uri, slots=slots, group_commit=True).transaction()
        txn.append(rows(list(ids)))
        txns.append(txn)
    return txns


def _results(outcomes: Sequence[CommitResult | BaseException]) -> list[CommitResult]:
    for o in outcomes:
        if isinstance(o, BaseException):
            raise AssertionError(f"a commit failed: {o!r}") from o
    return [o for o in outcomes if isinstance(o, CommitResult)]


# --------------------------------------------------------------------------- end to end


def test_three_queued_appends_share_one_version(any_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Table.create(any_uri, SCHEMA)
    txns = _prepared_appends(any_uri, [[1, 2], [3], [4, 5, 6]])
    hold_until_queued(monkeypatch, 3)
    results = _results(commit_concurrently(txns))
    assert [r.version for r in results] == [1, 1, 1]
    assert [r.txn_id for r in results] == [t.txn_id for t in txns]
    assert [r.metrics["numOutputRows"] for r in results] == ["2", "1", "3"]  # each its own metrics
    # Where each commit's time went: the leader gathered, claimed and published; the others
    # were carried (they found themselves in the commit) without publishing anything.
    for r in results:
        assert r.timings["total"] >= sum(v for k, v in r.timings.items() if k != "total") - 1e-6
        assert r.timings["stage"] >= 0
    assert sum("publish" in r.timings for r in results) >= 1
    assert all("gather" in r.timings for r in results if "publish" in r.timings)
    table = Table.open(any_uri)
    assert table.version == 1
    info = table.history(1)[0]
    assert sorted(member_txn_ids(info)) == sorted(t.txn_id for t in txns)
    assert info["operation"] == "WRITE" and info["isBlindAppend"] is True
    assert info["operationMetrics"]["numOutputRows"] == "6"
    assert sorted_ids(table) == [1, 2, 3, 4, 5, 6]
    assert LogStore(any_uri).list_staged() == []  # queued files and the group's staged commit
    # The slot store lists the members in the claim, so a member's txn id is found there.
    store, key = table.slots, table.key
    record = store.get(key, 1)
    assert record is not None and sorted(record.claim.members) == sorted(t.txn_id for t in txns)
    assert all(store.find_txn(key, t.txn_id) == 1 for t in txns)
    # Later appends continue above the group.
    assert Table.open(any_uri, group_commit=True).append(rows([7])).version == 2
    assert sorted_ids(Table.open(any_uri)) == [1, 2, 3, 4, 5, 6, 7]


def test_single_group_append_commits_alone(any_uri: str) -> None:
    Table.create(any_uri, SCHEMA)
    table = Table.open(any_uri, group_commit=True)
    first = table.append(rows([1]), user_metadata="solo")
    second = table.append(rows([2]))
    assert (first.version, second.version) == (1, 2)
    history = {h["version"]: h for h in table.history()}
    assert history[1]["txnId"] == first.txn_id and GROUP_FIELD not in history[1]
    assert history[1]["userMetadata"] == "solo"
    assert member_txn_ids(history[2]) == [second.txn_id]
    assert sorted_ids(table) == [1, 2]
    assert LogStore(any_uri).list_staged() == []


def test_group_commit_is_readable_by_deltalake(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    deltalake = pytest.importorskip("deltalake")
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA)
    txns = _prepared_appends(uri, [[1, 2], [3], [4]])
    for i, txn in enumerate(txns):
        txn.user_metadata = f"member-{i}"
    hold_until_queued(monkeypatch, 3)
    results = _results(commit_concurrently(txns))
    assert {r.version for r in results} == {1}
    ours = Table.open(uri, group_commit=True)
    assert ours.append(rows([5])).version == 2  # a solo commit after the group

    dt = deltalake.DeltaTable(uri)
    assert dt.version() == 2
    theirs = sorted(dt.to_pyarrow_table().column("id").to_pylist())
    assert theirs == sorted_ids(ours) == [1, 2, 3, 4, 5]
    assert sorted(deltalake.DeltaTable(uri, version=1).to_pyarrow_table().column("id").to_pylist()) == [
        1,
        2,
        3,
        4,
    ]

    entry = ours.history()[1]
    assert entry["version"] == 1
    members = entry[GROUP_FIELD]
    by_txn = {m["txnId"]: m for m in members}
    assert set(by_txn) == {t.txn_id for t in txns}
    for i, txn in enumerate(txns):
        member = by_txn[txn.txn_id]
        assert member["operation"] == "WRITE"
        assert member["userMetadata"] == f"member-{i}"
        assert member["operationMetrics"]["numOutputRows"] == str(len([[1, 2], [3], [4]][i]))
        assert member["readVersion"] == 0
    assert "userMetadata" not in entry  # members disagree: only the member entries carry it
    assert entry["txnId"] not in by_txn  # the group's own id


@contextlib.contextmanager
def _held_in_queue(
    table: Table, txn: Transaction, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[CommitResult | BaseException]]:
    """Commit ``txn`` in a thread and hold it right after it queued its append; the body
    runs while it is held. On exit the commit goes on; its outcome is in the yielded list."""
    queued, go = threading.Event(), threading.Event()
    original = table.log.stage

    def stage_then_wait(name: str, data: bytes, *, atomic: bool = False) -> None:
        original(name, data, atomic=atomic)
        if QueuedName.parse(name) is not None:
            queued.set()
            assert go.wait(timeout=20)

    monkeypatch.setattr(table.log, "stage", stage_then_wait)
    outcome: list[CommitResult | BaseException] = []

    def commit() -> None:
        try:
            outcome.append(txn.commit())
        except BaseException as exc:  # asserted on by the caller
            outcome.append(exc)

    thread = threading.Thread(target=commit)
    thread.start()
    try:
        assert queued.wait(timeout=20)
        yield outcome
    finally:
        go.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_member_blocked_by_metadata_change_fails_alone(any_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued append whose table changed metadata after its read: a leader leaves it out,
    and the append itself raises MetadataChangedException, naming the winner."""
    Table.create(any_uri, SCHEMA)
    Table.open(any_uri).append(rows([1]))  # version 1
    blocked = Table.open(any_uri, group_commit=True)
    txn = blocked.transaction()
    txn.append(rows([100]))
    written = [a.path for a in txn._adds]
    with _held_in_queue(blocked, txn, monkeypatch) as outcome:
        [queued_name] = _queued_files(any_uri)
        parsed = QueuedName.parse(queued_name)
        assert parsed is not None and (parsed.checked, parsed.txn_id) == (1, txn.txn_id)
        props = Table.open(any_uri).set_properties({"owner": "team-a"})  # version 2: the winner
        assert props.version == 2
        # A later append leads (the blocked one is older, but makes no progress) and
        # leaves the blocked member out: it commits alone.
        leader = Table.open(any_uri, group_commit=True).append(rows([200]))
        assert leader.version == 3
        assert member_txn_ids(Table.open(any_uri).history(1)[0]) == [leader.txn_id]
        assert _queued_files(any_uri) == [queued_name]  # still queued: not carried
    [exc] = outcome
    assert isinstance(exc, MetadataChangedException)
    assert exc.winning_version == 2
    assert exc.operation == "SET TBLPROPERTIES"
    assert _queued_files(any_uri) == []  # the failed append's queued file is deleted
    table = Table.open(any_uri)
    assert table.version == 3
    assert sorted_ids(table) == [1, 200]
    assert table.properties["owner"] == "team-a"
    history_txns = [t for h in table.history() for t in member_txn_ids(h)]
    assert txn.txn_id not in history_txns
    fs = LogStore(any_uri)
    assert not any(fs.fs.exists(f"{fs.root}/{p}") for p in written)  # its data files are cleaned up


def test_member_conflicting_with_metadata_change_before_queueing(any_uri: str) -> None:
    Table.create(any_uri, SCHEMA)
    txn = Table.open(any_uri, group_commit=True).transaction()
    txn.append(rows([1]))
    assert Table.open(any_uri).set_properties({"owner": "x"}).version == 1
    with pytest.raises(MetadataChangedException) as info:
        txn.commit()
    assert info.value.winning_version == 1
    assert LogStore(any_uri).list_staged() == []
    table = Table.open(any_uri)
    assert table.version == 1 and sorted_ids(table) == []


def test_idempotent_appends_share_a_version_per_distinct_app_id(
    any_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Table.create(any_uri, SCHEMA)
    specs = [("app-a", 1, [1]), ("app-a", 2, [2]), ("app-b", 1, [3])]
    txns = []
    for app, version, ids in specs:
        txn = Table.open(any_uri, group_commit=True).transaction()
        assert txn.idempotent(app, version)
        txn.append(rows(ids))
        txns.append(txn)
    hold_until_queued(monkeypatch, 3)
    outcomes = commit_concurrently(txns)

    # Two writers of app-a cannot share a commit: one of them wins, with app-b's append;
    # the other fails as if it had committed alone after the winner.
    a_outcomes = outcomes[:2]
    winners = [o for o in a_outcomes if isinstance(o, CommitResult)]
    losers = [o for o in a_outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    [won], [lost] = winners, losers
    assert isinstance(lost, ConcurrentTransactionException) and lost.winning_version == 1
    b_result = outcomes[2]
    assert isinstance(b_result, CommitResult)
    assert won.version == b_result.version == 1

    table = Table.open(any_uri)
    assert table.version == 1
    [commit] = table.commits_between(1, 1)
    txn_actions = [a for a in commit.actions if isinstance(a, SetTransaction)]
    assert sorted(a.app_id for a in txn_actions) == ["app-a", "app-b"]  # app-a once
    won_index = a_outcomes.index(won)
    won_version, won_ids = specs[won_index][1], specs[won_index][2]
    assert {a.app_id: a.version for a in txn_actions} == {"app-a": won_version, "app-b": 1}
    assert sorted(member_txn_ids(commit.commit_info)) == sorted([won.txn_id, b_result.txn_id])
    snap = table.snapshot()
    assert snap.txn_version("app-a") == won_version and snap.txn_version("app-b") == 1
    assert sorted_ids(table) == sorted([*won_ids, 3])
    assert _queued_files(any_uri) == []

    # Re-running an already committed (app id, version) is skipped: no new version.
    again = Table.open(any_uri, group_commit=True).append(rows([3]), txn_app_id="app-b", txn_version=1)
    assert again.skipped and again.version == 1
    older = Table.open(any_uri, group_commit=True).append(rows([9]), txn_app_id="app-a", txn_version=0)
    assert older.skipped
    table = Table.open(any_uri)
    assert table.version == 1 and sorted_ids(table) == sorted([*won_ids, 3])
    # A newer app version commits.
    newer = Table.open(any_uri, group_commit=True).append(rows([4]), txn_app_id="app-b", txn_version=2)
    assert not newer.skipped and newer.version == 2
    assert Table.open(any_uri).snapshot().txn_version("app-b") == 2


@pytest.mark.parametrize("store", ["in-memory", "local-file"])
def test_threads_append_with_group_commit(tmp_path: Any, store: str) -> None:
    uri = str(tmp_path / "t")
    slots: SlotsSpec = InMemorySlotStore() if store == "in-memory" else None
    Table.create(uri, WRITER_SCHEMA, slots=slots)
    results = run_writer_threads(uri, 4, 40, slots=slots, delete_share=0.0, group_commit=True)
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 160 and all(a["kind"] == "append" for a in acks)
    assert not any(r.errors for r in results)
    table = check_invariants(uri, acks, slots=slots)
    assert table.version <= 160  # never more versions than appends
    assert table.version == len({a["version"] for a in acks})
    got = table.to_arrow().column("id").to_pylist()
    assert len(got) == 3 * 160 == len(set(got))
    assert _queued_files(uri) == []


def test_threads_mix_group_appends_and_deletes(tmp_path: Any) -> None:
    uri = str(tmp_path / "t")
    slots = InMemorySlotStore()
    Table.create(uri, WRITER_SCHEMA, slots=slots)
    results = run_writer_threads(uri, 4, 30, slots=slots, delete_share=0.3, group_commit=True)
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 120
    deletes = [a for a in acks if a["kind"] == "delete"]
    assert deletes  # the seeded writers delete (deterministic choice)
    table = check_invariants(uri, acks, slots=slots)
    history = {h["version"]: h for h in table.history()}
    for ack in deletes:  # deletes take the normal commit loop: one transaction per version
        entry = history[ack["version"]]
        assert entry["operation"] == "DELETE" and GROUP_FIELD not in entry
        assert member_txn_ids(entry) == [ack["txn"]]
    assert _queued_files(uri) == []


def test_queued_append_already_carried_is_never_committed_again(any_uri: str) -> None:
    """A leader skips a queued file that a commit since its checked version carries.

    The file of an append whose writer is gone (here: never started) is carried by the
    next leader; put back as if its deletion had not happened yet, the following leader
    must leave it out (exactly once).
    """
    Table.create(any_uri, SCHEMA)
    orphan = Table.open(any_uri).transaction()
    orphan.append(rows([1]))
    body, info, _ = orphan._prepare()
    name = QueuedName(time.time_ns(), 0, orphan.txn_id).name
    data = encode_commit([info, *body])
    log = LogStore(any_uri)
    log.stage(name, data, atomic=True)

    first = Table.open(any_uri, group_commit=True).append(rows([2]))  # waits, then leads
    assert first.version == 1
    table = Table.open(any_uri)
    assert member_txn_ids(table.history(1)[0]) == [first.txn_id, orphan.txn_id]
    assert sorted_ids(table) == [1, 2]
    assert _queued_files(any_uri) == []  # the leader deleted the member's queued file

    log.stage(name, data, atomic=True)  # the same queued file, still listed
    second = Table.open(any_uri, group_commit=True).append(rows([3]))
    assert second.version == 2
    table = Table.open(any_uri)
    assert member_txn_ids(table.history(1)[0]) == [second.txn_id]
    assert sorted_ids(table) == [1, 2, 3]
    carried = [t for h in table.history() for t in member_txn_ids(h)]
    assert carried.count(orphan.txn_id) == 1


def test_error_while_queued_reports_unknown_outcome(any_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Table.create(any_uri, SCHEMA)
    member = Table.open(any_uri, group_commit=True)
    txn = member.transaction()
    txn.append(rows([1]))
    with _held_in_queue(member, txn, monkeypatch) as outcome:
        leader = Table.open(any_uri, group_commit=True).append(rows([2]))  # carries the member
        assert leader.version == 1
        assert txn.txn_id in member_txn_ids(Table.open(any_uri).history(1)[0])

        def storage_error(first: int, last: int) -> list[Commit]:
            raise OSError("transient storage error")

        monkeypatch.setattr(member.commitlog, "commits_between", storage_error)
    [exc] = outcome
    # The append is in the table: the caller must not be told it failed.
    assert sorted_ids(Table.open(any_uri)) == [1, 2]
    assert isinstance(exc, CommitStateUnknownError), repr(exc)
    assert exc.txn_id == txn.txn_id
