"""Column mapping both ways with ``deltalake`` (delta-rs 1.6): it writes ``name``-mode tables
(protocol (2, 5), physical names, random-prefix directories) that we read and write, and its
DataFusion reader (``QueryBuilder``) reads ours. Its pyarrow reader
(``DeltaTable.to_pyarrow_table``) returns nulls for every data column of any column-mapped
table, its own included, so that one is not the peer here."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from eventlog import Table
from eventlog.files import column_mapping as cm

DATA = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "p": ["x", "y", "x"], "v": ["a", "b", "c"]})


def _theirs(path: str) -> list[dict[str, Any]]:
    reader = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t ORDER BY id")
    return pa.table(reader.read_all()).to_pylist()


def test_we_read_and_write_deltalake_mapped_tables(local_uri: str) -> None:
    write_deltalake(local_uri, DATA, partition_by=["p"], configuration={"delta.columnMapping.mode": "name"})
    table = Table.open(local_uri)
    assert table.snapshot().protocol.min_reader_version == 2
    assert all(cm.physical_name(f).startswith("col-") for f in table.schema)
    assert table.to_arrow().sort_by("id").to_pylist() == DATA.to_pylist()
    table.rename_column("v", "w")
    table.append(pa.table({"id": [4], "p": ["z"], "w": ["d"]}))
    table.delete("id = 2")
    expected = [
        {"id": 1, "p": "x", "w": "a"},
        {"id": 3, "p": "x", "w": "c"},
        {"id": 4, "p": "z", "w": "d"},
    ]
    assert table.to_arrow().sort_by("id").to_pylist() == expected
    assert _theirs(local_uri) == expected


def test_deltalake_reads_and_appends_to_tables_we_mapped(local_uri: str) -> None:
    mapping = {"delta.columnMapping.mode": "name"}
    table = Table.create(local_uri, data=DATA, partition_by=["p"], properties=mapping)
    snap = table.snapshot()
    assert (snap.protocol.min_reader_version, snap.protocol.min_writer_version) == (2, 5)  # as Delta
    table.rename_column("v", "w")
    renamed = [{"id": 1, "p": "x", "w": "a"}, {"id": 2, "p": "y", "w": "b"}, {"id": 3, "p": "x", "w": "c"}]
    assert _theirs(local_uri) == renamed
    row = pa.table({"id": pa.array([4], pa.int64()), "p": ["z"], "w": ["d"]})
    write_deltalake(local_uri, row, mode="append")
    assert table.to_arrow().sort_by("id").to_pylist()[-1] == {"id": 4, "p": "z", "w": "d"}
    assert len(_theirs(local_uri)) == 4
