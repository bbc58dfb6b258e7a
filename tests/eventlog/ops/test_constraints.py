"""CHECK constraints, invariants and NOT NULL on every engine write path: ADD/DROP CONSTRAINT,
append, overwrite, Transaction, UPDATE, MERGE; a violation raises ConstraintViolationError
(with its fields) and leaves the table exactly as it was."""

from __future__ import annotations

import dataclasses
import pickle
import time
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import (
    ConcurrentAppendException,
    ConstraintViolationError,
    InvalidInputError,
    MetadataChangedException,
    NotNullViolationError,
    PredicateError,
    SchemaMismatchError,
    Table,
    UnsupportedProtocolError,
)
from eventlog.log.actions import CommitInfo, Protocol, encode_commit
from eventlog.snapshot.protocol import features_of
from tests.conftest import SCHEMA, rows, sorted_ids


def _files(uri: str) -> list[str]:
    return sorted(
        str(p.relative_to(uri)) for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts
    )


def _state(t: Table) -> tuple[int, list[str], list[str]]:
    """Version, live files and every data file on disk: what a failed write must not change."""
    return t.refresh().version, sorted(t.files()), _files(t.uri)


def _table(uri: str) -> Table:
    t = Table.create(uri, SCHEMA, partition_by=["date"])
    t.append(rows([1, 2, 3]))
    return t


def test_add_constraint_is_stored_lower_cased_and_upgrades_the_protocol(local_uri: str) -> None:
    t = _table(local_uri)
    result = t.add_constraint("Positive_X", "x > 0")
    assert result.version == 2
    snap = t.refresh()
    assert snap.properties["delta.constraints.positive_x"] == "x > 0"
    assert snap.protocol == Protocol(1, 3)  # as Delta upgrades a legacy table
    assert "checkConstraints" in features_of(snap.protocol)
    info = t.history(1)[0]
    assert info["operation"] == "ADD CONSTRAINT"
    assert info["operationParameters"] == {"name": "Positive_X", "expr": "x > 0"}
    assert sorted_ids(t) == [1, 2, 3]


def test_add_constraint_that_existing_rows_violate_changes_nothing(local_uri: str) -> None:
    t = _table(local_uri)
    t.append(rows([-5, -6], "2024-01-02"))
    before = _state(t)
    with pytest.raises(ConstraintViolationError) as err:
        t.add_constraint("pos", "x > 0")
    assert err.value.constraint == "pos" and err.value.expression == "x > 0"
    assert err.value.count == 2
    assert {r["x"] for r in err.value.sample} == {-5, -6}
    assert _state(t) == before
    assert "delta.constraints.pos" not in t.refresh().properties


def test_add_constraint_refuses_duplicates_and_expressions_it_cannot_evaluate(local_uri: str) -> None:
    t = _table(local_uri)
    t.add_constraint("pos", "x > 0")
    with pytest.raises(InvalidInputError):
        t.add_constraint("POS", "x > 1")
    with pytest.raises(PredicateError):
        t.add_constraint("re", "regexp_like(date, '2024.*')")
    with pytest.raises(PredicateError):
        t.add_constraint("notbool", "x + 1")
    assert t.refresh().version == 2


def test_drop_constraint(local_uri: str) -> None:
    t = _table(local_uri)
    t.add_constraint("pos", "x > 0")
    with pytest.raises(InvalidInputError):
        t.drop_constraint("missing")
    t.drop_constraint("missing", if_exists=True)
    assert t.refresh().properties["delta.constraints.pos"] == "x > 0"
    t.drop_constraint("POS")
    assert "delta.constraints.pos" not in t.refresh().properties
    assert t.history(1)[0]["operationParameters"] == {"name": "POS", "expr": "x > 0"}
    t.append(rows([-1]))  # no longer enforced
    assert sorted_ids(t) == [-1, 1, 2, 3]


def test_violating_append_raises_with_fields_and_leaves_the_table_unchanged(local_uri: str) -> None:
    t = _table(local_uri)
    t.add_constraint("pos", "x > 0 AND id < 100")
    before = _state(t)
    bad = pa.concat_tables([rows([4]), rows([5, 6], x=-1), rows([7]), rows([200], x=1)])
    with pytest.raises(ConstraintViolationError) as err:
        t.append(bad)
    e = err.value
    assert isinstance(e, InvalidInputError)
    assert (e.constraint, e.expression, e.count) == ("pos", "x > 0 AND id < 100", 3)
    assert e.values == {"id": 5, "x": -1}
    assert e.sample == [{"id": 5, "x": -1}, {"id": 6, "x": -1}, {"id": 200, "x": 1}]
    assert "CHECK constraint pos (x > 0 AND id < 100) violated by row with values" in str(e)
    assert _state(t) == before
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is ConstraintViolationError and again.sample == e.sample and again.count == 3


def test_null_result_violates_a_check_as_in_delta(local_uri: str) -> None:
    t = _table(local_uri)
    t.add_constraint("pos", "x > 0")
    before = _state(t)
    nulls = rows([9]).set_column(2, "x", pa.array([None], pa.int64()))
    with pytest.raises(ConstraintViolationError) as err:
        t.append(nulls)
    assert err.value.values == {"x": None} and err.value.count == 1
    assert _state(t) == before
    t.add_constraint("maybe", "x IS NULL OR x < 10")
    t.append(rows([8]))
    assert sorted_ids(t) == [1, 2, 3, 8]


def test_common_constraint_expressions(local_uri: str) -> None:
    t = _table(local_uri)
    t.add_constraint("in_list", "id IN (1, 2, 3, 4, 10)")
    t.add_constraint("between", "x BETWEEN 0 AND 10")
    t.add_constraint("like", "date LIKE '2024-%' AND length(date) = 10")
    t.add_constraint("func", "abs(coalesce(y, 0.0)) < 100 AND lower(date) = date")
    t.add_constraint("arith", "x * 2 + 1 > id")
    t.append(rows([4]))
    for bad, name in [
        (rows([5]), "in_list"),
        (rows([10], x=11), "between"),
        (rows([10], "2023-01-1"), "like"),
    ]:
        with pytest.raises(ConstraintViolationError) as err:
            t.append(bad)
        assert err.value.constraint == name
    assert sorted_ids(t) == [1, 2, 3, 4]


def test_overwrite_update_merge_and_transactions_enforce_constraints(local_uri: str) -> None:
    t = _table(local_uri)
    t.add_constraint("pos", "x > 0")
    before = _state(t)
    with pytest.raises(ConstraintViolationError):
        t.overwrite(rows([7], x=0))
    with pytest.raises(ConstraintViolationError):
        t.overwrite(rows([7], x=-7), replace_where="date = '2024-01-01'")
    with pytest.raises(ConstraintViolationError) as err:
        t.update("id = 2", {"x": "x - 10"})
    assert err.value.values == {"x": -8}
    source = pa.table({"id": [2, 9], "x": [-2, 9]})
    with pytest.raises(ConstraintViolationError):  # the updated row
        t.merge(source, "target.id = source.id").when_matched_update(set={"x": "source.x"}).execute()
    with pytest.raises(ConstraintViolationError):  # the inserted row
        (
            t.merge(pa.table({"id": [9], "x": [-9]}), "target.id = source.id")
            .when_not_matched_insert(values={"id": "source.id", "date": "'2024-01-05'", "x": "source.x"})
            .execute()
        )
    txn = t.transaction()
    with pytest.raises(ConstraintViolationError):
        txn.append(rows([11], x=-1))
    assert _state(t) == before
    t.update("id = 2", {"x": "x + 10"})
    assert t.to_arrow(filter="id = 2").column("x").to_pylist() == [12]


def test_not_null_columns_and_nested_fields(local_uri: str) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("s", pa.struct([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])),
        ]
    )
    t = Table.create(local_uri, schema)
    t.append(pa.table({"id": [1], "s": [{"a": 1, "b": "x"}]}, schema=schema))
    before = _state(t)
    with pytest.raises(NotNullViolationError) as err:
        t.append(pa.table({"id": pa.array([2, None, None], pa.int64()), "s": [None, None, None]}))
    e = err.value
    assert isinstance(e, ConstraintViolationError) and isinstance(e, SchemaMismatchError)
    assert (e.constraint, e.count, e.columns, e.values) == ("NOT NULL id", 2, ["id"], {"id": None})
    relaxed = pa.schema(
        [pa.field("id", pa.int64()), pa.field("s", pa.struct([("a", pa.int64()), ("b", pa.string())]))]
    )
    nested = pa.table({"id": [3, 4], "s": [{"a": None, "b": "y"}, None]}, schema=relaxed)
    with pytest.raises(NotNullViolationError) as err:
        t.append(nested)
    assert err.value.columns == ["s.a"] and err.value.count == 1  # a null struct is allowed
    with pytest.raises(NotNullViolationError):
        t.update("id = 1", {"id": "NULL"})
    assert _state(t) == before


def test_invariants_in_column_metadata_are_enforced(local_uri: str) -> None:
    invariant = '{"expression": {"expression": "x > 0"}}'
    schema = pa.schema(
        [pa.field("id", pa.int64()), pa.field("x", pa.int64(), metadata={"delta.invariants": invariant})]
    )
    t = Table.create(local_uri, schema)
    t.append(pa.table({"id": [1], "x": [1]}, schema=schema))
    before = _state(t)
    with pytest.raises(ConstraintViolationError) as err:
        t.append(pa.table({"id": [2], "x": [-2]}))
    assert (err.value.constraint, err.value.expression, err.value.values) == ("x", "x > 0", {"x": -2})
    assert _state(t) == before


def test_a_constraint_we_cannot_evaluate_refuses_writes(local_uri: str) -> None:
    """Another engine added a constraint outside our expression language: writes are refused
    naming it (never written unchecked); reads go on."""
    t = _table(local_uri)
    snap = t.refresh()
    info = CommitInfo(timestamp=int(time.time() * 1000), operation="ADD CONSTRAINT", txn_id="other-engine")
    config = {**snap.metadata.configuration, "delta.constraints.re": "date RLIKE '^2024'"}
    metadata = dataclasses.replace(snap.metadata, configuration=config)
    assert t.log.write_commit_unguarded(snap.version + 1, encode_commit([info, metadata]))
    before = _state(t)
    with pytest.raises(UnsupportedProtocolError) as err:
        t.append(rows([4]))
    assert err.value.features == ["checkConstraints"] and "re (date RLIKE '^2024')" in str(err.value)
    assert _state(t) == before
    assert sorted_ids(t) == [1, 2, 3]


def test_constraint_added_while_a_write_is_staged_keeps_violating_rows_out(local_uri: str) -> None:
    t = _table(local_uri)
    on_disk = _files(local_uri)
    writer = Table.open(local_uri).transaction()
    writer.append(rows([4], x=-4))  # staged against version 1, before the constraint
    t.add_constraint("pos", "x > 0")
    with pytest.raises(MetadataChangedException):
        writer.commit()
    assert _state(t) == (2, on_disk, on_disk)  # the staged file is deleted
    assert sorted_ids(t) == [1, 2, 3]


def test_write_committed_while_a_constraint_is_being_added_fails_the_constraint(local_uri: str) -> None:
    t = _table(local_uri)
    adding = Table.open(local_uri).transaction()
    adding.add_constraint("pos", "x > 0")  # checked the rows of version 1
    t.append(rows([4], x=-4))
    with pytest.raises(ConcurrentAppendException):
        adding.commit()
    assert "delta.constraints.pos" not in t.refresh().properties
    with pytest.raises(ConstraintViolationError):
        t.add_constraint("pos", "x > 0")


@pytest.mark.parametrize("where", ["first", "last"])
def test_large_writes_are_checked_while_their_files_are_written(local_uri: str, where: str) -> None:
    """From 65,536 rows the CHECK rules run beside the Parquet writer: a violation anywhere
    still fails the write with the same fields, and the files already written are deleted."""
    n = 200_000
    ids = pa.array(range(n), pa.int64())
    t = Table.create(local_uri, pa.schema([pa.field("id", pa.int64()), pa.field("x", pa.int64())]))
    t.append(pa.table({"id": ids, "x": pa.array([1] * n, pa.int64())}))  # one file of n rows
    t.add_constraint("pos", "x > 0")
    before = _state(t)
    bad = 0 if where == "first" else n - 1
    data = pa.table({"id": ids, "x": pa.array([-5 if i == bad else 1 for i in range(n)], pa.int64())})
    with pytest.raises(ConstraintViolationError) as err:
        t.append(data)
    assert (err.value.constraint, err.value.count, err.value.values) == ("pos", 1, {"x": -5})
    with pytest.raises(ConstraintViolationError):
        t.overwrite(data)
    with pytest.raises(ConstraintViolationError) as err:  # rewrites the whole file
        t.update(f"id = {bad}", {"x": "x - 10"})
    assert (err.value.count, err.value.values) == (1, {"x": -9})
    assert _state(t) == before
    t.update(f"id = {bad}", {"x": "x + 10"})
    assert t.to_arrow(filter=f"id = {bad}").column("x").to_pylist() == [11]
