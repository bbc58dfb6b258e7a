"""The change data feed's reader of many small files (:mod:`eventlog.files.change_rows`): on
local disk it reads each file with ``pyarrow.parquet`` rather than through a Dataset, and
must return exactly what the general reader (:func:`eventlog.files.reader.read_data_files`)
returns: the same columns and types, rows in file order, each row's file, partition values,
absent columns as nulls, narrower types cast, column-mapped files by physical names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from eventlog.errors import DataFileNotFoundError
from eventlog.files import change_rows
from eventlog.files import column_mapping as cm
from eventlog.files.change_rows import _read_small_files, _read_whole, _Unsupported
from eventlog.files.reader import FILE_INDEX, read_data_files
from eventlog.log.actions import AddFile

FS = LocalFileSystem()


def _file(
    root: Path, name: str, data: pa.Table, partition_values: dict[str, str | None] | None = None
) -> AddFile:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, path)
    return AddFile(name, partition_values or {}, os.path.getsize(path), 0, True)


def _both(
    root: Path, files: list[AddFile], schema: pa.Schema, parts: list[str], columns: list[str]
) -> pa.Table:
    """The small-file read, checked equal (schema, field metadata, rows) to the general one."""
    ours = _read_small_files(FS, str(root), files, schema, parts, columns)
    general = read_data_files(FS, str(root), files, schema, parts, columns=columns, file_index=True)
    assert ours.schema.equals(general.schema, check_metadata=True)
    assert ours.to_pylist() == general.to_pylist()
    return ours


def test_files_of_other_columns_and_types_read_as_the_general_reader(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("p", pa.string()),
            pa.field("ts", pa.timestamp("us", tz="UTC")),
            pa.field("s", pa.struct([pa.field("a", pa.int32())])),
            pa.field("added", pa.string()),
            pa.field("_change_type", pa.string()),
        ]
    )
    old = pa.table({"id": pa.array([1, 2], pa.int32()), "ts": pa.array([1, 2], pa.timestamp("ms"))})
    new = pa.table(
        {
            "id": pa.array([3], pa.int64()),
            "ts": pa.array([3], pa.timestamp("us", tz="UTC")),
            "s": pa.array([{"a": 7}], schema.field("s").type),
            "added": ["x"],
        }
    )
    cdc = new.append_column("_change_type", pa.array(["delete"]))
    files = [
        _file(tmp_path, "p=a/old.parquet", old, {"p": "a"}),
        _file(tmp_path, "p=b/new.parquet", new, {"p": "b"}),
        _file(tmp_path, "_change_data/p=a/c.parquet", cdc, {"p": "a"}),
        _file(tmp_path, "p=__null/old2.parquet", old, {"p": None}),
        _file(tmp_path, "p=b/empty.parquet", new.slice(0, 0), {"p": "b"}),
        _file(tmp_path, "p=b/new2.parquet", new, {"p": "b"}),
    ]
    rows = _both(tmp_path, files, schema, ["p"], schema.names)
    assert rows.column(FILE_INDEX).to_pylist() == [0, 0, 1, 2, 3, 3, 5]
    assert rows.column("p").to_pylist() == ["a", "a", "b", "a", None, None, "b"]
    assert rows.column("_change_type").to_pylist() == [None, None, None, "delete", None, None, None]
    assert rows.column("added").to_pylist() == [None, None, "x", "x", None, None, "x"]
    some = _both(tmp_path, files, schema, ["p"], ["p", "id"])
    assert some.column_names == ["id", "p", FILE_INDEX]


def test_column_mapped_files_are_read_by_physical_names(tmp_path: Path) -> None:
    logical = pa.schema(
        [
            pa.field("id", pa.int64(), metadata=cm_meta(1, "col-1")),
            pa.field("p", pa.string(), metadata=cm_meta(2, "col-2")),
        ]
    )
    files = [
        _file(tmp_path, "a.parquet", pa.table({"col-1": pa.array([1, 2], pa.int64())}), {"col-2": "x"}),
        _file(tmp_path, "b.parquet", pa.table({"col-1": pa.array([3], pa.int64())}), {"col-2": "y"}),
    ]
    assert cm.is_mapped(logical)
    rows = _both(tmp_path, files, logical, ["p"], ["id", "p"])
    assert rows.select(["id", "p"]).to_pylist() == [
        {"id": 1, "p": "x"},
        {"id": 2, "p": "x"},
        {"id": 3, "p": "y"},
    ]


def cm_meta(column_id: int, physical: str) -> dict[str, str]:
    return {"delta.columnMapping.id": str(column_id), "delta.columnMapping.physicalName": physical}


def test_a_column_that_does_not_cast_is_left_to_the_general_reader(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("s", pa.struct([pa.field("a", pa.int64())]))])
    files = [_file(tmp_path, "a.parquet", pa.table({"s": ["x"]}))]
    with pytest.raises(_Unsupported):
        _read_small_files(FS, str(tmp_path), files, schema, [], ["s"])
    with pytest.raises(pa.ArrowNotImplementedError):  # what the general reader says of it
        _read_whole(FS, str(tmp_path), files, schema, [], ["s"])


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("id", pa.int64())])
    files = [AddFile("gone.parquet", {}, 10, 0, True)]
    with pytest.raises(DataFileNotFoundError) as err:
        _read_small_files(FS, str(tmp_path), files, schema, [], ["id"])
    assert "gone.parquet" in str(err.value)


def test_big_files_go_to_the_general_reader_in_file_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("p", pa.string())])
    files = [
        _file(tmp_path, f"p=x/{n}.parquet", pa.table({"id": pa.array(ids, pa.int64())}), {"p": "x"})
        for n, ids in enumerate([[1], list(range(10, 400)), [2, 3], list(range(500, 900)), [4]])
    ]
    sizes = sorted(f.size for f in files)
    assert sizes[2] < sizes[3]  # three small, two big
    monkeypatch.setattr(change_rows, "SMALL_FILE_BYTES", sizes[2])
    calls: list[int] = []
    real = read_data_files

    def general(*args: Any, **kwargs: Any) -> pa.Table:
        calls.append(len(args[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(change_rows, "read_data_files", general)
    rows = _read_whole(FS, str(tmp_path), files, schema, ["p"], ["id", "p"])
    assert calls == [2]  # the two big files only
    expected = read_data_files(FS, str(tmp_path), files, schema, ["p"], columns=["id", "p"], file_index=True)
    assert rows.schema.equals(expected.schema, check_metadata=True)
    assert rows.to_pylist() == expected.to_pylist()
    assert rows.column(FILE_INDEX).to_pylist()[:3] == [0, 1, 1]
