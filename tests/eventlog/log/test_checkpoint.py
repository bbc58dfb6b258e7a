"""Classic Delta checkpoints: round trip, pointer file, listing, and delta-rs compatibility."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog.errors import CorruptLogError
from eventlog.log.actions import (
    Action,
    AddFile,
    CommitInfo,
    DeletionVectorDescriptor,
    DomainMetadata,
    Format,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    encode_commit,
)
from eventlog.log.checkpoint import (
    CHECKPOINT_SCHEMA,
    CheckpointState,
    checkpoint_path,
    find_latest_checkpoint,
    read_checkpoint,
    read_last_checkpoint,
    write_checkpoint,
)

deltalake = pytest.importorskip("deltalake")

SCHEMA_STRING = orjson.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "value", "type": "double", "nullable": True, "metadata": {}},
            {"name": "name", "type": "string", "nullable": True, "metadata": {}},
            {"name": "part", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
).decode()


def _stats(n: int, lo: int, hi: int) -> str:
    return orjson.dumps(
        {"numRecords": n, "minValues": {"id": lo}, "maxValues": {"id": hi}, "nullCount": {"id": 0}}
    ).decode()


def full_state(version: int = 7) -> CheckpointState:
    """A state exercising every action kind and every optional field."""
    dv_uuid = DeletionVectorDescriptor("u", "ab^-aqEH.-t@S}K{vb[*k^", 36, 3, offset=1)
    dv_inline = DeletionVectorDescriptor("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", 40, 2)
    return CheckpointState(
        version=version,
        protocol=Protocol(3, 7, ("deletionVectors",), ("deletionVectors", "domainMetadata", "rowTracking")),
        metadata=Metadata(
            id="5fba94ed-9794-4965-ba6e-6ee3c0d22af9",
            schema_string=SCHEMA_STRING,
            partition_columns=("part",),
            configuration={"delta.enableDeletionVectors": "true", "delta.appendOnly": "false"},
            created_time=1_700_000_000_000,
            name="events",
            description="a table",
            format=Format("parquet", {"compression": "snappy"}),
        ),
        adds=[
            AddFile(
                "part=a/f1.parquet", {"part": "a"}, 100, 1_700_000_000_001, True, _stats(3, 1, 3),
                tags={"INSERTION_TIME": "1700000000001000", "ZCUBE": "x"}, deletion_vector=dv_uuid,
                base_row_id=0, default_row_commit_version=2,
            ),
            AddFile("part=__HIVE_DEFAULT_PARTITION__/f2.parquet", {"part": None}, 200, 1_700_000_000_002,
                    False, deletion_vector=dv_inline),
            AddFile("part=b/f%20sp%C3%A9cial.parquet", {"part": "b"}, 300, 1_700_000_000_003, True,
                    _stats(1, 9, 9), tags={}),
        ],
        removes=[
            RemoveFile(
                "part=a/old.parquet", 1_700_000_000_100, True, True, {"part": "a"}, 50,
                deletion_vector=dv_uuid, base_row_id=10, default_row_commit_version=1,
            ),
            RemoveFile("part=b/older.parquet", None, False, None, None, None),
            RemoveFile("part=c/null.parquet", 1_700_000_000_200, True, True, {"part": None}, 7),
        ],
        txns=[SetTransaction("stream-1", 42, 1_700_000_000_050), SetTransaction("batch-job", 3, None)],
        domains=[
            DomainMetadata("delta.rowTracking", '{"rowIdHighWaterMark":12}'),
            DomainMetadata("app.custom", ""),
        ],
    )  # fmt: skip


def assert_states_equal(got: CheckpointState, want: CheckpointState) -> None:
    assert got.version == want.version
    for name in ("protocol", "metadata"):
        g, w = getattr(got, name), getattr(want, name)
        for f in dataclasses.fields(w):
            assert getattr(g, f.name) == getattr(w, f.name), f"{name}.{f.name}"
    for name in ("adds", "removes", "txns", "domains"):
        g_list, w_list = list(getattr(got, name)), list(getattr(want, name))
        assert len(g_list) == len(w_list), name
        for i, (g, w) in enumerate(zip(g_list, w_list, strict=True)):
            for f in dataclasses.fields(w):
                assert getattr(g, f.name) == getattr(w, f.name), f"{name}[{i}].{f.name}"
            assert g == w


@pytest.fixture(params=["local", "memory"])
def fs_and_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    if request.param == "local":
        log = tmp_path / "t" / "_delta_log"
        log.mkdir(parents=True)
        yield fsspec.filesystem("file"), str(log)
    else:
        fs = fsspec.filesystem("memory")
        root = f"/cp-{uuid.uuid4().hex}"
        yield fs, f"{root}/_delta_log"
        fs.rm(root, recursive=True)


# --------------------------------------------------------------------------- round trip


def test_checkpoint_path() -> None:
    assert checkpoint_path("s3://b/t/_delta_log/", 12) == (
        "s3://b/t/_delta_log/00000000000000000012.checkpoint.parquet"
    )


def test_round_trip_every_action_kind(fs_and_log: tuple[Any, str]) -> None:
    fs, log = fs_and_log
    state = full_state()
    nbytes = write_checkpoint(fs, log, state)
    assert nbytes == fs.size(checkpoint_path(log, 7))
    assert_states_equal(read_checkpoint(fs, log, 7), state)
    # Only the checkpoint and the pointer: no temp file left behind.
    names = sorted(p.rpartition("/")[2] for p in fs.ls(log, detail=False))
    assert names == ["00000000000000000007.checkpoint.parquet", "_last_checkpoint"]


def test_last_checkpoint_content(fs_and_log: tuple[Any, str]) -> None:
    fs, log = fs_and_log
    state = full_state()
    nbytes = write_checkpoint(fs, log, state)
    pointer = orjson.loads(fs.cat_file(f"{log}/_last_checkpoint"))
    # 1 protocol + 1 metaData + 2 txn + 2 domain + 3 add + 3 remove
    assert pointer == {"version": 7, "size": 12, "sizeInBytes": nbytes, "numOfAddFiles": 3}
    assert read_last_checkpoint(fs, log) == 7


def test_last_checkpoint_never_moves_backwards(fs_and_log: tuple[Any, str]) -> None:
    fs, log = fs_and_log
    write_checkpoint(fs, log, full_state(10))
    write_checkpoint(fs, log, full_state(4))
    assert read_last_checkpoint(fs, log) == 10
    assert fs.exists(checkpoint_path(log, 4))
    write_checkpoint(fs, log, full_state(12))
    assert read_last_checkpoint(fs, log) == 12


def test_parquet_layout_matches_protocol(tmp_path: Path) -> None:
    fs, log = fsspec.filesystem("file"), str(tmp_path)
    state = dataclasses.replace(full_state(), protocol=Protocol(1, 2, ("ignored",), ("ignored",)))
    write_checkpoint(fs, log, state)
    table = pq.read_table(checkpoint_path(log, 7))
    assert table.schema == CHECKPOINT_SCHEMA
    assert "commitInfo" not in table.column_names
    remove_fields = {f.name for f in table.schema.field("remove").type}
    assert "stats" not in remove_fields and "tags" not in remove_fields
    # exactly one non-null action column per row
    columns = [table.column(n).is_valid().to_pylist() for n in table.column_names]
    assert all(sum(row) == 1 for row in zip(*columns, strict=True))
    # below reader 3 / writer 7 the feature lists must be null
    (proto,) = [p for p in table.column("protocol").to_pylist() if p is not None]
    assert proto == {
        "minReaderVersion": 1,
        "minWriterVersion": 2,
        "readerFeatures": None,
        "writerFeatures": None,
    }


def test_remove_stats_and_domain_tombstones_are_not_checkpointed(tmp_path: Path) -> None:
    fs, log = fsspec.filesystem("file"), str(tmp_path)
    state = dataclasses.replace(
        full_state(),
        removes=[RemoveFile("x.parquet", 5, True, True, {}, 1, stats=_stats(1, 1, 1))],
        domains=[DomainMetadata("live", "{}"), DomainMetadata("gone", "{}", removed=True)],
    )
    write_checkpoint(fs, log, state)
    got = read_checkpoint(fs, log, 7)
    assert got.removes == [RemoveFile("x.parquet", 5, True, True, {}, 1)]
    assert got.domains == [DomainMetadata("live", "{}")]


def test_write_stats_as_json_false_omits_stats(tmp_path: Path) -> None:
    fs, log = fsspec.filesystem("file"), str(tmp_path)
    base = full_state()
    meta = dataclasses.replace(base.metadata, configuration={"delta.checkpoint.writeStatsAsJson": "false"})
    write_checkpoint(fs, log, dataclasses.replace(base, metadata=meta))
    assert all(a.stats is None for a in read_checkpoint(fs, log, 7).adds)


# --------------------------------------------------------------------------- locating


def test_find_latest_checkpoint_from_listing() -> None:
    listing = [
        "00000000000000000000.json",
        "00000000000000000005.checkpoint.parquet",
        "s3://b/t/_delta_log/00000000000000000010.checkpoint.parquet",
        "00000000000000000012.checkpoint.0000000001.0000000002.parquet",
        "00000000000000000012.checkpoint.0000000002.0000000002.parquet",
        "00000000000000000014.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.parquet",
        "00000000000000000015.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json",
        "_sidecars/00000000000000000016.checkpoint.parquet.x",
        ".00000000000000000017.checkpoint.parquet.abc.tmp",
        "00000000000000000011.json",
        "00000000000000000011.crc",
        "_last_checkpoint",
    ]
    # Issue 14: multi-part (12, complete) and UUID-named V2 checkpoints (14, 15) count too;
    # this assertion was `== 10` while only classic checkpoints were read.
    assert find_latest_checkpoint(None, "unused", listing=listing) == 15
    assert find_latest_checkpoint(None, "unused", at_or_before=9, listing=listing) == 5
    assert find_latest_checkpoint(None, "unused", at_or_before=10, listing=listing) == 10
    assert find_latest_checkpoint(None, "unused", at_or_before=4, listing=listing) is None
    assert find_latest_checkpoint(None, "unused", listing=[]) is None


def test_find_latest_checkpoint_lists_directory(fs_and_log: tuple[Any, str]) -> None:
    fs, log = fs_and_log
    assert find_latest_checkpoint(fs, f"{log}/missing") is None
    write_checkpoint(fs, log, full_state(3))
    write_checkpoint(fs, log, full_state(8))
    fs.pipe_file(f"{log}/00000000000000000020.checkpoint.0000000001.0000000002.parquet", b"x")
    assert find_latest_checkpoint(fs, log) == 8
    assert find_latest_checkpoint(fs, log, at_or_before=7) == 3


# --------------------------------------------------------------------------- corruption


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", b'{"version": "3"}', b'{"version": -1}', b'{"version": true}', b"{}", b""],
)
def test_corrupt_last_checkpoint_is_none(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "_last_checkpoint").write_bytes(content)
    assert read_last_checkpoint(fsspec.filesystem("file"), str(tmp_path)) is None


def test_absent_last_checkpoint_is_none(tmp_path: Path) -> None:
    assert read_last_checkpoint(fsspec.filesystem("file"), str(tmp_path / "nope")) is None


# A checkpoint layout as another writer might produce it: other column order, all fields
# nullable, extra columns/fields, optional ones missing.
FOREIGN_SCHEMA = pa.schema([
    ("commitInfo", pa.struct([("timestamp", pa.int64())])),
    ("add", pa.struct([
        ("path", pa.string()), ("size", pa.int64()), ("partitionValues", pa.map_(pa.string(), pa.string())),
        ("modificationTime", pa.int64()), ("dataChange", pa.bool_()), ("stats", pa.string()),
        ("stats_parsed", pa.struct([
            ("numRecords", pa.int64()), ("minValues", pa.struct([("id", pa.int64())])),
        ])),
        ("partitionValues_parsed", pa.struct([("p", pa.int32())])), ("clusteringProvider", pa.string()),
    ])),
    ("metaData", pa.struct([
        ("schemaString", pa.string()), ("id", pa.string()), ("partitionColumns", pa.list_(pa.string())),
        ("format", pa.struct([("provider", pa.string()), ("options", pa.map_(pa.string(), pa.string()))])),
        ("configuration", pa.map_(pa.string(), pa.string())),
    ])),
    ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())])),
    ("sidecar", pa.struct([("path", pa.string()), ("sizeInBytes", pa.int64())])),
])  # fmt: skip


def _write_raw(path: str, table: pa.Table) -> None:
    pq.write_table(table, path)


def test_corrupt_checkpoints_raise(tmp_path: Path) -> None:
    fs, log = fsspec.filesystem("file"), str(tmp_path)
    path = checkpoint_path(log, 1)

    Path(path).write_bytes(b"PAR1 garbage, not parquet")
    with pytest.raises(CorruptLogError) as info:
        read_checkpoint(fs, log, 1)
    err: Any = info.value  # EventlogError sets its fields dynamically
    assert (err.version, err.uri) == (1, path)

    write_checkpoint(fs, log, full_state(1))
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CorruptLogError):
        read_checkpoint(fs, log, 1)

    proto = pa.array([{"minReaderVersion": 1, "minWriterVersion": 2}] * 2)
    _write_raw(path, pa.table({"protocol": proto}))  # two protocols, no metaData
    with pytest.raises(CorruptLogError, match="exactly one protocol"):
        read_checkpoint(fs, log, 1)

    _write_raw(path, pa.table({"add": pa.array(["a", "b"])}))  # not a struct column
    with pytest.raises(CorruptLogError, match="not a struct"):
        read_checkpoint(fs, log, 1)

    rows = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": "x", "schemaString": SCHEMA_STRING}},
        {"add": {"path": None, "size": 1, "modificationTime": 1}},  # add without a path
    ]
    _write_raw(path, pa.Table.from_pylist(rows, schema=FOREIGN_SCHEMA))
    with pytest.raises(CorruptLogError, match=r"add\.path"):
        read_checkpoint(fs, log, 1)


def test_missing_checkpoint_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fsspec.filesystem("file"), str(tmp_path), 3)


def test_reader_tolerates_foreign_layout(tmp_path: Path) -> None:
    """Different column order, extra columns/fields, and missing optional columns."""
    fs, log = fsspec.filesystem("file"), str(tmp_path)
    rows = [
        {"add": {
            "path": "f.parquet", "partitionValues": [("p", "1")], "size": 5, "modificationTime": 6,
            "dataChange": False, "stats": _stats(2, 0, 1),
            "stats_parsed": {"numRecords": 2, "minValues": {"id": 0}},
            "partitionValues_parsed": {"p": 1}, "clusteringProvider": "liquid",
        }},
        {"metaData": {"id": "m", "schemaString": SCHEMA_STRING, "partitionColumns": ["p"],
                      "format": {"provider": "parquet", "options": []}, "configuration": [("k", "v")]}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"sidecar": None, "commitInfo": {"timestamp": 1}},
    ]  # fmt: skip
    _write_raw(checkpoint_path(log, 2), pa.Table.from_pylist(rows, schema=FOREIGN_SCHEMA))
    got = read_checkpoint(fs, log, 2)
    assert got.protocol == Protocol(1, 2)
    assert got.metadata == Metadata("m", SCHEMA_STRING, ("p",), {"k": "v"})
    assert got.adds == [
        AddFile("f.parquet", {"p": "1"}, 5, 6, False, _stats(2, 0, 1), clustering_provider="liquid")
    ]
    assert (got.removes, got.txns, got.domains) == ([], [], [])


# --------------------------------------------------------------------------- delta-rs


def _local(file_uri: str) -> str:
    return file_uri.removeprefix("file://")


def _arrow(obj: Any) -> pa.Table:
    return obj if isinstance(obj, pa.Table) else pa.table(obj)


def test_reads_checkpoint_written_by_deltalake(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    data = pa.table({"id": [1, 2, 3, 4], "part": ["x", None, "y", "x"]})
    deltalake.write_deltalake(uri, data, partition_by=["part"])
    deltalake.write_deltalake(uri, pa.table({"id": [5], "part": ["z"]}), mode="append")
    dt = deltalake.DeltaTable(uri)
    dt.delete("id = 1")  # rewrites a file -> a remove tombstone in the checkpoint
    dt = deltalake.DeltaTable(uri)
    dt.create_checkpoint()
    fs, log = fsspec.filesystem("file"), f"{uri}/_delta_log"
    version = dt.version()
    assert read_last_checkpoint(fs, log) == version
    assert find_latest_checkpoint(fs, log) == version

    state = read_checkpoint(fs, log, version)
    actions = _arrow(dt.get_add_actions(flatten=False)).to_pylist()
    want = {a["path"]: a for a in actions}
    assert {a.path for a in state.adds} == set(want)
    for add in state.adds:
        assert add.size == want[add.path]["size_bytes"]
        assert dict(add.partition_values) == want[add.path]["partition"]
        assert add.modification_time == want[add.path]["modification_time"]
        assert add.num_records == want[add.path]["num_records"]
    assert {f"{uri}/{a.path}" for a in state.adds} == {_local(u) for u in dt.file_uris()}
    assert len(state.removes) >= 1 and all(r.deletion_timestamp for r in state.removes)
    assert state.metadata.id == dt.metadata().id
    assert state.metadata.partition_columns == ("part",)
    proto = dt.protocol()
    assert (state.protocol.min_reader_version, state.protocol.min_writer_version) == (
        proto.min_reader_version,
        proto.min_writer_version,
    )


def _write_data_file(root: Path, rel: str, ids: list[int]) -> AddFile:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "id": pa.array(ids, pa.int64()),
        "value": pa.array([i * 1.5 for i in ids], pa.float64()),
        "name": pa.array([f"n{i}" for i in ids], pa.string()),
    })  # fmt: skip
    pq.write_table(table, path)
    part = rel.split("/")[0].split("=", 1)[1]
    return AddFile(
        path=rel,
        partition_values={"part": None if part == "__HIVE_DEFAULT_PARTITION__" else part},
        size=path.stat().st_size,
        modification_time=int(path.stat().st_mtime * 1000),
        data_change=True,
        stats=_stats(len(ids), min(ids), max(ids)),
    )


def test_deltalake_opens_table_from_our_checkpoint_only(tmp_path: Path) -> None:
    root = tmp_path / "t"
    log = root / "_delta_log"
    log.mkdir(parents=True)
    f1 = _write_data_file(root, "part=a/f1.parquet", [1, 2])
    f2 = _write_data_file(root, "part=b/f2.parquet", [3, 4, 5])
    f3 = _write_data_file(root, "part=__HIVE_DEFAULT_PARTITION__/f3.parquet", [6])
    f4 = _write_data_file(root, "part=a/f4.parquet", [7, 8])
    protocol = Protocol(1, 2)
    meta = Metadata(Metadata.new_id(), SCHEMA_STRING, ("part",), {}, created_time=1_700_000_000_000)
    txn = SetTransaction("app-1", 17, 1_700_000_000_500)
    ts = 1_700_000_000_000
    commits: list[list[Action]] = [
        [CommitInfo(ts, "CREATE TABLE"), protocol, meta, f1],
        [CommitInfo(ts + 1, "WRITE"), f2, f3],
        [CommitInfo(ts + 2, "DELETE"), f1.remove(ts + 2), f4, txn],
        [CommitInfo(ts + 3, "WRITE"), SetTransaction("app-1", 18, ts + 3)],
    ]
    for v, actions in enumerate(commits):
        (log / f"{v:020d}.json").write_bytes(encode_commit(actions))
    n = len(commits) - 1

    expected = deltalake.DeltaTable(str(root)).to_pyarrow_table().sort_by("id")
    assert expected.column("id").to_pylist() == [3, 4, 5, 6, 7, 8]

    state = CheckpointState(
        version=n, protocol=protocol, metadata=meta, adds=[f2, f3, f4], removes=[f1.remove(ts + 2)],
        txns=[SetTransaction("app-1", 18, ts + 3)], domains=[],
    )  # fmt: skip
    fs = fsspec.filesystem("file")
    write_checkpoint(fs, str(log), state)
    for v in range(n):  # only the checkpoint (and the JSON at its version) remain
        os.remove(log / f"{v:020d}.json")

    for drop_pointer in (False, True):
        if drop_pointer:  # delta-rs must also find it by listing
            os.remove(log / "_last_checkpoint")
        dt = deltalake.DeltaTable(str(root))
        assert dt.version() == n
        assert sorted(_local(u) for u in dt.file_uris()) == sorted(f"{root}/{a.path}" for a in state.adds)
        got = dt.to_pyarrow_table().select(expected.column_names).sort_by("id")
        assert got.equals(expected)
        assert dt.transaction_version("app-1") == 18
        listed = {a["path"]: a for a in _arrow(dt.get_add_actions(flatten=False)).to_pylist()}
        assert {p: a["num_records"] for p, a in listed.items()} == {a.path: a.num_records for a in state.adds}

    # delta-rs can keep writing on top, and its own checkpoint reads back the same files
    deltalake.write_deltalake(str(root), pa.table({"id": [9], "value": [0.5], "name": ["n9"],
                                                   "part": ["c"]}), mode="append")  # fmt: skip
    dt = deltalake.DeltaTable(str(root))
    assert dt.version() == n + 1
    assert dt.to_pyarrow_table().num_rows == 7
    dt.create_checkpoint()
    theirs = read_checkpoint(fs, str(log), n + 1)
    assert {f"{root}/{a.path}" for a in theirs.adds} == {_local(u) for u in dt.file_uris()}
    assert {a.path for a in state.adds} < {a.path for a in theirs.adds}
    assert [(t.app_id, t.version) for t in theirs.txns] == [("app-1", 18)]


# --------------------------------------------------------------------------- scale


def test_hundred_thousand_files_round_trip(tmp_path: Path) -> None:
    fs, log = fsspec.filesystem("file"), str(tmp_path)
    adds = [
        AddFile(f"date=2024-01-{i % 28 + 1:02d}/part-{i:06d}-{uuid.UUID(int=i)}.parquet",
                {"date": f"2024-01-{i % 28 + 1:02d}"}, 1_000_000 + i, 1_700_000_000_000 + i, True,
                _stats(1000, i, i + 999))
        for i in range(100_000)
    ]  # fmt: skip
    state = dataclasses.replace(full_state(5), adds=adds)
    t0 = time.perf_counter()
    write_checkpoint(fs, log, state)
    t1 = time.perf_counter()
    got = read_checkpoint(fs, log, 5)
    t2 = time.perf_counter()
    assert got.adds == adds
    # Generous bounds: catch accidental quadratic behaviour, not machine speed.
    assert t1 - t0 < 20 and t2 - t1 < 20, (t1 - t0, t2 - t1)
