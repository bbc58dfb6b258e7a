"""Row-level concurrency on partitioned deletion-vector tables, cell by cell.

Beyond the Databricks contract (which stops at unpartitioned tables): writes that change
different rows of one data file in one partition both commit; only changing the same row
conflicts; OPTIMIZE conflicts only with ZORDER BY. The fallbacks are those of the
unpartitioned case (a MERGE without an explicit predicate on the target reads every
partition), and the partition rules of the file-level matrix still hold: new rows in a
partition the loser's predicate does not select never conflict.

The table: partition A holds two files (ids 1-4 and 5-8), partition B two more (11-14 and
15-18).
"""

from __future__ import annotations

import deltalake
import pyarrow as pa
import pytest
from deltalake import QueryBuilder

from eventlog import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    DeltaConcurrentModificationException,
    Table,
    Transaction,
)
from tests.conftest import SCHEMA, rows
from tests.eventlog.txn.test_row_level import Op, delete, update

SER, WS = "Serializable", "WriteSerializable"
DV = {"delta.enableDeletionVectors": "true"}
A, B = "2024-01-01", "2024-01-02"
HINT_A, HINT_B = f"[date={A}]", f"[date={B}]"


def _table(uri: str, level: str = WS) -> Table:
    t = Table.create(uri, SCHEMA, partition_by=["date"], properties={**DV, "delta.isolationLevel": level})
    for date, base in ((A, 0), (B, 10)):
        t.append(rows([base + 1, base + 2, base + 3, base + 4], date))
        t.append(rows([base + 5, base + 6, base + 7, base + 8], date))
    return t


def _x(t: Table) -> dict[int, int]:
    return {r["id"]: r["x"] for r in t.to_arrow().to_pylist()}


def merge(key: int, on_target: str = "explicit") -> Op:
    """MERGE one source row into ``key`` (in A); ``on_target``: the predicate on the target
    in ON: "explicit" (partition and key), "partition" (only the partition) or "none"."""

    def run(txn: Transaction) -> None:
        on = "t.id = s.id AND t.date = s.date"
        on += {"explicit": f" AND t.date = '{A}' AND t.id = {key}", "partition": f" AND t.date = '{A}'"}.get(
            on_target, ""
        )
        src = rows([key], A, x=key + 2000)
        txn.merge(src, on, source_alias="s", target_alias="t").when_matched_update(set={"x": "s.x"}).execute()
        txn.commit()

    return run


def insert(key: int, date: str = A) -> Op:
    def run(txn: Transaction) -> None:
        txn.append(rows([key], date))
        txn.commit()

    return run


def optimize(zorder: bool = False) -> Op:
    def run(txn: Transaction) -> None:
        txn.optimize(zorder_by=["x"] if zorder else None, partition_filter=f"date = '{A}'")
        txn.commit()

    return run


def in_a(cond: str) -> str:
    return f"date = '{A}' AND {cond}"


BASE = {i: i for i in [*range(1, 9), *range(11, 19)]}
DCME = DeltaConcurrentModificationException
# (name, first, second, level, expected exception, its partition hint, {id: x} afterwards; -1: gone)
CASES: list[tuple[str, Op, Op, str, type[Exception] | None, str | None, dict[int, int]]] = [
    ("insert/insert", insert(10), insert(11), WS, None, None, {**BASE, 10: 10, 11: 11}),
    # The inserted row 1 stays (the DELETE did not see it): as if the DELETE ran first.
    ("dml after insert WS", insert(1), delete(in_a("id = 1")), WS, None, None, BASE),
    ("dml after insert SER other row", insert(10), delete(in_a("id = 1")), SER, None, None,
     {**BASE, 10: 10, 1: -1}),
    ("dml after insert SER same row", insert(1), delete(in_a("id = 1")), SER, ConcurrentAppendException,
     HINT_A, {}),
    ("dml after insert SER other partition", insert(1, B), delete(in_a("id = 1")), SER, None, None, BASE),
    ("data-only dml after insert SER", insert(1, B), delete("id = 1"), SER, ConcurrentAppendException,
     HINT_B, {}),
    ("delete/delete other rows", delete(in_a("id = 1")), delete(in_a("id = 2")), WS, None, None,
     BASE | {1: -1, 2: -1}),
    ("data-only delete/delete other rows", delete("id = 1"), delete("id = 2"), SER, None, None,
     BASE | {1: -1, 2: -1}),
    ("update/update other rows", update(in_a("id = 1")), update(in_a("id = 2")), WS, None, None,
     BASE | {1: 1001, 2: 1002}),
    ("delete/update other rows", delete(in_a("id = 1")), update(in_a("id = 2")), SER, None, None,
     BASE | {1: -1, 2: 1002}),
    ("merge/merge other rows", merge(1), merge(2), WS, None, None, BASE | {1: 2001, 2: 2002}),
    ("delete/delete same row", delete(in_a("id = 1")), delete(in_a("id = 1")), WS,
     ConcurrentDeleteReadException, HINT_A, {}),
    ("update/delete same row", update(in_a("id = 3")), delete(in_a("id = 3")), WS, DCME, None, {}),
    ("merge w/o target predicate", merge(1, "none"), merge(2, "none"), WS, ConcurrentAppendException,
     HINT_A, {}),
    ("merge with a partition-only target predicate", merge(1, "partition"), merge(2, "partition"), WS,
     ConcurrentAppendException, HINT_A, {}),
    ("dml in other partitions", delete(in_a("id = 1")), delete(f"date = '{B}' AND id = 11"), SER, None,
     None, BASE | {1: -1, 11: -1}),
    ("optimize after insert", insert(10), optimize(), WS, None, None, {**BASE, 10: 10}),
    ("optimize after dml", delete(in_a("id = 1")), optimize(), WS, None, None, BASE | {1: -1}),
    ("zorder after dml", delete(in_a("id = 1")), optimize(True), WS, DCME, None, {}),
    ("dml after optimize", optimize(), delete(in_a("id = 6")), WS, None, None, BASE | {6: -1}),
    ("update after optimize", optimize(), update(in_a("id = 2")), SER, None, None, BASE | {2: 1002}),
    ("dml after zorder", optimize(True), delete(in_a("id = 6")), WS, DCME, None, {}),
    ("optimize/optimize", optimize(), optimize(), WS, None, None, BASE),
    ("zorder/zorder", optimize(True), optimize(True), WS, DCME, None, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("first", "second", "level", "expected", "hint", "after"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_partitioned_row_level_matrix(
    local_uri: str,
    first: Op,
    second: Op,
    level: str,
    expected: type[Exception] | None,
    hint: str | None,
    after: dict[int, int],
) -> None:
    t = _table(local_uri, level)
    pinned = Table.open(local_uri).transaction()
    first(t.transaction())
    winner = t.version
    if expected is not None:
        before = _x(t)
        with pytest.raises(expected) as info:
            second(pinned)
        err = info.value
        assert isinstance(err, DeltaConcurrentModificationException)
        assert err.winning_version == winner
        assert err.partition in ((hint,) if hint is not None else (None, HINT_A))
        assert t.version == winner
        assert _x(Table.open(local_uri)) == before
        return
    second(pinned)
    assert t.version == winner + 1
    want = {k: v for k, v in after.items() if v != -1}
    assert _x(t) == want
    # A fresh replay agrees, and so does delta-rs (which applies our deletion vectors).
    assert _x(Table.open(local_uri)) == want
    dt = deltalake.DeltaTable(local_uri)
    got = pa.table(QueryBuilder().register("t", dt).execute("select id, x from t").read_all())
    assert {r["id"]: r["x"] for r in got.to_pylist()} == want
    assert Table.open(local_uri).verify().ok


def test_three_stacked_disjoint_deletes_in_one_file_all_commit(local_uri: str) -> None:
    t = _table(local_uri)
    txns = [Table.open(local_uri).transaction() for _ in range(3)]
    for i, txn in enumerate(txns):
        txn.delete(in_a(f"id = {i + 1}"))
    versions = [txn.commit().version for txn in txns]
    assert versions == [t.version - 2, t.version - 1, t.version]
    assert sorted(_x(t)) == [4, 5, 6, 7, 8, *range(11, 19)]
    (merged,) = [a for a in t.snapshot().add_files if a.deletion_vector is not None]
    assert merged.deletion_vector.cardinality == 3
    assert merged.partition_values == {"date": A}


def test_compaction_outputs_stay_in_their_partition(local_uri: str) -> None:
    """A compaction that carries a concurrent delete across writes into the partition."""
    t = _table(local_uri)
    loser = Table.open(local_uri).transaction()
    loser.optimize(partition_filter=f"date = '{A}'")
    t.delete(in_a("id = 7"))
    loser.commit()
    in_a_files = [a for a in t.snapshot().add_files if a.partition_values == {"date": A}]
    assert len(in_a_files) == 1 and in_a_files[0].path.startswith("date=2024-01-01/")
    assert in_a_files[0].deletion_vector is not None and in_a_files[0].deletion_vector.cardinality == 1
    assert sorted(_x(t)) == [1, 2, 3, 4, 5, 6, 8, *range(11, 19)]
