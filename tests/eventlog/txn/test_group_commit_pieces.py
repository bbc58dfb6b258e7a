"""Group commit's pure pieces (:mod:`eventlog.txn.groupcommit`), tested directly: which commits
may join a group, queue-file names, reading a queued member, blocking, combining, and the
member transaction ids of a commit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table, Transaction
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
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.txn.conflicts import ReadSet, TransactionSummary, WinningCommit
from eventlog.txn.groupcommit import Member, QueuedName, combine, groupable, member_blocked, parse_member
from tests.conftest import SCHEMA, rows

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
