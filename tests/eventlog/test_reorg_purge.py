"""REORG TABLE ... APPLY (PURGE): ``Table.reorg_purge`` rewrites the files that carry
deletion vectors so the deleted rows are physically gone, with OPTIMIZE's isolation
semantics (``dataChange = false``; row-level resolution on deletion-vector tables)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import QueryBuilder

from eventlog import DeltaConcurrentModificationException, Table, Transaction
from eventlog.errors import InvalidInputError
from tests.conftest import SCHEMA, rows, sorted_ids

DV = {"delta.enableDeletionVectors": "true"}
A, B = "2024-01-01", "2024-01-02"


def _table(uri: str, *, partitioned: bool = False) -> Table:
    t = Table.create(uri, SCHEMA, partition_by=["date"] if partitioned else None, properties=DV)
    for date, base in ((A, 0), (B, 10)):
        t.append(rows([base + 1, base + 2, base + 3, base + 4], date))
        t.append(rows([base + 5, base + 6, base + 7, base + 8], date))
    return t


def _ids_on_disk(uri: str) -> set[int]:
    """Every id stored in any Parquet data file under the table, deleted or not."""
    out: set[int] = set()
    for path in Path(uri).rglob("*.parquet"):
        if "_delta_log" not in path.parts:
            out |= set(pq.read_table(path, columns=["id"]).column("id").to_pylist())
    return out


def _delta_rs_ids(uri: str) -> list[int]:
    dt = deltalake.DeltaTable(uri)
    got = pa.table(QueryBuilder().register("t", dt).execute("select id from t").read_all())
    return sorted(got.column("id").to_pylist())


def test_purge_rewrites_the_files_with_deletion_vectors(local_uri: str) -> None:
    t = _table(local_uri)
    t.delete("id IN (2, 6)")  # deletion vectors on the first two files
    clean = {a.path for a in t.snapshot().add_files if a.deletion_vector is None}
    before = t.version
    result = t.reorg_purge()
    assert result.version == before + 1 and result.operation == "REORG"
    assert result.metrics["numDeletionVectorsRemoved"] == "2"
    assert (result.metrics["numRemovedFiles"], result.metrics["numAddedFiles"]) == ("2", "1")
    adds = t.snapshot().add_files
    assert all(a.deletion_vector is None for a in adds)
    assert clean <= {a.path for a in adds}  # files without deletion vectors are left alone
    assert sorted_ids(t) == [1, 3, 4, 5, 7, 8, *range(11, 19)]
    (info,) = t.history(1)
    assert info["operation"] == "REORG"
    assert info["operationParameters"] == {"predicate": "[]", "applyPurge": "true"}
    assert info["isBlindAppend"] is False
    commit = Path(local_uri, "_delta_log", f"{result.version:020d}.json").read_text().splitlines()
    actions = [json.loads(line) for line in commit]
    removes = [a["remove"] for a in actions if "remove" in a]
    new = [a["add"] for a in actions if "add" in a]
    assert len(removes) == 2 and all(r["dataChange"] is False and r["deletionVector"] for r in removes)
    assert len(new) == 1 and new[0]["dataChange"] is False and new[0].get("deletionVector") is None
    assert _delta_rs_ids(local_uri) == sorted_ids(t)


def test_where_limits_the_purge_to_partitions(local_uri: str) -> None:
    t = _table(local_uri, partitioned=True)
    t.delete("id IN (2, 12)")  # one deletion vector per partition
    result = t.reorg_purge(f"date = '{B}'")
    assert result.metrics["numDeletionVectorsRemoved"] == "1"
    left = [a for a in t.snapshot().add_files if a.deletion_vector is not None]
    assert [a.partition_values for a in left] == [{"date": A}]
    rewritten = [a for a in t.snapshot().add_files if a.path.startswith(f"date={B}/") and not a.data_change]
    assert len(rewritten) == 1
    assert t.history(1)[0]["operationParameters"]["predicate"] == json.dumps([f"date = '{B}'"])
    assert sorted_ids(t) == [1, 3, 4, 5, 6, 7, 8, 11, 13, 14, 15, 16, 17, 18]


def test_where_may_only_use_partition_columns(local_uri: str) -> None:
    t = _table(local_uri, partitioned=True)
    t.delete("id = 2")
    with pytest.raises(InvalidInputError):
        t.reorg_purge("id = 2")
    assert t.history(1)[0]["operation"] == "DELETE"


def test_a_table_without_deletion_vectors_to_purge_commits_an_empty_reorg(local_uri: str) -> None:
    t = _table(local_uri)
    files = set(t.files())
    result = t.reorg_purge()
    assert result.operation == "REORG" and result.metrics["numDeletionVectorsRemoved"] == "0"
    assert set(t.files()) == files


def test_gdpr_delete_purge_vacuum_leaves_no_trace(local_uri: str) -> None:
    """After DELETE + REORG PURGE + VACUUM (retention 0, check off) the rows are in no file."""
    t = _table(local_uri, partitioned=True)
    t.delete("id IN (3, 14)")
    assert {3, 14} <= _ids_on_disk(local_uri)  # only marked deleted so far
    t.reorg_purge()
    assert {3, 14} <= _ids_on_disk(local_uri)  # still in the retired files
    deleted = t.vacuum(0, enforce_retention=False)
    assert deleted  # the retired data files (and deletion vector files)
    assert _ids_on_disk(local_uri).isdisjoint({3, 14})
    assert not list(Path(local_uri).rglob("deletion_vector_*.bin"))
    assert sorted_ids(t) == [1, 2, 4, 5, 6, 7, 8, 11, 12, 13, 15, 16, 17, 18]
    assert _delta_rs_ids(local_uri) == sorted_ids(t)
    report = Table.open(local_uri).verify()
    assert report.ok, report


# --------------------------------------------------------------------------- concurrency

Op = Callable[[Transaction], None]


def _delete(txn: Transaction) -> None:
    txn.delete(f"date = '{A}' AND id = 7")
    txn.commit()


def _update(txn: Transaction) -> None:
    txn.update(f"date = '{A}' AND id = 1", set={"x": "x + 100"})
    txn.commit()


def _append(txn: Transaction) -> None:
    txn.append(rows([20], A))
    txn.commit()


def _purge(partitioned: bool = True) -> Op:
    def run(txn: Transaction) -> None:
        txn.reorg_purge(where=f"date = '{A}'" if partitioned else None)
        txn.commit()

    return run


def _optimize(partitioned: bool) -> Op:
    def run(txn: Transaction) -> None:
        txn.optimize(partition_filter=f"date = '{A}'" if partitioned else None)
        txn.commit()

    return run


def _outcome(uri: str, first: Op, second: Op, *, row_level: bool, partitioned: bool) -> object:
    """The second operation's outcome (None or the exception type) and the contents."""
    t = _table(uri, partitioned=partitioned)
    t.delete(f"date = '{A}' AND id IN (2, 6)")  # both files of A carry a deletion vector
    if not row_level:  # the vectors stay, but writers fall back to file-level rules
        t.set_properties({"delta.enableDeletionVectors": "false"})
    pinned = Table.open(uri).transaction()
    first(t.transaction())
    winner = t.version
    try:
        second(pinned)
    except DeltaConcurrentModificationException as exc:
        assert exc.winning_version == winner and t.version == winner
        return type(exc), sorted_ids(t)
    assert t.version == winner + 1
    assert Table.open(uri).verify().ok
    return None, sorted_ids(t)


DML = {"DELETE": _delete, "UPDATE": _update}


@pytest.mark.parametrize("row_level", [True, False], ids=["row-level", "file-level"])
@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
@pytest.mark.parametrize("dml", sorted(DML))
@pytest.mark.parametrize("purge_first", [True, False], ids=["purge-first", "dml-first"])
def test_purge_against_dml_on_its_files_behaves_as_optimize(
    tmp_path: Path, row_level: bool, partitioned: bool, dml: str, purge_first: bool
) -> None:
    """A purge and a concurrent DELETE/UPDATE of a file it rewrites: the same outcome as
    OPTIMIZE compacting that file (both commit with row-level concurrency; otherwise the
    same conflict)."""
    outcomes = []
    for name, maintenance in (("purge", _purge(partitioned)), ("optimize", _optimize(partitioned))):
        first, second = (maintenance, DML[dml]) if purge_first else (DML[dml], maintenance)
        outcomes.append(_outcome(str(tmp_path / name), first, second, row_level=row_level,
                                 partitioned=partitioned))  # fmt: skip
    assert outcomes[0] == outcomes[1]
    expected, ids = outcomes[0]
    assert (expected is None) is row_level
    if row_level:
        assert (7 in ids) is (dml != "DELETE")


@pytest.mark.parametrize("purge_first", [True, False], ids=["purge-first", "append-first"])
@pytest.mark.parametrize("level", ["Serializable", "WriteSerializable"])
def test_concurrent_append_never_conflicts_with_a_purge(
    tmp_path: Path, purge_first: bool, level: str
) -> None:
    uri = str(tmp_path / "t")
    _table(uri, partitioned=True).set_properties({"delta.isolationLevel": level})
    t = Table.open(uri)
    t.delete(f"date = '{A}' AND id = 2")
    pinned = Table.open(uri).transaction()
    first, second = (_purge(), _append) if purge_first else (_append, _purge())
    first(t.transaction())
    second(pinned)
    assert sorted_ids(t) == [1, 3, 4, 5, 6, 7, 8, *range(11, 19), 20]
    assert [h["operation"] for h in t.history(2)] == (
        ["WRITE", "REORG"] if purge_first else ["REORG", "WRITE"]
    )
    assert all(a.deletion_vector is None for a in t.snapshot().add_files)


def test_a_purge_loses_nothing_a_concurrent_delete_removed(local_uri: str) -> None:
    """Row-level: the delete that won lands as a deletion vector on the purge's new file."""
    t = _table(local_uri)
    t.delete("id = 2")
    purge = Table.open(local_uri).transaction()
    purge.reorg_purge()
    t.delete("id = 3")
    purge.commit()
    assert sorted_ids(t) == [1, 4, 5, 6, 7, 8, *range(11, 19)]
    (carried,) = [a for a in t.snapshot().add_files if a.deletion_vector is not None]
    assert carried.deletion_vector.cardinality == 1 and not carried.data_change
    assert _delta_rs_ids(local_uri) == sorted_ids(t)
    t.reorg_purge()  # a second purge removes it physically too
    live = [pq.read_table(Path(local_uri, a.path), columns=["id"]) for a in t.snapshot().add_files]
    assert sorted(i for f in live for i in f.column("id").to_pylist()) == sorted_ids(t)


def test_a_purge_blocks_nothing_it_does_not_touch(local_uri: str) -> None:
    """A concurrent DELETE in a file without a deletion vector never meets the purge."""
    t = _table(local_uri, partitioned=True)
    t.delete(f"date = '{A}' AND id = 2")
    t.set_properties({"delta.enableDeletionVectors": "false"})  # file-level rules
    pinned = Table.open(local_uri).transaction()
    t.delete(f"date = '{B}'")  # whole files of B, none of which the purge reads
    pinned.reorg_purge()
    pinned.commit()
    assert sorted_ids(t) == [1, 3, 4, 5, 6, 7, 8]
