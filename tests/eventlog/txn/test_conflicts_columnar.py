"""The conflict checker's file checks on Arrow columns: the same verdicts and partition hints
as a per-file reference, for map layouts other writers produce too."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import expr as ex
from eventlog.errors import ConcurrentAppendException
from eventlog.files.schema import partition_values_table, to_spark_schema_json
from eventlog.log.actions import AddFile, CommitInfo, DeletionVectorDescriptor, Metadata, Protocol, RemoveFile
from eventlog.log.commit import Commit
from eventlog.log.filetable import ADD_SCHEMA, STRING_MAP, adds_table
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.txn.conflicts import (
    ReadSet,
    TransactionSummary,
    WinningCommit,
    _first_matching,
    check_conflicts,
)

SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("day", pa.int32())])
PART = pa.schema([("region", pa.string()), ("day", pa.int32())])
META = Metadata(id="t", schema_string=to_spark_schema_json(SCHEMA), partition_columns=("region", "day"))


def _add(path: str, values: dict[str, str | None], stats: str | None = None, **kw: object) -> AddFile:
    return AddFile(path, values, 10, 1, stats=stats, **kw)  # type: ignore[arg-type]


def _summary(preds: list[ex.Expr], **kw: object) -> TransactionSummary:
    fields: dict[str, object] = {
        "table": "/t",
        "read_version": 1,
        "read_protocol": Protocol(1, 2),
        "read_metadata": META,
        "partition_schema": PART,
        "read_set": ReadSet(tuple(preds)),
        "isolation_level": IsolationLevel.WRITE_SERIALIZABLE,
        "is_blind_append": False,
    }
    fields.update(kw)
    return TransactionSummary(**fields)  # type: ignore[arg-type]


def _winner(*adds: AddFile | RemoveFile) -> WinningCommit:
    return WinningCommit.of(Commit(7, (CommitInfo(timestamp=1, operation="WRITE"), *adds)))


def _reference(preds: list[ex.Expr], adds: list[AddFile]) -> AddFile | None:
    """The per-file rule: the first predicate any file satisfies, and its first such file."""
    if any(isinstance(p, ex.Literal) and p.value is True for p in preds):
        return adds[0] if adds else None
    for pred in preds:
        for a in adds:
            if ex.evaluate_mask(pred, partition_values_table([a.partition_values], PART))[0].as_py():
                return a
    return None


def test_hint_names_the_first_matching_file_of_the_first_matching_predicate() -> None:
    east = ex.parse_predicate("region = 'east'", SCHEMA)
    late = ex.parse_predicate("day > 5", SCHEMA)
    w = _winner(
        _add("a", {"region": "west", "day": "1"}),
        _add("b", {"region": "west", "day": "9"}),
        _add("c", {"region": "east", "day": "2"}),
        _add("d", {"region": "east", "day": "9"}),
    )
    with pytest.raises(ConcurrentAppendException) as info:
        check_conflicts(_summary([east, late]), w)
    assert info.value.partition == "[region=east, day=2]"  # east is asked first
    with pytest.raises(ConcurrentAppendException) as info:
        check_conflicts(_summary([late, east]), w)
    assert info.value.partition == "[region=west, day=9]"
    none = _summary([ex.parse_predicate("region = 'north'", SCHEMA)])
    assert check_conflicts(none, w) == none


def test_missing_keys_empty_strings_and_odd_key_order() -> None:
    """Foreign writers: a key left out or "" (both null), keys in another order."""
    is_null = ex.parse_predicate("region IS NULL", SCHEMA)
    w = _winner(
        _add("a", {"day": "3", "region": "west"}),
        _add("b", {"day": "4"}),
        _add("c", {"region": "", "day": "5"}),
    )
    with pytest.raises(ConcurrentAppendException) as info:
        check_conflicts(_summary([is_null]), w)
    assert info.value.partition == "[region=null, day=4]"
    day5 = ex.parse_predicate("day = 5 AND region IS NULL", SCHEMA)
    with pytest.raises(ConcurrentAppendException) as info:
        check_conflicts(_summary([day5]), w)
    assert info.value.partition == "[region=, day=5]"  # the file's own (raw) values


def test_a_winner_built_without_its_commit_has_the_same_table() -> None:
    adds = (_add("a", {"region": "x", "day": "1"}), _add("b", {"region": "y", "day": "2"}))
    direct = WinningCommit(7, None, None, None, adds, (), frozenset(), ())
    assert direct.add_table.equals(_winner(*adds).add_table)
    assert direct.add_table.schema.equals(ADD_SCHEMA)


_values = st.fixed_dictionaries(
    {},
    optional={
        "region": st.sampled_from(["east", "west", "", "n\x00orth"]) | st.none(),
        "day": st.sampled_from(["1", "2", "10", ""]) | st.none(),
    },
)
_preds = st.lists(
    st.sampled_from(
        [
            "region = 'east'",
            "day >= 2",
            "region IS NULL",
            "day IS NULL AND region <> 'west'",
            "region = 'n\\x00orth' OR day = 10",
            "TRUE",
        ]
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(_values, min_size=1, max_size=12), sqls=_preds)
def test_first_matching_agrees_with_the_per_file_rule(
    values: list[dict[str, str | None]], sqls: list[str]
) -> None:
    adds = [_add(f"f{i}", v) for i, v in enumerate(values)]
    preds = [ex.TRUE if s == "TRUE" else ex.parse_predicate(s, SCHEMA) for s in sqls]
    got = _first_matching(preds, adds_table(adds), PART)
    assert got == _reference(preds, adds)


def test_map_column_with_several_chunks_and_a_slice() -> None:
    adds = [_add(f"f{i}", {"region": "r" + str(i % 3), "day": str(i)}) for i in range(9)]
    table = adds_table(adds)
    chunked = pa.concat_tables([table.slice(0, 4), table.slice(4)])
    pred = [ex.parse_predicate("region = 'r2' AND day > 3", SCHEMA)]
    assert _first_matching(pred, chunked, PART) == adds[5]
    assert _first_matching(pred, table.slice(6), PART) == adds[8]
    one = pa.schema([("region", pa.string())])
    single = pa.Table.from_arrays(
        [table.column("path"), pa.array([[("region", f"r{i % 3}")] for i in range(9)], STRING_MAP)],
        names=["path", "partitionValues"],
    )
    assert _first_matching([ex.parse_predicate("region = 'r1'", SCHEMA)], single.slice(2), one) == (
        AddFile("f4", {"region": "r1"}, 0, 0)
    )


# --------------------------------------------------------------------------- row level

DATA = pa.schema([("id", pa.int64())])
UNPART = Metadata(id="t", schema_string=to_spark_schema_json(DATA))


def _stats(lo: int, hi: int) -> str:
    return orjson.dumps({"numRecords": 5, "minValues": {"id": lo}, "maxValues": {"id": hi}}).decode()


def _row_level(pred: str) -> TransactionSummary:
    p = ex.parse_predicate(pred, DATA)
    return _summary(
        [ex.TRUE], read_metadata=UNPART, partition_schema=pa.schema([]), row_level=True, data_schema=DATA,
        read_set=ReadSet((ex.TRUE,), predicates=(p,)),
    )  # fmt: skip


def test_row_level_new_rows_are_checked_by_their_statistics() -> None:
    t = _row_level("id = 50")
    assert check_conflicts(t, _winner(_add("a", {}, _stats(0, 10)))) == t
    with pytest.raises(ConcurrentAppendException):
        check_conflicts(t, _winner(_add("a", {}, _stats(0, 10)), _add("b", {}, _stats(40, 60))))
    with pytest.raises(ConcurrentAppendException):  # no statistics: may match
        check_conflicts(t, _winner(_add("c", {})))


def test_row_level_skips_dv_re_adds_and_compaction_outputs() -> None:
    t = _row_level("id = 50")
    dv = DeletionVectorDescriptor("i", "abc", size_in_bytes=4, cardinality=1)
    re_add = _winner(RemoveFile("b", 1), _add("b", {}, _stats(40, 60), deletion_vector=dv))
    assert check_conflicts(t, re_add) == t
    compacted = _winner(_add("q", {}, _stats(40, 60), data_change=False))
    assert check_conflicts(t, compacted) == t
    plain_re_add = _winner(RemoveFile("b", 1), _add("b", {}, _stats(40, 60)))  # no DV: new rows
    with pytest.raises(ConcurrentAppendException):
        check_conflicts(t, plain_re_add)
