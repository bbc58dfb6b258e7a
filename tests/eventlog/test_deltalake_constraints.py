"""CHECK constraints and generated columns both ways with ``deltalake`` (delta-rs): we enforce
the constraints it adds (``DeltaTable.alter.add_constraint``), and it enforces ours."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from eventlog import ConstraintViolationError, Table


def _state(t: Table) -> tuple[int, list[str], list[str]]:
    files = sorted(
        str(p.relative_to(t.uri)) for p in Path(t.uri).rglob("*.parquet") if "_delta_log" not in p.parts
    )
    return t.refresh().version, sorted(t.files()), files


def _ids(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


def test_we_enforce_a_constraint_deltalake_added(local_uri: str) -> None:
    write_deltalake(local_uri, pa.table({"id": [1, 2], "x": [1, 2]}))
    DeltaTable(local_uri).alter.add_constraint({"x_pos": "x > 0"})
    table = Table.open(local_uri)
    assert table.refresh().properties == {"delta.constraints.x_pos": "x > 0"}
    before = _state(table)
    with pytest.raises(ConstraintViolationError) as err:
        table.append(pa.table({"id": [3, 4], "x": [3, -4]}))
    assert (err.value.constraint, err.value.count, err.value.values) == ("x_pos", 1, {"x": -4})
    assert _state(table) == before
    table.append(pa.table({"id": [5], "x": [5]}))
    assert _ids(local_uri) == [1, 2, 5]


def test_deltalake_enforces_our_constraints_and_generated_columns(local_uri: str) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("id2", pa.int64(), metadata={"delta.generationExpression": "id * 2"}),
        ]
    )
    table = Table.create(local_uri, schema)
    table.add_constraint("id_pos", "id > 0")
    before = _state(table)
    with pytest.raises(DeltaError, match="failed validation"):
        write_deltalake(local_uri, pa.table({"id": [-1]}), mode="append")
    with pytest.raises(DeltaError, match="failed validation"):
        write_deltalake(local_uri, pa.table({"id": [4], "id2": [1]}), mode="append")
    assert _state(table) == before
    write_deltalake(local_uri, pa.table({"id": [3]}), mode="append")
    assert table.to_arrow().to_pylist() == [{"id": 3, "id2": 6}]
