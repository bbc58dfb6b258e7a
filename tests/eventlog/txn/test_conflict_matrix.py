"""The conflict matrix of the reference (file-level, no row-level concurrency), cell by cell.

Each scenario: two handles on one table. The second operation's transaction is opened
(pinning its read snapshot) before the first operation commits; then the second runs its
operation against that snapshot and commits. Rows: the operation committing second;
columns: the one committing first. "can conflict" cells conflict when the two touch the
same files (the unpartitioned rows below) and do not when they touch disjoint partitions.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

from eventlog import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    DeltaConcurrentModificationException,
    Table,
    Transaction,
)
from tests.conftest import SCHEMA, rows, sorted_ids

SER = "Serializable"
WS = "WriteSerializable"

Op = Callable[[Transaction, str, bool], None]


def _insert(txn: Transaction, date: str, partitioned: bool) -> None:
    txn.append(rows([100], date))
    txn.commit()


def _update(txn: Transaction, date: str, partitioned: bool) -> None:
    txn.update(f"date = '{date}' AND x >= 1", set={"y": "y + 1"})
    txn.commit()


def _delete(txn: Transaction, date: str, partitioned: bool) -> None:
    txn.delete(f"date = '{date}' AND x = 1")
    txn.commit()


def _merge(txn: Transaction, date: str, partitioned: bool) -> None:
    src = rows([1, 3], date).set_column(3, "y", pa.array([-1.0, -3.0]))
    txn.merge(src, f"t.id = s.id AND t.date = '{date}'", source_alias="s", target_alias="t") \
        .when_matched_update_all().execute()  # fmt: skip
    txn.commit()


def _optimize(txn: Transaction, date: str, partitioned: bool) -> None:
    txn.optimize(partition_filter=f"date = '{date}'" if partitioned else None)
    txn.commit()


OPS: dict[str, Op] = {
    "INSERT": _insert,
    "UPDATE": _update,
    "DELETE": _delete,
    "MERGE": _merge,
    "OPTIMIZE": _optimize,
}
DML = ("UPDATE", "DELETE", "MERGE")

# (second, first) -> expected outcome per isolation level, same files (unpartitioned table).
# None = both commit. Derived from the reference matrix and Delta Spark's check order.
SAME_FILES: dict[tuple[str, str], dict[str, type[Exception] | None]] = {}
for _first in OPS:
    for _second in OPS:
        cell: dict[str, type[Exception] | None]
        if _second == "INSERT":
            cell = {SER: None, WS: None}  # a blind append cannot conflict
        elif _second in DML and _first == "INSERT":
            cell = {SER: ConcurrentAppendException, WS: None}
        elif _second in DML:
            # DML or OPTIMIZE winners add non-blind files to the (unpartitioned) table read.
            cell = {SER: ConcurrentAppendException, WS: ConcurrentAppendException}
        elif _first == "INSERT":
            cell = {SER: None, WS: None}  # OPTIMIZE vs INSERT: cannot conflict
        else:
            # OPTIMIZE (snapshot isolation: no append check) vs a winner that removed a
            # file it read.
            cell = {SER: ConcurrentDeleteReadException, WS: ConcurrentDeleteReadException}
        SAME_FILES[(_second, _first)] = cell

CASES = [
    pytest.param(second, first, level, expected, id=f"{second}-after-{first}-{level}")
    for (second, first), cells in SAME_FILES.items()
    for level, expected in cells.items()
]


def _seed(uri: str, level: str, partitioned: bool) -> Table:
    t = Table.create(
        uri,
        SCHEMA,
        partition_by=["date"] if partitioned else None,
        properties={"delta.isolationLevel": level},
    )
    for date in ("2024-01-01", "2024-01-02"):
        t.append(rows([1, 2], date))
        t.append(rows([3, 4], date))
    return t


@pytest.mark.parametrize(("second", "first", "level", "expected"), CASES)
def test_matrix_same_files(
    local_uri: str, second: str, first: str, level: str, expected: type[Exception] | None
) -> None:
    t1 = _seed(local_uri, level, partitioned=False)
    t2 = Table.open(local_uri)
    pinned = t2.transaction()
    OPS[first](t1.transaction(), "2024-01-01", False)
    winner_version = t1.version
    if expected is None:
        OPS[second](pinned, "2024-01-01", False)
        assert t2.version == winner_version + 1
        assert t2.history(1)[0]["operation"] in {"WRITE", "UPDATE", "DELETE", "MERGE", "OPTIMIZE"}
    else:
        with pytest.raises(expected) as info:
            OPS[second](pinned, "2024-01-01", False)
        err = info.value
        assert isinstance(err, DeltaConcurrentModificationException)
        assert err.winning_version == winner_version
        assert err.operation == t1.history(1)[0]["operation"]
        assert t2.version == winner_version  # the loser wrote nothing


@pytest.mark.parametrize(
    ("second", "first"),
    [(s, f) for s in OPS for f in OPS],
)
@pytest.mark.parametrize("level", [SER, WS])
def test_matrix_disjoint_partitions_never_conflict(
    local_uri: str, second: str, first: str, level: str
) -> None:
    """Every "can conflict" cell becomes "no conflict" when the two touch different partitions."""
    t1 = _seed(local_uri, level, partitioned=True)
    t2 = Table.open(local_uri)
    pinned = t2.transaction()
    OPS[first](t1.transaction(), "2024-01-01", True)
    OPS[second](pinned, "2024-01-02", True)
    assert t2.version == t1.version
    assert len(t2.history()) == 1 + 4 + 2


def test_delete_vs_insert_example(tmp_path: object) -> None:
    """A long DELETE and an INSERT both start at v0; INSERT commits v1, DELETE tries v2."""
    for level, expect_conflict in ((SER, True), (WS, False)):
        uri = f"{tmp_path}/{level}"
        t = Table.create(uri, SCHEMA, properties={"delta.isolationLevel": level})
        t.append(rows([1, 2, 3]))
        deleter = Table.open(uri).transaction()
        deleter.delete("x >= 1")  # reads the table as of v1
        t.append(rows([10, 11]))  # the INSERT commits first
        if expect_conflict:
            with pytest.raises(ConcurrentAppendException) as info:
                deleter.commit()
            assert info.value.isolation_level == SER
            assert info.value.operation == "WRITE"
            assert sorted_ids(t) == [1, 2, 3, 10, 11]
        else:
            result = deleter.commit()
            assert result.version == 3
            # As if the DELETE ran before the INSERT: the inserted rows stay.
            assert sorted_ids(t) == [10, 11]
            ops = [h["operation"] for h in t.history()]
            assert ops == ["DELETE", "WRITE", "WRITE", "CREATE TABLE"]


@pytest.mark.parametrize("partitioned", [False, True])
def test_update_after_date_vs_delete_before_date(local_uri: str, partitioned: bool) -> None:
    """UPDATE ... WHERE date > X and DELETE ... WHERE date < X: conflict only when unpartitioned."""
    t = Table.create(local_uri, SCHEMA, partition_by=["date"] if partitioned else None)
    t.append(pa.concat_tables([rows([1], "2009-06-01"), rows([2], "2011-06-01")]))
    updater = Table.open(local_uri).transaction()
    t.delete("date < '2010-01-01'")
    updater.update("date > '2010-01-01'", set={"x": "x + 100"})
    if partitioned:
        updater.commit()
        out = t.to_arrow().to_pylist()
        assert [(r["id"], r["x"]) for r in out] == [(2, 102)]
    else:
        with pytest.raises(ConcurrentAppendException) as info:
            updater.commit()
        assert info.value.partition is None  # unpartitioned: no partition hint
        assert info.value.operation == "DELETE"


def test_two_replace_where_on_one_partition_append_beats_delete(local_uri: str) -> None:
    """The loser gets ConcurrentAppend, not DeleteDelete: the append check runs first."""
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(rows([1, 2], "2024-01-01"))
    loser = Table.open(local_uri).transaction()
    loser.overwrite(rows([7], "2024-01-01"), replace_where="date = '2024-01-01'")
    t.overwrite(rows([8], "2024-01-01"), replace_where="date = '2024-01-01'")
    with pytest.raises(ConcurrentAppendException) as info:
        loser.commit()
    assert info.value.partition == "[date=2024-01-01]"
    assert sorted_ids(t) == [8]


def test_merge_with_explicit_partition_predicate(tmp_path: object) -> None:
    """MERGEs whose ON names disjoint partitions both commit; without it the second fails."""
    schema = pa.schema(
        [("id", pa.int64()), ("date", pa.string()), ("country", pa.string()), ("v", pa.int64())]
    )

    def data(ids: list[int], date: str, country: str, v: int) -> pa.Table:
        n = len(ids)
        return pa.table(
            {"id": ids, "date": [date] * n, "country": [country] * n, "v": [v] * n}, schema=schema
        )

    for explicit in (True, False):
        uri = f"{tmp_path}/explicit-{explicit}"
        t = Table.create(uri, schema, partition_by=["date", "country"])
        t.append(data([1, 2], "2024-01-01", "FR", 0))
        t.append(data([1, 2], "2024-01-02", "DE", 0))

        def merge(txn: Transaction, date: str, country: str, explicit: bool = explicit) -> None:
            on = "t.id = s.id"
            if explicit:
                on += f" AND t.date = '{date}' AND t.country = '{country}'"
            txn.merge(data([1, 3], date, country, 9), on, source_alias="s", target_alias="t") \
                .when_matched_update_all().when_not_matched_insert_all().execute()  # fmt: skip
            txn.commit()

        second = Table.open(uri).transaction()
        merge(t.transaction(), "2024-01-01", "FR")
        if explicit:
            merge(second, "2024-01-02", "DE")
            got = sorted((r["date"], r["id"], r["v"]) for r in t.to_arrow().to_pylist())
            assert got == [
                ("2024-01-01", 1, 9), ("2024-01-01", 2, 0), ("2024-01-01", 3, 9),
                ("2024-01-02", 1, 9), ("2024-01-02", 2, 0), ("2024-01-02", 3, 9),
            ]  # fmt: skip
        else:
            with pytest.raises(ConcurrentAppendException) as info:
                merge(second, "2024-01-02", "DE")
            assert info.value.partition == "[date=2024-01-01, country=FR]"
            assert info.value.operation == "MERGE"
