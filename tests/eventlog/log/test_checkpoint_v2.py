"""V2 checkpoints: UUID-named JSON and Parquet, with sidecars or inline file actions,
classic-named V2, their errors, and the v2Checkpoint table feature.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog.errors import CorruptLogError
from eventlog.log.checkpoint import (
    CHECKPOINT_SCHEMA,
    CheckpointFiles,
    LastCheckpoint,
    find_latest_checkpoint,
    list_checkpoints,
    read_checkpoint,
    read_last_checkpoint_info,
)
from tests.eventlog.log.checkpoint_samples import (
    UUID_A,
    V2_PROTOCOL,
    NoListing,
    V,
    assert_same_state,
    checkpoint_name,
    kind_rows,
    our_rows,
    py_actions,
    sidecar_action,
    v2_header,
    v2_state,
    write_json_lines,
    write_sidecars,
)


def test_v2_json_checkpoint_with_sidecars(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    state = v2_state()
    rows = our_rows(tmp_path, state)
    sidecars = write_sidecars(log, rows, 3)
    top = log / checkpoint_name(V, f"{UUID_A}.json")
    write_json_lines(top, [*v2_header(rows, V), *(sidecar_action(p) for p in sidecars)])
    fs, log_dir = fsspec.filesystem("file"), str(log)
    names = os.listdir(log)
    assert list_checkpoints(names) == [CheckpointFiles(V, "v2", (top.name,))]
    assert find_latest_checkpoint(fs, log_dir) == V
    assert_same_state(read_checkpoint(fs, log_dir, V), state)
    assert_same_state(read_checkpoint(fs, log_dir, V, listing=names), state)

    # _last_checkpoint naming the V2 checkpoint (as Delta Spark writes it): no listing needed
    pointer = {
        "version": V,
        "size": 9,
        "sizeInBytes": top.stat().st_size,
        "numOfAddFiles": len(state.adds),
        "v2Checkpoint": {"path": top.name, "sizeInBytes": top.stat().st_size, "modificationTime": 1},
    }
    (log / "_last_checkpoint").write_bytes(orjson.dumps(pointer))
    info = read_last_checkpoint_info(fs, log_dir)
    assert info == LastCheckpoint(V, 9, None, top.stat().st_size, len(state.adds), top.name)
    assert_same_state(read_checkpoint(NoListing(), log_dir, V, last=info), state)


def test_v2_json_checkpoint_with_inline_file_actions(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    state = v2_state()
    rows = our_rows(tmp_path, state)
    actions = [*v2_header(rows, V), *py_actions(kind_rows(rows, ("add", "remove")))]
    write_json_lines(log / checkpoint_name(V, f"{UUID_A}.json"), actions)
    assert_same_state(read_checkpoint(fsspec.filesystem("file"), str(log), V), state)


def _v2_parquet(rows: pa.Table, version: int, sidecars: list[Path]) -> pa.Table:
    schema = pa.schema(
        [
            *CHECKPOINT_SCHEMA,
            (
                "checkpointMetadata",
                pa.struct([("version", pa.int64()), ("tags", pa.map_(pa.string(), pa.string()))]),
            ),
            (
                "sidecar",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("sizeInBytes", pa.int64()),
                        ("modificationTime", pa.int64()),
                        ("tags", pa.map_(pa.string(), pa.string())),
                    ]
                ),
            ),
        ]
    )
    non_file = kind_rows(rows, ("protocol", "metaData", "txn", "domainMetadata")).to_pylist()
    extra: list[dict[str, Any]] = [{"checkpointMetadata": {"version": version, "tags": []}}]
    extra += [{"sidecar": {**sidecar_action(p)["sidecar"], "tags": []}} for p in sidecars]
    return pa.Table.from_pylist([*extra, *non_file], schema=schema)


@pytest.mark.parametrize("naming", ["uuid", "classic"])
def test_v2_parquet_checkpoint_with_sidecars(tmp_path: Path, naming: str) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    state = v2_state()
    rows = our_rows(tmp_path, state)
    sidecars = write_sidecars(log, rows, 2)
    name = checkpoint_name(V, f"{UUID_A}.parquet") if naming == "uuid" else checkpoint_name(V, "parquet")
    pq.write_table(_v2_parquet(rows, V, sidecars), log / name)
    fs, log_dir = fsspec.filesystem("file"), str(log)
    kind = "v2" if naming == "uuid" else "classic"
    assert list_checkpoints(os.listdir(log)) == [CheckpointFiles(V, kind, (name,))]
    assert find_latest_checkpoint(fs, log_dir) == V
    assert_same_state(read_checkpoint(fs, log_dir, V), state)


def test_v2_errors(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    state = v2_state()
    rows = our_rows(tmp_path, state)
    sidecars = write_sidecars(log, rows, 2)
    fs, log_dir = fsspec.filesystem("file"), str(log)
    top = log / checkpoint_name(V, f"{UUID_A}.json")

    # a sidecar is missing: FileNotFoundError (the checkpoint cannot be used)
    gone = log / "_sidecars" / f"{uuid.uuid4()}.parquet"
    write_json_lines(
        top,
        [
            *v2_header(rows, V),
            *(sidecar_action(p) for p in sidecars),
            {"sidecar": {"path": gone.name, "sizeInBytes": 1, "modificationTime": 1}},
        ],
    )
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, V)

    # a corrupt sidecar: CorruptLogError naming it
    bad = log / "_sidecars" / "bad.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    write_json_lines(
        top,
        [*v2_header(rows, V), {"sidecar": {"path": "bad.parquet", "sizeInBytes": 1, "modificationTime": 1}}],
    )
    with pytest.raises(CorruptLogError) as info:
        read_checkpoint(fs, log_dir, V)
    assert info.value.uri == f"{log_dir}/_sidecars/bad.parquet"

    # checkpointMetadata of another version; a torn JSON line; a sidecar without a path
    header = v2_header(rows, V)
    cases: list[tuple[list[Any], str]] = [
        ([{"checkpointMetadata": {"version": V + 1}}, *header[1:]], "checkpointMetadata"),
        ([*header, "torn"], "single action"),
        ([*header, {"sidecar": {"sizeInBytes": 1}}], r"sidecar\.path"),
    ]
    for actions, match in cases:
        write_json_lines(top, actions)
        with pytest.raises(CorruptLogError, match=match) as info:
            read_checkpoint(fs, log_dir, V)
        assert (info.value.uri, info.value.version) == (str(top), V)
    top.write_bytes(b'{"checkpointMetadata": {"version": 7}}\n{"protocol": ')
    with pytest.raises(CorruptLogError):
        read_checkpoint(fs, log_dir, V)


def test_sidecar_paths_are_url_decoded_and_may_be_absolute(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    (log / "_sidecars").mkdir(parents=True)
    state = v2_state()
    rows = our_rows(tmp_path, state)
    files = kind_rows(rows, ("add", "remove")).select(["add", "remove"])
    pq.write_table(files.slice(0, 10), log / "_sidecars" / "a b.parquet")
    pq.write_table(files.slice(10), tmp_path / "elsewhere.parquet")
    sidecars = [
        {"sidecar": {"path": "a%20b.parquet", "sizeInBytes": 1, "modificationTime": 1}},
        {
            "sidecar": {
                "path": f"file://{tmp_path}/elsewhere.parquet",
                "sizeInBytes": 1,
                "modificationTime": 1,
            }
        },
    ]
    write_json_lines(log / checkpoint_name(V, f"{UUID_A}.json"), [*v2_header(rows, V), *sidecars])
    assert_same_state(read_checkpoint(fsspec.filesystem("file"), str(log), V), state)


def test_v2_checkpoint_tables_are_read_and_written() -> None:
    # imported here: this module otherwise needs only eventlog.log
    from eventlog.snapshot.protocol import reader_missing, writer_missing

    assert reader_missing(V2_PROTOCOL) == []
    assert writer_missing(V2_PROTOCOL) == []  # V2 checkpoints written: eventlog.log.checkpoint_v2
