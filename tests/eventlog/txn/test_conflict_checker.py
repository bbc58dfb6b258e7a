"""The pure conflict checker, rule by rule, and the order in which rules fire."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from eventlog import expr as ex
from eventlog.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    MetadataChangedException,
    ProtocolChangedException,
    UnsupportedProtocolError,
)
from eventlog.files.schema import to_spark_schema_json
from eventlog.log.actions import (
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from eventlog.log.commit import Commit
from eventlog.snapshot.isolation import IsolationLevel, effective_isolation_level
from eventlog.txn.conflicts import ReadSet, TransactionSummary, WinningCommit, check_conflicts, partition_hint

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string())])
PART = pa.schema([("date", pa.string())])
META = Metadata(id="t1", schema_string=to_spark_schema_json(SCHEMA), partition_columns=("date",))
UNPART = Metadata(id="t1", schema_string=to_spark_schema_json(SCHEMA))
PROTO = Protocol(1, 2)
DATE = ex.parse_predicate("date = '2024-01-01'", SCHEMA)


def add(path: str, date: str | None = "2024-01-01") -> AddFile:
    return AddFile(path, {"date": date}, 10, 1)


def winner(*actions: Action, blind: bool = False, version: int = 5, op: str = "WRITE") -> WinningCommit:
    info = CommitInfo(timestamp=1, operation=op, is_blind_append=blind)
    return WinningCommit.of(Commit(version, (info, *actions)))


def txn(
    *,
    predicates: Sequence[ex.Expr] = (),
    files: dict[str, dict[str, str | None]] | None = None,
    whole: bool = False,
    app_ids: frozenset[str] = frozenset(),
    level: IsolationLevel = IsolationLevel.WRITE_SERIALIZABLE,
    blind: bool = False,
    metadata: Metadata | None = None,
    protocol: Protocol | None = None,
    removes: tuple[RemoveFile, ...] = (),
    domains: tuple[DomainMetadata, ...] = (),
    read_metadata: Metadata = META,
) -> TransactionSummary:
    return TransactionSummary(
        table="/t",
        read_version=4,
        read_protocol=PROTO,
        read_metadata=read_metadata,
        partition_schema=PART if read_metadata.partition_columns else pa.schema([]),
        read_set=ReadSet(tuple(predicates), files or {}, whole, app_ids),
        isolation_level=level,
        is_blind_append=blind,
        metadata=metadata,
        protocol=protocol,
        removes=removes,
        domains=domains,
    )


S, WS, SI = IsolationLevel.SERIALIZABLE, IsolationLevel.WRITE_SERIALIZABLE, IsolationLevel.SNAPSHOT_ISOLATION


@pytest.mark.parametrize(
    ("level", "winner_blind", "changes_metadata", "conflict"),
    [
        (S, True, False, True),
        (S, False, False, True),
        (WS, True, False, False),  # blind appends are ignored under WriteSerializable ...
        (WS, True, True, True),  # ... unless this transaction changes metadata
        (WS, False, False, True),
        (SI, False, False, False),  # no data change: no append check at all
    ],
)
def test_append_candidates_by_level(
    level: IsolationLevel, winner_blind: bool, changes_metadata: bool, conflict: bool
) -> None:
    t = txn(predicates=[DATE], level=level, metadata=META if changes_metadata else None)
    w = winner(add("new.parquet"), blind=winner_blind)
    if conflict:
        with pytest.raises(ConcurrentAppendException) as info:
            check_conflicts(t, w)
        assert info.value.partition == "[date=2024-01-01]"
        assert info.value.isolation_level == level.value
    else:
        assert check_conflicts(t, w) == t


def test_partition_predicates_decide_overlap() -> None:
    t = txn(predicates=[DATE])
    assert check_conflicts(t, winner(add("b", "2024-01-02"))) == t  # other partition
    with pytest.raises(ConcurrentAppendException):
        check_conflicts(t, winner(add("b", "2024-01-02"), add("c", "2024-01-01")))
    assert check_conflicts(t, winner(add("n", None))) == t  # NULL never matches
    assert check_conflicts(txn(), winner(add("x"))) == txn()  # no reads on a partitioned table
    with pytest.raises(ConcurrentAppendException):
        check_conflicts(txn(predicates=[ex.TRUE]), winner(add("x", "1999-01-01")))


def test_unpartitioned_any_add_conflicts_and_blind_appends_never_do() -> None:
    t = txn(predicates=[DATE], read_metadata=UNPART)
    with pytest.raises(ConcurrentAppendException) as info:
        check_conflicts(t, winner(add("x", None)))
    assert info.value.partition is None
    blind = txn(read_metadata=UNPART, blind=True, level=S)
    assert check_conflicts(blind, winner(add("x", None))) == blind


def test_delete_read_and_whole_table() -> None:
    read = txn(files={"a": {"date": "2024-01-01"}}, predicates=[DATE])
    rm = RemoveFile("a", 1, partition_values={"date": "2024-01-01"})
    with pytest.raises(ConcurrentDeleteReadException) as info:
        check_conflicts(read, winner(rm))
    assert info.value.partition == "[date=2024-01-01]"
    whole = txn(whole=True, level=SI)
    with pytest.raises(ConcurrentDeleteReadException) as whole_info:
        check_conflicts(whole, winner(RemoveFile("zzz", 1)))
    assert whole_info.value.partition is None


def test_check_order_append_before_delete_read_before_delete_delete() -> None:
    rm_a = RemoveFile("a", 1, partition_values={"date": "2024-01-01"})
    both = txn(predicates=[DATE], files={"a": {"date": "2024-01-01"}}, removes=(rm_a,))
    with pytest.raises(ConcurrentAppendException):
        check_conflicts(both, winner(rm_a, add("a2")))
    with pytest.raises(ConcurrentDeleteReadException):
        check_conflicts(both, winner(rm_a, add("b2", "2024-05-05")))
    only_removes = txn(removes=(rm_a,))
    with pytest.raises(ConcurrentDeleteDeleteException) as info:
        check_conflicts(only_removes, winner(rm_a))
    assert info.value.partition == "[date=2024-01-01]"


def test_protocol_before_metadata_before_files() -> None:
    creator = txn(protocol=PROTO, metadata=META, predicates=[ex.TRUE])
    w = winner(PROTO, META, add("x"), version=0, op="CREATE TABLE")
    with pytest.raises(ProtocolChangedException) as info:
        check_conflicts(creator, w)
    assert "empty directory" in str(info.value)
    changed = Metadata(
        id="t1", schema_string=META.schema_string, partition_columns=("date",), configuration={"k": "v"}
    )
    with pytest.raises(MetadataChangedException):  # metadata is checked before the added file
        check_conflicts(txn(predicates=[ex.TRUE]), winner(changed, add("x")))


def test_protocol_upgrade_without_own_protocol_is_adopted() -> None:
    upgraded = Protocol(3, 7, ("timestampNtz",), ("appendOnly", "invariants", "timestampNtz"))
    t = txn()
    rebased = check_conflicts(t, winner(upgraded))
    assert rebased.read_protocol == upgraded
    with pytest.raises(UnsupportedProtocolError):
        check_conflicts(t, winner(Protocol(3, 7, ("deletionVectorsX",), ("x",))))


def test_allow_listed_property_change_is_adopted() -> None:
    new = Metadata(
        id="t1", schema_string=META.schema_string, partition_columns=("date",),
        configuration={"delta.enableDeletionVectors": "true"},
    )  # fmt: skip
    rebased = check_conflicts(txn(), winner(new))
    assert rebased.read_metadata == new


def test_app_ids_and_domains() -> None:
    w = winner(SetTransaction("q1", 3), DomainMetadata("d", "{}"))
    with pytest.raises(ConcurrentTransactionException):
        check_conflicts(txn(app_ids=frozenset({"q1"})), w)
    assert check_conflicts(txn(app_ids=frozenset({"q2"})), w) == txn(app_ids=frozenset({"q2"}))
    with pytest.raises(ConcurrentTransactionException) as info:
        check_conflicts(txn(domains=(DomainMetadata("d", "{}"),)), w)
    assert "A conflicting metadata domain d is added." in str(info.value)


def test_partition_hint_format() -> None:
    schema = pa.schema([("a", pa.string()), ("b", pa.int64())])
    assert partition_hint({"b": "2", "a": None}, schema) == "[a=null, b=2]"
    assert partition_hint({}, schema) is None
    assert partition_hint({"a": "x"}, pa.schema([])) is None


@pytest.mark.parametrize(
    ("table_level", "actions", "changes_data", "expected"),
    [
        (WS, [], True, WS),  # empty commit, data-changing op: keep the table level
        (WS, [], False, SI),
        (S, [], True, SI),
        (S, [add("a").remove(1, data_change=False)], True, SI),
        (WS, [AddFile("a", {}, 1, 1, data_change=False)], False, SI),
        (WS, [add("a")], True, WS),
        (S, [META], False, S),  # a metadata action prevents the downgrade
    ],
)
def test_effective_isolation_level(
    table_level: IsolationLevel, actions: list[Action], changes_data: bool, expected: IsolationLevel
) -> None:
    assert effective_isolation_level(table_level, actions, changes_data=changes_data) is expected
