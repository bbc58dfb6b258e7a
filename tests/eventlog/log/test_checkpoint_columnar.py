"""Columnar checkpoint file state: state from Arrow tables (lazy, equal to objects) and the
row layouts of foreign files (big row groups streamed, slices, conformed field types,
object stores, another kind standing in for a bad one).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog.errors import CorruptLogError
from eventlog.log.actions import AddFile, DeletionVectorDescriptor, RemoveFile
from eventlog.log.checkpoint import (
    AddFiles,
    LastCheckpoint,
    find_latest_checkpoint,
    list_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from eventlog.log.filetable import ADD_SCHEMA, REMOVE_SCHEMA, adds_table
from tests.eventlog.log.checkpoint_samples import (
    UUID_A,
    V,
    assert_same_state,
    checkpoint_name,
    many_adds,
    our_rows,
    rich_state,
    sidecar_action,
    v2_header,
    v2_state,
    write_json_lines,
    write_multipart,
    write_sidecars,
)
from tests.eventlog.log.test_checkpoint import SCHEMA_STRING, full_state

# --------------------------------------------------------------------------- columnar state


def test_state_from_tables_is_lazy_and_equal_to_objects() -> None:
    adds = many_adds(30)
    removes = [RemoveFile("gone.parquet", 5, True, True, {"d": "1"}, 9)]
    by_objects = dataclasses.replace(full_state(), adds=adds, removes=removes)
    by_tables = dataclasses.replace(full_state(), adds=adds_table(adds), removes=by_objects.remove_table)
    assert isinstance(by_tables.adds, AddFiles)
    assert by_tables.adds._items is None  # nothing materialized yet
    assert len(by_tables.adds) == 30 and by_tables.adds._items is None
    assert by_tables.add_table.schema == ADD_SCHEMA
    assert by_tables.remove_table.schema == REMOVE_SCHEMA
    assert by_tables.adds == adds and adds == by_tables.adds  # both directions
    assert list(by_tables.removes) == removes
    assert by_tables == by_objects
    assert by_tables.add_table.equals(by_objects.add_table)
    # replace keeps the tables (no round trip through objects)
    replaced = dataclasses.replace(by_tables, version=9)
    assert replaced.add_table is by_tables.add_table
    assert by_tables.adds != adds[:-1] and by_tables.adds != "not files"


# --------------------------------------------------------------------------- row layouts


@pytest.mark.parametrize("order", ["blocks", "interleaved"])
def test_large_row_groups_are_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str) -> None:
    """A foreign file with one big row group (as delta-rs writes) is read in batches; rows
    of one kind in a few runs are kept as slices, interleaved ones filtered."""
    import eventlog.log.checkpoint_read as reader

    monkeypatch.setattr(reader, "_BATCH_ROWS", 16)
    log = tmp_path / "_delta_log"
    log.mkdir()
    tombstones = [a.remove(1_700_000_000_000 + i) for i, a in enumerate(many_adds(50, offset=1000))]
    state = dataclasses.replace(full_state(), adds=many_adds(200), removes=tombstones)
    rows = our_rows(tmp_path, state)
    if order == "interleaved":
        rows = rows.take(pa.array(np.random.default_rng(7).permutation(rows.num_rows)))
    pq.write_table(rows, log / checkpoint_name(V, "parquet"), row_group_size=1_000_000)
    assert pq.ParquetFile(log / checkpoint_name(V, "parquet")).metadata.num_row_groups == 1
    got = read_checkpoint(fsspec.filesystem("file"), str(log), V)
    assert got.add_table.num_rows == 200
    assert got.add_table.sort_by("path").equals(state.add_table.sort_by("path"))
    assert got.remove_table.sort_by("path").equals(state.remove_table.sort_by("path"))
    assert (got.protocol, got.metadata) == (state.protocol, state.metadata)


def test_every_kind_reads_from_an_object_store(tmp_path: Path) -> None:
    """The same multi-part and V2 checkpoints, served by fsspec's memory file system."""
    local = tmp_path / "_delta_log"
    local.mkdir()
    (tmp_path / "scratch").mkdir()
    write_multipart(tmp_path / "scratch", local, rich_state(3), parts=2)
    state = v2_state(5)
    rows = our_rows(tmp_path / "scratch", state)
    sidecars = write_sidecars(local, rows, 2)
    write_json_lines(
        local / checkpoint_name(5, f"{UUID_A}.json"), [*v2_header(rows, 5), *map(sidecar_action, sidecars)]
    )
    fs = fsspec.filesystem("memory")
    root = f"/formats-{uuid.uuid4().hex}/_delta_log"
    try:
        for path in local.rglob("*.*"):
            fs.pipe_file(f"{root}/{path.relative_to(local)}", path.read_bytes())
        assert find_latest_checkpoint(fs, root) == 5
        assert find_latest_checkpoint(fs, root, at_or_before=4) == 3
        assert_same_state(read_checkpoint(fs, root, 5), state)
        assert sorted(read_checkpoint(fs, root, 3).adds, key=lambda a: a.path) == sorted(
            rich_state(3).adds, key=lambda a: a.path
        )
    finally:
        fs.rm(root.rpartition("/")[0], recursive=True)


def test_valid_rows_are_slices_unless_scattered() -> None:
    from eventlog.log.checkpoint_read import _MAX_RUNS, _valid_rows

    typ = pa.struct([("x", pa.int64())])
    blocks = pa.array([None, {"x": 1}, {"x": 2}, None, {"x": 3}, None], typ)
    parts = _valid_rows(blocks)
    assert [p.to_pylist() for p in parts] == [[{"x": 1}, {"x": 2}], [{"x": 3}]]
    assert [p.offset for p in parts] == [1, 4]  # zero-copy views of the read batch
    scattered = pa.array([{"x": i} if i % 2 else None for i in range(4 * _MAX_RUNS)], typ)
    (copy,) = _valid_rows(scattered)
    assert copy.offset == 0 and copy.null_count == 0 and len(copy) == 2 * _MAX_RUNS
    assert _valid_rows(pa.nulls(3, typ)) == []
    assert _valid_rows(blocks.slice(1, 2))[0].to_pylist() == [{"x": 1}, {"x": 2}]


def test_foreign_field_types_are_conformed(tmp_path: Path) -> None:
    """int64 DV sizes/offsets, a DV without ``offset``, maps with other entry names, nullable
    everything and extra fields, as other writers may produce them."""
    s, i64 = pa.string(), pa.int64()
    dv_type = pa.struct(
        [("storageType", s), ("pathOrInlineDv", s), ("sizeInBytes", i64), ("cardinality", i64)]
    )
    rm_dv_type = pa.struct([("storageType", s), ("pathOrInlineDv", s), ("offset", i64), ("sizeInBytes", i64),
                            ("cardinality", i64)])  # fmt: skip
    pv = pa.map_(pa.field("k", s, False), pa.field("v", s))
    schema = pa.schema([
        ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())])),
        ("metaData", pa.struct([("id", s), ("schemaString", s)])),
        ("add", pa.struct([("path", s), ("partitionValues", pv), ("size", i64), ("modificationTime", i64),
                           ("deletionVector", dv_type), ("clusteringProvider", s)])),
        ("remove", pa.struct([("path", s), ("deletionVector", rm_dv_type), ("partitionValues", pv)])),
    ])  # fmt: skip
    rows = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7}},
        {"metaData": {"id": "m", "schemaString": SCHEMA_STRING}},
        {"add": {"path": "a", "partitionValues": [("d", "1")], "size": 1, "modificationTime": 2,
                 "deletionVector": {"storageType": "i", "pathOrInlineDv": "xyz", "sizeInBytes": 3,
                                    "cardinality": 4}}},
        {"add": {"path": "b", "partitionValues": [], "size": 5, "modificationTime": 6,
                 "clusteringProvider": "c"}},
        {"remove": {"path": "a", "deletionVector": {"storageType": "u", "pathOrInlineDv": "p", "offset": 7,
                                                   "sizeInBytes": 8, "cardinality": 9}}},
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / checkpoint_name(3, "parquet"))
    got = read_checkpoint(fsspec.filesystem("file"), str(tmp_path), 3)
    assert got.add_table.schema == ADD_SCHEMA and got.remove_table.schema == REMOVE_SCHEMA
    assert list(got.adds) == [
        AddFile("a", {"d": "1"}, 1, 2, deletion_vector=DeletionVectorDescriptor("i", "xyz", 3, 4)),
        AddFile("b", {}, 5, 6, clustering_provider="c"),
    ]
    assert list(got.removes) == [RemoveFile("a", deletion_vector=DeletionVectorDescriptor("u", "p", 8, 9, 7))]
    # and written back in our layout, it reads the same
    write_checkpoint(fsspec.filesystem("file"), str(tmp_path), dataclasses.replace(got, version=4))
    again = read_checkpoint(fsspec.filesystem("file"), str(tmp_path), 4)
    assert again.add_table.equals(got.add_table.set_column(4, "dataChange", pa.chunked_array([[True, True]])))
    assert list(again.removes) == list(got.removes)


def test_another_kind_at_the_same_version_stands_in_for_a_bad_one(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    state = v2_state()
    rows = our_rows(tmp_path, state)
    sidecars = write_sidecars(log, rows, 2)
    write_json_lines(
        log / checkpoint_name(V, f"{UUID_A}.json"), [*v2_header(rows, V), *map(sidecar_action, sidecars)]
    )
    classic = log / checkpoint_name(V, "parquet")
    classic.write_bytes(b"PAR1 torn by a crashed writer")
    fs, log_dir = fsspec.filesystem("file"), str(log)
    names = os.listdir(log)
    assert [cp.kind for cp in list_checkpoints(names)] == ["classic", "v2"]
    assert_same_state(read_checkpoint(fs, log_dir, V), state)  # classic corrupt: listed
    assert_same_state(read_checkpoint(fs, log_dir, V, listing=names), state)
    with pytest.raises(CorruptLogError) as info:  # named directly: no stand-in
        read_checkpoint(fs, log_dir, V, last=LastCheckpoint(V))
    assert info.value.uri == str(classic)
    os.remove(log / checkpoint_name(V, f"{UUID_A}.json"))
    with pytest.raises(CorruptLogError):  # nothing else at that version: the first error
        read_checkpoint(fs, log_dir, V, listing=os.listdir(log))
