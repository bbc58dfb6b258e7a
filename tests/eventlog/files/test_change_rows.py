"""``read_data_files(file_index=True)`` (each row's file, what a change data feed read dates
rows by) on local disk, through fsspec and under column mapping; ChangeFile's JSON form."""

from __future__ import annotations

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from eventlog.files import column_mapping as cm
from eventlog.files.change_rows import ChangeFile
from eventlog.files.reader import FILE_INDEX, read_data_files
from eventlog.log.actions import AddFile, DeletionVectorDescriptor

SCHEMA = pa.schema([pa.field("id", pa.int64())])
FILES = {"a.parquet": [1, 2], "b.parquet": [], "c.parquet": [3], "d.parquet": [4, 5, 6]}


def _write(fs: fsspec.AbstractFileSystem, root: str, schema: pa.Schema = SCHEMA) -> list[AddFile]:
    adds = []
    for name, ids in FILES.items():
        with fs.open(f"{root}/{name}", "wb") as f:
            pq.write_table(pa.table({schema.names[0]: pa.array(ids, pa.int64())}), f)
        adds.append(AddFile(name, {}, fs.size(f"{root}/{name}"), 0))
    return adds


def test_file_index_on_local_disk(tmp_path: object) -> None:
    fs, root = fsspec.filesystem("file"), str(tmp_path)
    files = _write(fs, root)
    rows = read_data_files(fs, root, [files[3], *files], SCHEMA, [], file_index=True)
    assert rows.column_names == ["id", FILE_INDEX]
    assert rows.schema.field(FILE_INDEX).type == pa.int32()
    assert rows.to_pydict() == {"id": [4, 5, 6, 1, 2, 3, 4, 5, 6], FILE_INDEX: [0, 0, 0, 1, 1, 3, 4, 4, 4]}
    empty = read_data_files(fs, root, [], SCHEMA, [], file_index=True)
    assert empty.column_names == ["id", FILE_INDEX] and empty.num_rows == 0


def test_file_index_through_fsspec_in_batches(monkeypatch: object) -> None:
    import eventlog.files.reader as reader

    monkeypatch.setattr(reader, "_FETCH_BATCH_BYTES", 1)  # type: ignore[attr-defined]  # a batch per file
    fs, root = fsspec.filesystem("memory"), "/change-rows"
    files = _write(fs, root)
    rows = read_data_files(fs, root, files, SCHEMA, [], file_index=True)
    assert rows.column(FILE_INDEX).to_pylist() == [0, 0, 2, 3, 3, 3]


def test_file_index_under_column_mapping(tmp_path: object) -> None:
    meta = {cm.PHYSICAL_KEY.encode(): orjson.dumps("col-1"), cm.ID_KEY.encode(): b"1"}
    mapped = pa.schema([pa.field("id", pa.int64(), metadata=meta)])
    fs, root = fsspec.filesystem("file"), str(tmp_path)
    files = _write(fs, root, cm.physical_schema(mapped))
    rows = read_data_files(fs, root, files[2:], mapped, [], file_index=True)
    assert rows.column_names == ["id", FILE_INDEX]
    assert rows.to_pydict() == {"id": [3, 4, 5, 6], FILE_INDEX: [0, 1, 1, 1]}


def test_change_file_json_round_trip() -> None:
    dv = DeletionVectorDescriptor("i", "abc", 10, 2)
    change = ChangeFile(3, "dv", AddFile("f.parquet", {"p": "x"}, 5, 0, deletion_vector=dv), dv)
    assert ChangeFile.from_json(orjson.loads(orjson.dumps(change.to_json()))) == change
    plain = ChangeFile(1, "cdc", AddFile("_change_data/c.parquet", {}, 5, 0, False))
    assert ChangeFile.from_json(plain.to_json()) == plain
