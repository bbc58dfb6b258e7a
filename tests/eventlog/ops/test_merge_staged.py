"""MERGE staged in an explicit transaction: ``execute()`` stages, ``commit()`` publishes.

Each scenario opens the second transaction, stages its operation (for a MERGE:
``txn.merge(...)...execute()``), then a first transaction stages and commits its own
operation, and only then does the second one commit. One of the two is always a MERGE,
so MERGE is tested both as the loser (its commit comes after a concurrent DELETE,
UPDATE, MERGE, OPTIMIZE or blind INSERT landed) and as the winner. Expected outcomes
come from the reference matrices: file-level rules (``SAME_FILES`` of
``test_conflict_matrix``) on tables without row-level concurrency, "no conflict" on
disjoint partitions, and row-level rules on deletion-vector tables, partitioned or not.
Whenever both commit, the table must equal the two operations run one after the other
in commit order on a fresh copy of the seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import (
    CommitResult,
    DeltaConcurrentModificationException,
    Table,
    Transaction,
)
from eventlog.errors import MergeCardinalityError, TransactionStateError
from tests.conftest import SCHEMA, rows
from tests.eventlog.txn.test_conflict_matrix import SAME_FILES

SER, WS = "Serializable", "WriteSerializable"
DV = {"delta.enableDeletionVectors": "true"}
D1, D2 = "2024-01-01", "2024-01-02"
# The first operation changes row 3. The second changes row 1 (other row: the files
# the first one adds, ids 3..53, do not cover it by statistics) or row 3 (same row).
FIRST_KEY = 3

Stage = Callable[[Transaction, str, int, bool], None]


def _insert(txn: Transaction, date: str, key: int, partitioned: bool) -> None:
    txn.append(rows([100 + key], date))


def _update(txn: Transaction, date: str, key: int, partitioned: bool) -> None:
    txn.update(f"date = '{date}' AND id = {key}", set={"y": "y + 1000"})


def _delete(txn: Transaction, date: str, key: int, partitioned: bool) -> None:
    txn.delete(f"date = '{date}' AND id = {key}")


def _merge(txn: Transaction, date: str, key: int, partitioned: bool) -> None:
    src = rows([key, 50 + key], date).set_column(3, "y", pa.array([-1.0 * key, -50.0 - key]))
    # Source key 50 + key never matches (t.id = key), so it is inserted.
    on = f"t.id = s.id AND t.date = '{date}' AND t.id = {key}"
    builder = txn.merge(src, on, source_alias="s", target_alias="t")
    builder.when_matched_update_all().when_not_matched_insert_all().execute()


def _optimize(txn: Transaction, date: str, key: int, partitioned: bool) -> None:
    txn.optimize(partition_filter=f"date = '{date}'" if partitioned else None)


OPS: dict[str, Stage] = {
    "INSERT": _insert,
    "UPDATE": _update,
    "DELETE": _delete,
    "MERGE": _merge,
    "OPTIMIZE": _optimize,
}
DML = ("UPDATE", "DELETE", "MERGE")
PAIRS = [(s, f) for s in OPS for f in OPS if "MERGE" in (s, f)]


@dataclass(frozen=True)
class Layout:
    """A table shape and where the two operations act."""

    name: str
    partitioned: bool
    dv: bool
    second_date: str  # the first operation always acts on D1
    second_key: int  # the first operation's rows have key FIRST_KEY

    def expected(self, second: str, first: str, level: str) -> type[Exception] | None:
        if self.partitioned and self.second_date != D1:
            return None  # disjoint partitions never conflict
        if self.dv:
            # Row-level concurrency, partitioned or not: only changing the same row conflicts
            # (OPTIMIZE here never Z-orders, and inserts of other keys never match a DML's
            # predicate).
            same_row = self.second_key == FIRST_KEY and second in DML and first in DML
            return DeltaConcurrentModificationException if same_row else None
        return SAME_FILES[(second, first)][level]


LAYOUTS = [
    Layout("unpartitioned", partitioned=False, dv=False, second_date=D1, second_key=1),
    Layout("same-partition", partitioned=True, dv=False, second_date=D1, second_key=1),
    Layout("disjoint-partitions", partitioned=True, dv=False, second_date=D2, second_key=1),
    Layout("dv-row-level-other-rows", partitioned=False, dv=True, second_date=D1, second_key=1),
    Layout("dv-row-level-same-row", partitioned=False, dv=True, second_date=D1, second_key=FIRST_KEY),
    Layout("dv-same-partition", partitioned=True, dv=True, second_date=D1, second_key=1),
    Layout("dv-same-partition-same-row", partitioned=True, dv=True, second_date=D1, second_key=FIRST_KEY),
    Layout("dv-disjoint-partitions", partitioned=True, dv=True, second_date=D2, second_key=1),
]

CASES = [
    pytest.param(layout, second, first, level, id=f"{layout.name}-{second}-after-{first}-{level}")
    for layout in LAYOUTS
    for second, first in PAIRS
    for level in (SER, WS)
    if not (layout.name.endswith("same-row") and (second not in DML or first not in DML))
]


def _seed(uri: str, level: str, layout: Layout) -> Table:
    props = {"delta.isolationLevel": level, **(DV if layout.dv else {})}
    t = Table.create(uri, SCHEMA, partition_by=["date"] if layout.partitioned else None, properties=props)
    for date in (D1, D2):
        t.append(rows([1, 2], date))
        t.append(rows([3, 4], date))
    return t


def _contents(t: Table) -> list[tuple[object, ...]]:
    return sorted((r["id"], r["date"], r["x"], r["y"]) for r in t.to_arrow().to_pylist())


@pytest.mark.parametrize(("layout", "second", "first", "level"), CASES)
def test_staged_merge_matrix(tmp_path: Path, layout: Layout, second: str, first: str, level: str) -> None:
    uri = str(tmp_path / "t")
    t1 = _seed(uri, level, layout)
    seeded = t1.version
    files_before = set(t1.files())
    t2 = Table.open(uri)
    pinned = t2.transaction()
    OPS[second](pinned, layout.second_date, layout.second_key, layout.partitioned)
    assert Table.open(uri).version == seeded  # staged, not committed
    winner_txn = t1.transaction()
    OPS[first](winner_txn, D1, FIRST_KEY, layout.partitioned)
    winner = winner_txn.commit()
    assert winner.version == seeded + 1 and winner.operation == ("WRITE" if first == "INSERT" else first)
    expected = layout.expected(second, first, level)
    if expected is not None:
        after_winner = _contents(t1)
        with pytest.raises(expected) as info:
            pinned.commit()
        err = info.value
        assert isinstance(err, DeltaConcurrentModificationException)
        assert err.winning_version == winner.version
        assert err.operation == winner.operation
        if layout.partitioned:
            assert err.partition in (None, f"[date={D1}]")
        assert Table.open(uri).version == winner.version  # the loser wrote nothing
        assert _contents(Table.open(uri)) == after_winner
        # ... and left no file behind: only the seed's and the winner's files exist.
        live = set(Table.open(uri).files())
        on_disk = {p.name for p in Path(uri).rglob("*.parquet")}
        assert on_disk <= {Path(f).name for f in files_before | live}
        with pytest.raises(TransactionStateError):
            pinned.commit()  # a failed transaction cannot be committed again
        return
    result = pinned.commit()
    assert result.version == winner.version + 1
    assert result.operation == ("WRITE" if second == "INSERT" else second)
    if second == "MERGE":
        assert int(result.metrics["numSourceRows"]) == 2
    # Both committed: the table equals the two run serially in commit order.
    serial = _seed(str(tmp_path / "serial"), level, layout)
    for op, date, key in ((first, D1, FIRST_KEY), (second, layout.second_date, layout.second_key)):
        txn = serial.transaction()
        OPS[op](txn, date, key, layout.partitioned)
        txn.commit()
    assert _contents(Table.open(uri)) == _contents(serial)


def test_execute_on_a_transaction_only_stages(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1, 2]))
    txn = t.transaction()
    src = rows([2, 3], x=7)
    staged = txn.merge(src, "t.id = s.id", source_alias="s", target_alias="t")
    assert staged.when_matched_update(set={"x": "s.x"}).when_not_matched_insert_all().execute() is None
    assert Table.open(local_uri).version == 1
    assert sorted(Table.open(local_uri).to_arrow().column("x").to_pylist()) == [1, 2]
    result = txn.commit()
    assert isinstance(result, CommitResult) and result.version == 2 and result.operation == "MERGE"
    assert result.metrics["numTargetRowsUpdated"] == "1"
    assert result.metrics["numTargetRowsInserted"] == "1"
    assert {r["id"]: r["x"] for r in t.to_arrow().to_pylist()} == {1: 1, 2: 7, 3: 7}
    with pytest.raises(TransactionStateError):
        txn.commit()


def test_table_merge_commits_at_once(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    result = t.merge(rows([1, 2], x=9), "t.id = s.id", source_alias="s", target_alias="t") \
        .when_matched_update_all().when_not_matched_insert_all().execute()  # fmt: skip
    assert isinstance(result, CommitResult) and result.version == 2
    assert Table.open(local_uri).version == 2
    assert {r["id"]: r["x"] for r in Table.open(local_uri).to_arrow().to_pylist()} == {1: 9, 2: 9}


@pytest.mark.parametrize("dv", [False, True])
def test_a_failing_staged_merge_aborts_and_leaves_nothing(tmp_path: Path, dv: bool) -> None:
    """A MERGE that fails while staging (two source rows match one target row) deletes the
    files it wrote, and its transaction can no longer commit."""
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, properties=DV if dv else {})
    t.append(rows([1, 2]))
    before = sorted(p.name for p in Path(uri).rglob("*") if p.is_file() and "_eventlog" not in p.parts)
    txn = t.transaction()
    dup = rows([1, 1, 5])
    with pytest.raises(MergeCardinalityError) as info:
        txn.merge(dup, "t.id = s.id", source_alias="s", target_alias="t") \
            .when_matched_update_all().when_not_matched_insert_all().execute()  # fmt: skip
    assert info.value.rows == 1
    with pytest.raises(TransactionStateError):
        txn.commit()
    after = sorted(p.name for p in Path(uri).rglob("*") if p.is_file() and "_eventlog" not in p.parts)
    assert after == before and Table.open(uri).version == 1


def test_every_operation_follows_the_same_rule(local_uri: str) -> None:
    """Each operation on a transaction stages only; a failing one aborts the transaction."""
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1, 2, 3]))
    staged: dict[str, Callable[[Transaction], object]] = {
        "WRITE": lambda txn: txn.append(rows([4])),
        "DELETE": lambda txn: txn.delete("id = 1"),
        "UPDATE": lambda txn: txn.update("id = 2", set={"x": "0"}),
        "MERGE": lambda txn: (
            txn.merge(rows([3]), "t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_delete()
            .execute()
        ),
        "OPTIMIZE": lambda txn: txn.optimize(),
        "SET TBLPROPERTIES": lambda txn: txn.set_properties({"delta.appendOnly": "false"}),
    }
    for operation, run in staged.items():
        version = t.version
        txn = t.transaction()
        assert run(txn) is None
        assert Table.open(local_uri).version == version, operation
        assert txn.commit().operation == operation
        assert Table.open(local_uri).version == version + 1
    failing: dict[str, Callable[[Transaction], object]] = {
        "delete": lambda txn: txn.delete("nope = 1"),
        "update": lambda txn: txn.update("id = 1", set={"nope": "1"}),
        "merge": lambda txn: (
            txn.merge(rows([4, 4]), "t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .execute()
        ),
    }
    for name, run in failing.items():
        txn = t.transaction()
        with pytest.raises(Exception) as info:
            run(txn)
        assert type(info.value).__module__ == "eventlog.errors", name
        with pytest.raises(TransactionStateError):
            txn.commit()
