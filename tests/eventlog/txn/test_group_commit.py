"""Group commit: concurrent blind appends share one version (:mod:`eventlog.txn.groupcommit`).

The pure pieces (which commits may join, queue-file names, reading a queued member,
blocking, combining) are tested directly. The end-to-end tests make grouping
deterministic with :func:`tests.support.invariants.hold_until_queued`: each writer is held
right after it queued its append until every writer has, so the first granted claim comes
from a leader that saw every queued file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

from eventlog import (
    CommitResult,
    CommitStateUnknownError,
    ConcurrentTransactionException,
    MetadataChangedException,
    Table,
    Transaction,
)
from eventlog.files.schema import to_spark_schema_json
from eventlog.log.actions import (
    Action,
    AddFile,
    CommitInfo,
    DeletionVectorDescriptor,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    UnknownAction,
    encode_commit,
)
from eventlog.log.commit import GROUP_FIELD, Commit, member_txn_ids
from eventlog.log.commitlog import SlotsSpec
from eventlog.log.storage import LogStore
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.txn.conflicts import ReadSet, TransactionSummary, WinningCommit
from eventlog.txn.groupcommit import (
    Member,
    QueuedName,
    combine,
    groupable,
    member_blocked,
    parse_member,
)
from eventlog.txn.retry import RetryPolicy
from lockstore import InMemorySlotStore, LocalFileSlotStore, SlotClaim, SlotStore
from tests.conftest import SCHEMA, rows, sorted_ids
from tests.support.invariants import SCHEMA as WRITER_SCHEMA
from tests.support.invariants import (
    check_invariants,
    commit_concurrently,
    hold_until_queued,
    run_writer_threads,
)

META = Metadata(id="t1", schema_string=to_spark_schema_json(SCHEMA))

# --------------------------------------------------------------------------- helpers


def _add(path: str, **kw: Any) -> AddFile:
    return AddFile(path, {}, 10, 1, **kw)


def _info(
    txn_id: str,
    *,
    blind: bool | None = True,
    operation: str = "WRITE",
    metrics: dict[str, str] | None = None,
    user_metadata: str | None = None,
    params: dict[str, str] | None = None,
    timestamp: int = 1000,
) -> CommitInfo:
    return CommitInfo(
        timestamp=timestamp,
        operation=operation,
        operation_parameters=params if params is not None else {"mode": "Append"},
        read_version=4,
        isolation_level="WriteSerializable",
        is_blind_append=blind,
        txn_id=txn_id,
        user_metadata=user_metadata,
        operation_metrics=metrics or {},
    )


def _summary(**kw: Any) -> TransactionSummary:
    """A pure blind append's summary; ``kw`` overrides fields."""
    base = TransactionSummary(
        table="/t",
        read_version=4,
        read_protocol=Protocol(1, 2),
        read_metadata=META,
        partition_schema=pa.schema([]),
        read_set=ReadSet(),
        isolation_level=IsolationLevel.WRITE_SERIALIZABLE,
        is_blind_append=True,
        adds=(_add("a.parquet"),),
    )
    return dataclasses.replace(base, **kw)


def _member(txn_id: str, *actions: Action, checked: int = 5, enqueued: int = 1, **info_kw: Any) -> Member:
    queued = QueuedName(enqueued, checked, txn_id)
    member = parse_member(queued, encode_commit([_info(txn_id, **info_kw), *actions]))
    assert member is not None
    return member


def _winner(version: int, *actions: Action) -> WinningCommit:
    return WinningCommit.of(Commit(version, (_info(f"w{version}"), *actions)))


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


# --------------------------------------------------------------------------- groupable


def test_groupable_blind_append_with_own_app_ids() -> None:
    assert groupable(_summary(), [_add("a.parquet")])
    # An idempotent append reads the app id it writes: the queued file shows the read.
    body: list[Action] = [SetTransaction("app", 3, 1), _add("a.parquet")]
    assert groupable(_summary(read_set=ReadSet(app_ids=frozenset({"app"}))), body)


@pytest.mark.parametrize(
    ("change", "body"),
    [
        ({"is_blind_append": False}, [_add("a.parquet")]),
        ({"removes": (RemoveFile("old.parquet"),)}, [RemoveFile("old.parquet"), _add("a.parquet")]),
        ({"metadata": META}, [META, _add("a.parquet")]),
        ({"protocol": Protocol(1, 3)}, [Protocol(1, 3), _add("a.parquet")]),
        ({"fail_on_any_winner": True}, [_add("a.parquet")]),
        ({"read_set": ReadSet(app_ids=frozenset({"other"}))}, [_add("a.parquet")]),
        ({"read_set": ReadSet(app_ids=frozenset({"a", "b"}))}, [SetTransaction("a", 1, 1), _add("x")]),
        ({}, [_add("a.parquet", data_change=False)]),
        ({}, [_add("a.parquet", base_row_id=7)]),
        ({}, [_add("a.parquet", deletion_vector=DeletionVectorDescriptor("i", "abc", 10, 1))]),
    ],
    ids=[
        "not-blind",
        "remove",
        "metadata",
        "protocol",
        "restore-like",
        "reads-foreign-app-id",
        "reads-more-app-ids-than-it-writes",
        "no-data-change",
        "row-ids",
        "deletion-vector",
    ],
)
def test_groupable_rejects(change: dict[str, Any], body: list[Action]) -> None:
    assert not groupable(_summary(**change), body)


def _summary_of(txn: Transaction) -> tuple[TransactionSummary, list[Action]]:
    """What ``Transaction.commit`` decides on."""
    pending = txn.pending()
    return pending.summary, list(pending.body)


def test_groupable_on_real_operations(local_uri: str) -> None:
    table = Table.create(local_uri, SCHEMA)
    table.append(rows([1, 2]))

    def decide(build: Any) -> bool:
        txn = table.transaction()
        build(txn)
        summary, body = _summary_of(txn)
        txn.abort()
        return groupable(summary, body)

    def idempotent_append(txn: Transaction) -> None:
        assert txn.idempotent("app", 1)
        txn.append(rows([3]))

    def reads_foreign_app_id(txn: Transaction) -> None:
        assert txn.txn_version("other") == -1
        txn.append(rows([3]))

    assert decide(lambda txn: txn.append(rows([3])))
    assert decide(idempotent_append)
    assert not decide(lambda txn: txn.delete("id = 1"))
    assert not decide(lambda txn: txn.set_properties({"owner": "me"}))
    assert not decide(lambda txn: txn.overwrite(rows([9])))
    assert not decide(reads_foreign_app_id)


# --------------------------------------------------------------------------- QueuedName


@pytest.mark.parametrize(
    "queued",
    [
        QueuedName(1_700_000_000_123_456_789, 0, "9b2c2f0e-5f8a-4c1e-9d55-1f0c2a3b4c5d"),
        QueuedName(5, 12345, "txn-with-dashes"),
        QueuedName(0, 0, "t"),
        QueuedName(7, -1, "read-an-empty-table"),
    ],
)
def test_queued_name_round_trip(queued: QueuedName) -> None:
    name = queued.name
    assert name.startswith("q-") and name.endswith(".json")
    assert QueuedName.parse(name) == queued


def test_queued_names_sort_by_enqueue_time() -> None:
    early, late = QueuedName(99, 7, "zzz"), QueuedName(100, 3, "aaa")
    assert sorted([late.name, early.name]) == [early.name, late.name]


@pytest.mark.parametrize(
    "name",
    [
        "9b2c2f0e-5f8a-4c1e-9d55-1f0c2a3b4c5d.json",  # a normal staged commit
        "group-9b2c2f0e-5f8a-4c1e-9d55-1f0c2a3b4c5d.json",  # a group's combined commit
        "txn-abcdef12.json",  # a rebased solo commit
        "q-00000000000000000001-00000000000000000002-t.txt",
        "q-00000000000000000001-00000000000000000002.json",  # no txn id
        "q-x0000000000000000001-00000000000000000002-t.json",
        "q-00000000000000000001-0000000000000000000y-t.json",
        ".q-00000000000000000001-00000000000000000002-t.json.123.tmp",  # an atomic write in flight
        "q-.json",
        "",
    ],
)
def test_queued_name_parse_rejects_foreign_names(name: str) -> None:
    assert QueuedName.parse(name) is None


# --------------------------------------------------------------------------- parse_member


def test_parse_member_reads_a_queued_append() -> None:
    queued = QueuedName(1, 5, "t1")
    body: list[Action] = [SetTransaction("app", 2, 1), _add("a.parquet"), _add("b.parquet")]
    info = _info("t1", metrics={"numFiles": "2"})
    member = parse_member(queued, encode_commit([info, *body]))
    assert member is not None
    assert member.txn_id == "t1" and member.queued == queued
    assert member.info == info
    assert member.actions == tuple(body)
    assert member.app_ids == frozenset({"app"})


@pytest.mark.parametrize(
    "actions",
    [
        [_info("t1", blind=False), _add("a.parquet")],
        [_info("t1", blind=None), _add("a.parquet")],
        [_info("other"), _add("a.parquet")],  # commitInfo's txn id differs from the name's
        [_info("t1"), RemoveFile("old.parquet"), _add("a.parquet")],
        [_info("t1"), _add("a.parquet", data_change=False)],
        [_info("t1"), META, _add("a.parquet")],
        [_info("t1"), UnknownAction("someFutureAction", {"x": 1}), _add("a.parquet")],
        [_add("a.parquet"), _info("t1")],  # commitInfo not first
        [],
    ],
    ids=[
        "not-blind",
        "blind-unknown",
        "txn-id-differs",
        "remove",
        "no-data-change",
        "metadata",
        "unknown-action",
        "info-not-first",
        "empty",
    ],
)
def test_parse_member_rejects(actions: list[Action]) -> None:
    data = encode_commit(actions) if actions else b""
    assert parse_member(QueuedName(1, 5, "t1"), data) is None


def test_parse_member_rejects_undecodable_bytes() -> None:
    assert parse_member(QueuedName(1, 5, "t1"), b'{"commitInfo": {"timestamp": 1}\nnot json\n') is None


# --------------------------------------------------------------------------- member_blocked


@pytest.mark.parametrize(
    ("winner", "blocked"),
    [
        (_winner(6, META), True),
        (_winner(6, Protocol(3, 7, (), ())), True),
        (_winner(6, SetTransaction("app", 9, 1)), True),
        (_winner(6, SetTransaction("other-app", 9, 1)), False),
        (_winner(6, _add("x.parquet")), False),
        (_winner(6, RemoveFile("x.parquet")), False),
        (_winner(5, META), False),  # at its checked version: already checked against
        (_winner(4, Protocol(3, 7, (), ())), False),
        (_winner(3, SetTransaction("app", 9, 1)), False),
    ],
    ids=[
        "metadata-after",
        "protocol-after",
        "own-app-id-after",
        "other-app-id-after",
        "append-after",
        "delete-after",
        "metadata-at-checked",
        "protocol-below",
        "app-id-below",
    ],
)
def test_member_blocked(winner: WinningCommit, blocked: bool) -> None:
    member = _member("t1", SetTransaction("app", 1, 1), _add("a.parquet"), checked=5)
    assert member_blocked(member, [winner]) is blocked
    # Harmless winners around it change nothing.
    assert member_blocked(member, [_winner(4, _add("p")), winner, _winner(7, _add("q"))]) is blocked


def test_member_without_app_ids_is_not_blocked_by_app_ids() -> None:
    member = _member("t1", _add("a.parquet"), checked=5)
    assert not member_blocked(member, [_winner(6, SetTransaction("app", 1, 1))])
    assert not member_blocked(member, [])


# --------------------------------------------------------------------------- combine


def test_combine_lists_members_and_sums_metrics() -> None:
    metrics = [
        {"numFiles": "1", "numOutputRows": "3", "numOutputBytes": "100"},
        {"numFiles": "2", "numOutputRows": "5", "numOutputBytes": "250"},
        {"numFiles": "1", "numOutputRows": "1", "numOutputBytes": "7", "note": "not-a-number"},
    ]
    members = [
        _member("t1", SetTransaction("app-1", 4, 1), _add("a1"), metrics=metrics[0], enqueued=1),
        _member("t2", _add("b1"), _add("b2"), metrics=metrics[1], enqueued=2),
        _member("t3", SetTransaction("app-3", 1, 1), _add("c1"), metrics=metrics[2], enqueued=3),
    ]
    actions = combine(members, txn_id="group-1", timestamp=4242, read_version=9)
    infos = [a for a in actions if isinstance(a, CommitInfo)]
    assert len(infos) == 1 and actions[0] is infos[0]
    info = infos[0]
    assert info.txn_id == "group-1" and info.timestamp == 4242 and info.read_version == 9
    assert info.is_blind_append is True
    assert info.operation == "WRITE" and dict(info.operation_parameters) == {"mode": "Append"}
    assert dict(info.operation_metrics) == {"numFiles": "4", "numOutputRows": "9", "numOutputBytes": "357"}
    entries = info.extra[GROUP_FIELD]
    assert [e["txnId"] for e in entries] == ["t1", "t2", "t3"]
    assert entries[1]["operationMetrics"] == metrics[1]
    assert entries[0]["operation"] == "WRITE" and entries[0]["readVersion"] == 4
    # Every member's actions, in member order.
    assert actions[1:] == [*members[0].actions, *members[1].actions, *members[2].actions]
    txns = {a.app_id: a.version for a in actions if isinstance(a, SetTransaction)}
    assert txns == {"app-1": 4, "app-3": 1}
    assert member_txn_ids(info) == ["t1", "t2", "t3"]


def test_combine_keeps_a_shared_operation_and_user_metadata() -> None:
    same = [
        _member(
            f"t{i}", _add(f"f{i}"), operation="STREAMING UPDATE", user_metadata="job-7", params={"a": "1"}
        )
        for i in range(2)
    ]
    info = combine(same, txn_id="g", timestamp=1, read_version=0)[0]
    assert isinstance(info, CommitInfo)
    assert info.operation == "STREAMING UPDATE" and info.user_metadata == "job-7"
    assert dict(info.operation_parameters) == {"a": "1"}
    assert [e["userMetadata"] for e in info.extra[GROUP_FIELD]] == ["job-7", "job-7"]

    mixed = [
        _member("t1", _add("f1"), operation="STREAMING UPDATE", user_metadata="a", params={"a": "1"}),
        _member("t2", _add("f2"), operation="WRITE", user_metadata="b"),
    ]
    info = combine(mixed, txn_id="g", timestamp=1, read_version=0)[0]
    assert isinstance(info, CommitInfo)
    assert info.operation == "WRITE" and info.user_metadata is None
    assert dict(info.operation_parameters) == {"mode": "Append"}
    assert [e["userMetadata"] for e in info.extra[GROUP_FIELD]] == ["a", "b"]
    assert [e["operation"] for e in info.extra[GROUP_FIELD]] == ["STREAMING UPDATE", "WRITE"]


# --------------------------------------------------------------------------- member_txn_ids


def test_member_txn_ids_of_plain_and_group_commits() -> None:
    plain = _info("t1")
    assert member_txn_ids(plain) == ["t1"]
    assert member_txn_ids(plain.to_json()) == ["t1"]
    assert member_txn_ids({"version": 3, **plain.to_json()}) == ["t1"]  # a history entry
    group = combine(
        [_member("a", _add("x")), _member("b", _add("y"))], txn_id="g", timestamp=1, read_version=0
    )
    info = group[0]
    assert isinstance(info, CommitInfo)
    assert member_txn_ids(info) == ["a", "b"]  # the members, not the group's own id
    assert member_txn_ids(info.to_json()) == ["a", "b"]
    assert member_txn_ids(CommitInfo.from_json(info.to_json())) == ["a", "b"]
    assert member_txn_ids(None) == []
    assert member_txn_ids(CommitInfo(timestamp=1, operation="WRITE")) == []
    assert member_txn_ids({"operation": "WRITE"}) == []


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


# --------------------------------------------------------------------------- slot stores


@pytest.fixture(params=["in-memory", "local-file"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> SlotStore:
    if request.param == "in-memory":
        return InMemorySlotStore()
    return LocalFileSlotStore(str(tmp_path / "slots"))


def test_group_claim_lists_members_and_find_txn_matches_them(store: SlotStore) -> None:
    assert store.claim("t", 0, SlotClaim("solo", "solo.json"))
    group = SlotClaim("group-1", "group-group-1.json", {"host": "h"}, ("m1", "m2", "m3"))
    assert store.claim("t", 1, group)
    assert not store.claim("t", 1, SlotClaim("m2", "m2.json"))  # a member cannot take it again
    record = store.get("t", 1)
    assert record is not None
    assert record.claim.members == ("m1", "m2", "m3") and record.claim.txn_id == "group-1"
    assert record.claim.covers("m2") and record.claim.covers("group-1") and not record.claim.covers("solo")
    assert [store.find_txn("t", txn) for txn in ("m1", "m3", "group-1", "solo")] == [1, 1, 1, 0]
    assert store.find_txn("t", "m1", start=2) is None and store.find_txn("t", "nobody") is None
    plain = store.get("t", 0)
    assert plain is not None and plain.claim.members == ()


def test_await_latest_returns_on_a_claim_or_after_the_timeout(store: SlotStore) -> None:
    assert store.claim("t", 0, SlotClaim("a", "a.json"))
    assert store.await_latest("t", -1, 5.0) == 0  # already past: no wait
    started = time.monotonic()
    assert store.await_latest("t", 0, 0.2) == 0  # nothing happens: the timeout
    assert 0.15 <= time.monotonic() - started < 2.0

    def claim_later() -> None:
        time.sleep(0.2)
        assert store.claim("t", 1, SlotClaim("b", "b.json"))

    claimer = threading.Thread(target=claim_later)
    started = time.monotonic()
    claimer.start()
    try:
        assert store.await_latest("t", 0, 10.0) == 1
        assert time.monotonic() - started < 5.0  # woken by the claim, not the timeout
    finally:
        claimer.join(timeout=10)


class _RefusingStore(InMemorySlotStore):
    """Every claim is taken while ``refuse`` is set (as under endless contention)."""

    refuse = True

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        return False if self.refuse else super().claim(table, version, claim)


def test_giving_up_while_queued_withdraws_the_queued_file(local_uri: str) -> None:
    """Out of budget without knowing the outcome: CommitStateUnknownError, and the queued
    file is withdrawn so that no later leader can carry the append."""
    store = _RefusingStore()
    store.refuse = False
    Table.create(local_uri, SCHEMA, slots=store)
    store.refuse = True
    policy = RetryPolicy(max_attempts=5, max_duration=5.0)
    table = Table.open(local_uri, slots=store, retry_policy=policy, group_commit=True)
    txn = table.transaction()
    txn.append(rows([1]))
    with pytest.raises(CommitStateUnknownError, match="withdrawn from the queue") as info:
        txn.commit()
    assert info.value.txn_id == txn.txn_id
    assert [n for n in LogStore(local_uri).list_staged() if QueuedName.parse(n)] == []
    assert Table.open(local_uri, slots=store).version == 0
    store.refuse = False
    later = Table.open(local_uri, slots=store, group_commit=True).append(rows([2]))
    assert later.version == 1
    reopened = Table.open(local_uri, slots=store)
    assert member_txn_ids(reopened.history(1)[0]) == [later.txn_id]
    assert sorted_ids(reopened) == [2]
