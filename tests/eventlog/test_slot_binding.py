"""When a handle binds the version slots to its table id: before its first write, not at open.

A handle that only reads writes nothing anywhere: the local-file store keeps its binding
under ``<table>/_eventlog``, and a reader may be on a read-only mount or on a table that
another engine owns. A writer still refuses another table's slots before it writes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import Table
from lockstore import LocalFileSlotStore, TableBindingError

deltalake = pytest.importorskip("deltalake")

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def _tree(root: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def test_opening_and_reading_another_engines_table_writes_nothing_into_it(tmp_path: Path) -> None:
    uri = tmp_path / "theirs"
    deltalake.write_deltalake(str(uri), _rows([1, 2]))
    deltalake.write_deltalake(str(uri), _rows([3]), mode="append")
    before = _tree(uri)

    with Table.open(uri) as table:
        assert table.version == 1
        assert sorted(table.to_arrow().column("id").to_pylist()) == [1, 2, 3]
        assert [h["version"] for h in table.history()] == [1, 0]
        assert table.snapshot(0).num_files == 1
    assert _tree(uri) == before
    assert not (uri / "_eventlog").exists()

    with Table.open(uri) as table:  # the first write binds the slots, then commits
        assert table.append(_rows([4])).version == 2
    assert (uri / "_eventlog").is_dir()


def test_a_write_through_slots_bound_to_another_table_is_refused_before_writing(tmp_path: Path) -> None:
    slots = LocalFileSlotStore(tmp_path / "slots")
    uri = tmp_path / "t"
    Table.create(uri, SCHEMA, slots=slots).close()
    key = Table.handle(uri, slots=slots).key
    table_id = Table.open(uri, slots=slots).snapshot().table_id

    other = LocalFileSlotStore(tmp_path / "other-slots")
    other.bind(key, "f0e1d2c3-another-table")  # slots a different table at this path used
    reader = Table.open(uri, slots=other)  # reading does not bind
    assert reader.version == 0
    before = _tree(uri)
    with pytest.raises(TableBindingError) as info:
        reader.append(_rows([1]))
    assert (info.value.table, info.value.bound_id, info.value.requested_id) == (
        key,
        "f0e1d2c3-another-table",
        table_id,
    )
    assert _tree(uri) == before  # nothing staged, no data file
    assert other.latest(key) == -1
    assert Table.open(uri, slots=slots).append(_rows([1])).version == 1
