"""Deletion vectors and the row-level concurrency matrix of the reference, cell by cell.

Tables here have ``delta.enableDeletionVectors = true`` and no partition columns (the
partitioned case: ``test_row_level_partitioned``), which turns on row-level concurrency:
writes that change different rows of one data file both commit; only changing the same
row conflicts. OPTIMIZE conflicts only with ZORDER BY.
"""

from __future__ import annotations

from collections.abc import Callable

import deltalake
import pyarrow as pa
import pytest
from deltalake import QueryBuilder

from eventlog import (
    ConcurrentAppendException,
    DeltaConcurrentModificationException,
    Table,
    Transaction,
)
from tests.conftest import SCHEMA, rows, sorted_ids

SER, WS = "Serializable", "WriteSerializable"
DV = {"delta.enableDeletionVectors": "true"}


def _table(uri: str, level: str = WS) -> Table:
    t = Table.create(uri, SCHEMA, properties={**DV, "delta.isolationLevel": level})
    t.append(rows([1, 2, 3, 4]))
    t.append(rows([5, 6, 7, 8]))
    return t


def _x(t: Table) -> dict[int, int]:
    return {r["id"]: r["x"] for r in t.to_arrow().to_pylist()}


def test_delete_writes_a_deletion_vector_that_delta_rs_reads(local_uri: str) -> None:
    t = _table(local_uri)
    files_before = set(t.files())
    res = t.delete("id = 2 OR id = 7")
    assert res.metrics["numDeletedRows"] == "2"
    assert set(t.files()) == files_before  # no file was rewritten
    adds = t.snapshot().add_files
    assert sorted(a.deletion_vector.cardinality for a in adds if a.deletion_vector) == [1, 1]
    # Their statistics still count the deleted rows: wide bounds, as Delta Spark requires.
    stats = [a.parsed_stats() for a in adds if a.deletion_vector]
    assert [(s["numRecords"], s["tightBounds"]) for s in stats if s] == [(4, False), (4, False)]
    assert t.snapshot().protocol.reader_features == ("deletionVectors",)
    assert sorted_ids(t) == [1, 3, 4, 5, 6, 8]
    dt = deltalake.DeltaTable(local_uri)
    got = pa.table(QueryBuilder().register("t", dt).execute("select id from t").read_all())
    assert sorted(got.column("id").to_pylist()) == [1, 3, 4, 5, 6, 8]
    t.update("id = 3", set={"x": "x * 100"})
    assert _x(t) == {1: 1, 3: 300, 4: 4, 5: 5, 6: 6, 8: 8}
    t.delete("id <= 4")  # every live row of the first file: the file is removed
    assert sorted_ids(t) == [5, 6, 8]


def test_enabling_deletion_vectors_upgrades_the_protocol(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1, 2]))
    assert t.snapshot().protocol.min_writer_version == 2
    t.set_properties(DV)
    proto = t.snapshot().protocol
    assert (proto.min_reader_version, proto.min_writer_version) == (3, 7)
    assert "deletionVectors" in (proto.writer_features or ())
    t.delete("id = 1")
    assert sorted_ids(t) == [2]


Op = Callable[[Transaction], None]


def delete(pred: str) -> Op:
    def run(txn: Transaction) -> None:
        txn.delete(pred)
        txn.commit()

    return run


def update(pred: str) -> Op:
    def run(txn: Transaction) -> None:
        txn.update(pred, set={"x": "x + 1000"})
        txn.commit()

    return run


def merge(key: int, explicit: bool = True) -> Op:
    def run(txn: Transaction) -> None:
        on = "t.id = s.id" + (f" AND t.id = {key}" if explicit else "")
        src = rows([key], x=key + 2000)
        txn.merge(src, on, source_alias="s", target_alias="t").when_matched_update(set={"x": "s.x"}).execute()
        txn.commit()

    return run


def insert(key: int) -> Op:
    def run(txn: Transaction) -> None:
        txn.append(rows([key]))
        txn.commit()

    return run


def optimize(zorder: bool = False) -> Op:
    def run(txn: Transaction) -> None:
        txn.optimize(zorder_by=["x"] if zorder else None)
        txn.commit()

    return run


# (name, first, second, level, expected exception or None, expected {id: x} afterwards)
BASE = {i: i for i in range(1, 9)}
CASES: list[tuple[str, Op, Op, str, type[Exception] | None, dict[int, int]]] = [
    ("insert/insert", insert(10), insert(11), WS, None, {**BASE, 10: 10, 11: 11}),
    ("dml after insert WS", insert(10), delete("id = 1"), WS, None, {**BASE, 10: 10} | {1: -1}),
    ("dml after insert SER other row", insert(10), delete("id = 1"), SER, None, {**BASE, 10: 10} | {1: -1}),
    ("dml after insert SER same row", insert(1), delete("id = 1"), SER, ConcurrentAppendException, {}),
    ("delete/delete other rows", delete("id = 1"), delete("id = 2"), WS, None, BASE | {1: -1, 2: -1}),
    ("update/update other rows", update("id = 1"), update("id = 2"), WS, None, BASE | {1: 1001, 2: 1002}),
    ("delete/update other rows", delete("id = 1"), update("id = 2"), SER, None, BASE | {1: -1, 2: 1002}),
    ("merge/merge other rows", merge(1), merge(2), WS, None, BASE | {1: 2001, 2: 2002}),
    (
        "delete/delete same row",
        delete("id = 1"),
        delete("id = 1"),
        WS,
        DeltaConcurrentModificationException,
        {},
    ),
    (
        "update/delete same row",
        update("id = 3"),
        delete("id = 3"),
        WS,
        DeltaConcurrentModificationException,
        {},
    ),
    ("merge w/o target predicate", merge(1, False), merge(2, False), WS, ConcurrentAppendException, {}),
    ("optimize after insert", insert(10), optimize(), WS, None, {**BASE, 10: 10}),
    ("optimize after dml", delete("id = 1"), optimize(), WS, None, BASE | {1: -1}),
    ("zorder after dml", delete("id = 1"), optimize(True), WS, DeltaConcurrentModificationException, {}),
    ("dml after optimize", optimize(), delete("id = 6"), WS, None, BASE | {6: -1}),
    ("update after optimize", optimize(), update("id = 2"), SER, None, BASE | {2: 1002}),
    ("dml after zorder", optimize(True), delete("id = 6"), WS, DeltaConcurrentModificationException, {}),
    ("optimize/optimize", optimize(), optimize(), WS, None, BASE),
    ("zorder/zorder", optimize(True), optimize(True), WS, DeltaConcurrentModificationException, {}),
]


@pytest.mark.parametrize(
    ("first", "second", "level", "expected", "after"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_row_level_matrix(
    local_uri: str, first: Op, second: Op, level: str, expected: type[Exception] | None, after: dict[int, int]
) -> None:
    t = _table(local_uri, level)
    pinned = Table.open(local_uri).transaction()
    first(t.transaction())
    winner = t.version
    if expected is not None:
        with pytest.raises(expected) as info:
            second(pinned)
        assert isinstance(info.value, DeltaConcurrentModificationException)
        assert info.value.winning_version == winner
        assert t.version == winner
        return
    second(pinned)
    assert t.version == winner + 1
    want = {k: v for k, v in after.items() if v != -1}
    assert _x(t) == want
    # A fresh replay agrees, and so does delta-rs (which applies our deletion vectors).
    fresh = Table.open(local_uri)
    assert _x(fresh) == want
    dt = deltalake.DeltaTable(local_uri)
    got = pa.table(QueryBuilder().register("t", dt).execute("select id, x from t").read_all())
    assert {r["id"]: r["x"] for r in got.to_pylist()} == want


def test_three_stacked_disjoint_deletes_all_commit(local_uri: str) -> None:
    t = _table(local_uri)
    txns = [Table.open(local_uri).transaction() for _ in range(3)]
    for i, txn in enumerate(txns):
        txn.delete(f"id = {i + 1}")
    for txn in txns:
        txn.commit()
    assert sorted_ids(t) == [4, 5, 6, 7, 8]
    dv = [a.deletion_vector for a in t.snapshot().add_files if a.deletion_vector is not None]
    assert [d.cardinality for d in dv] == [3]
    # Rebased over the winners' deletion vectors, the statistics stay wide.
    (merged,) = [a for a in t.snapshot().add_files if a.deletion_vector is not None]
    assert (merged.parsed_stats() or {})["tightBounds"] is False


def test_data_files_of_a_dropped_compaction_are_cleaned_up(local_uri: str) -> None:
    t = _table(local_uri)
    loser = Table.open(local_uri).transaction()
    loser.optimize()
    t.optimize()
    loser.commit()
    from pathlib import Path

    on_disk = {p.name for p in Path(local_uri).glob("*.parquet")}
    assert on_disk >= {Path(f).name for f in t.files()}
    assert len(on_disk) == 3  # 2 originals (tombstoned) + the winner's output; the loser's is gone
    assert len(t.files()) == 1 and sorted_ids(t) == list(range(1, 9))
    assert pa.types.is_int64(t.schema.field("id").type)
