"""Every checkpoint kind of the Delta protocol, columnar file state, and delta-rs interop.

Multi-part, UUID-named V2 (JSON and Parquet, with sidecars), classic-named V2, checkpoints
written by delta-rs (also with deletion vectors), ``_last_checkpoint`` with ``parts`` and
``v2Checkpoint``, and a 200,000-file round trip read back as an equal Arrow table.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from eventlog.errors import CorruptLogError
from eventlog.log.actions import AddFile, DeletionVectorDescriptor, Protocol, RemoveFile
from eventlog.log.checkpoint import (
    CHECKPOINT_SCHEMA,
    ROW_GROUP_ROWS,
    AddFiles,
    CheckpointFiles,
    CheckpointState,
    LastCheckpoint,
    checkpoint_path,
    find_latest_checkpoint,
    list_checkpoints,
    read_checkpoint,
    read_last_checkpoint,
    read_last_checkpoint_info,
    write_checkpoint,
)
from eventlog.log.filetable import ADD_SCHEMA, REMOVE_SCHEMA, add_files, adds_table
from tests.eventlog.log.test_checkpoint import SCHEMA_STRING, assert_states_equal, full_state

deltalake = pytest.importorskip("deltalake")

V = 7
UUID_A = "80a083e8-7026-4e79-81be-64bd76c43a11"
V2_PROTOCOL = Protocol(3, 7, ("deletionVectors", "v2Checkpoint"), ("deletionVectors", "v2Checkpoint"))


def _name(version: int, suffix: str) -> str:
    return f"{version:020d}.checkpoint.{suffix}"


def many_adds(n: int, *, offset: int = 0) -> list[AddFile]:
    return [
        AddFile(
            f"d={i % 3}/f-{offset + i:06d}.parquet",
            {"d": str(i % 3)},
            100 + i,
            1_700_000_000_000 + i,
            i % 2 == 0,
            f'{{"numRecords":{i}}}',
            tags={"k": str(i)} if i % 5 == 0 else None,
            deletion_vector=DeletionVectorDescriptor("u", f"dv{i:018d}xx", 30, i, offset=i)
            if i % 7 == 0
            else None,
        )
        for i in range(n)
    ]


def rich_state(version: int = V) -> CheckpointState:
    """full_state plus enough files that they spread over several parts/sidecars."""
    base = full_state(version)
    return dataclasses.replace(base, adds=[*base.adds, *many_adds(40)])


def _our_rows(tmp: Path, state: CheckpointState) -> pa.Table:
    """Our checkpoint of ``state`` as a raw table (one row per action)."""
    write_checkpoint(fsspec.filesystem("file"), str(tmp), state)
    return pq.read_table(checkpoint_path(str(tmp), state.version))


def _kind_rows(rows: pa.Table, kinds: tuple[str, ...]) -> pa.Table:
    mask = None
    for kind in kinds:
        valid = rows.column(kind).is_valid()
        mask = valid if mask is None else pc.or_(mask, valid)
    return rows.filter(mask)


def _write_json_lines(path: Path, actions: list[Any]) -> None:
    path.write_bytes(b"\n".join(orjson.dumps(a) for a in actions) + b"\n")


def _py_actions(rows: pa.Table) -> list[dict[str, Any]]:
    """Rows of a checkpoint table as JSON actions (maps become objects)."""
    out = []
    for row in rows.to_pylist():
        ((kind, body),) = [(k, v) for k, v in row.items() if v is not None]
        body = {k: v for k, v in body.items() if v is not None}
        for key in ("partitionValues", "tags", "configuration"):
            if isinstance(body.get(key), list):
                body[key] = dict(body[key])
        if kind == "metaData":
            body["format"]["options"] = dict(body["format"]["options"])
        out.append({kind: body})
    return out


def _sidecar_action(path: Path) -> dict[str, Any]:
    return {
        "sidecar": {
            "path": path.name,
            "sizeInBytes": path.stat().st_size,
            "modificationTime": int(path.stat().st_mtime * 1000),
            "tags": {},
        }
    }


def _write_sidecars(log: Path, rows: pa.Table, n: int) -> list[Path]:
    """The add/remove rows of ``rows`` split over ``n`` sidecar files (add/remove columns only)."""
    files = _kind_rows(rows, ("add", "remove")).select(["add", "remove"])
    (log / "_sidecars").mkdir(exist_ok=True)
    paths = []
    for i in range(n):
        part = files.take(pa.array(np.arange(i, files.num_rows, n)))
        path = log / "_sidecars" / f"{uuid.uuid4()}.parquet"
        pq.write_table(part, path)
        paths.append(path)
    return paths


class NoListing(fsspec.implementations.local.LocalFileSystem):  # type: ignore[misc]
    """A local file system that refuses to list: proves a read opens files by name."""

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        raise AssertionError(f"listed {path}")


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


# --------------------------------------------------------------------------- multi-part


def _write_multipart(
    tmp: Path, log: Path, state: CheckpointState, parts: int, skip: int | None = None
) -> None:
    rows = _our_rows(tmp, state)
    for i in range(parts):
        if skip == i + 1:
            continue
        # Every part holds rows of several kinds; protocol/metaData land in some part.
        part = rows.take(pa.array(np.arange(i, rows.num_rows, parts)))
        pq.write_table(part, log / _name(state.version, f"{i + 1:010d}.{parts:010d}.parquet"))


def test_multipart_checkpoint(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    (tmp_path / "scratch").mkdir()
    state = rich_state()
    _write_multipart(tmp_path / "scratch", log, state, parts=3)
    (log / "_last_checkpoint").write_bytes(orjson.dumps({"version": V, "size": 60, "parts": 3}))
    fs, log_dir = fsspec.filesystem("file"), str(log)
    names = os.listdir(log)
    assert find_latest_checkpoint(fs, log_dir) == V
    assert list_checkpoints(names) == [
        CheckpointFiles(V, "multipart", tuple(_name(V, f"{i:010d}.0000000003.parquet") for i in (1, 2, 3)))
    ]
    want = sorted(state.adds, key=lambda a: a.path)
    for got in (
        read_checkpoint(fs, log_dir, V),  # classic absent: the directory is listed
        read_checkpoint(fs, log_dir, V, listing=names),
        read_checkpoint(NoListing(), log_dir, V, last=read_last_checkpoint_info(fs, log_dir)),
    ):
        assert got.protocol == state.protocol and got.metadata == state.metadata
        assert sorted(got.adds, key=lambda a: a.path) == want
        assert sorted(got.removes, key=lambda r: r.path) == sorted(state.removes, key=lambda r: r.path)
        assert sorted(got.txns, key=lambda t: t.app_id) == sorted(state.txns, key=lambda t: t.app_id)
        assert sorted(got.domains, key=lambda d: d.domain) == sorted(state.domains, key=lambda d: d.domain)
        assert got.add_table.schema == ADD_SCHEMA


def test_incomplete_multipart_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    (tmp_path / "scratch").mkdir()
    fs, log_dir = fsspec.filesystem("file"), str(log)
    write_checkpoint(fs, log_dir, full_state(5))
    _write_multipart(tmp_path / "scratch", log, rich_state(9), parts=3, skip=2)
    names = os.listdir(log)
    assert find_latest_checkpoint(fs, log_dir) == 5
    assert find_latest_checkpoint(fs, log_dir, listing=names) == 5
    assert [cp.version for cp in list_checkpoints(names)] == [5]
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, 9)
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, 9, listing=names)
    # a pointer naming the incomplete set: the missing part is a missing file
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, 9, last=LastCheckpoint(9, parts=3))
    assert_states_equal(read_checkpoint(fs, log_dir, 5, listing=names), full_state(5))


# --------------------------------------------------------------------------- V2


def _v2_header(rows: pa.Table, version: int) -> list[dict[str, Any]]:
    non_file = _py_actions(_kind_rows(rows, ("protocol", "metaData", "txn", "domainMetadata")))
    return [{"checkpointMetadata": {"version": version, "tags": {}}}, *non_file]


def _v2_state(version: int = V) -> CheckpointState:
    return dataclasses.replace(rich_state(version), protocol=V2_PROTOCOL)


def _assert_same_state(got: CheckpointState, want: CheckpointState) -> None:
    assert (got.version, got.protocol, got.metadata) == (want.version, want.protocol, want.metadata)
    assert got.add_table.sort_by("path").equals(want.add_table.sort_by("path"))
    assert sorted(got.removes, key=lambda r: r.path) == sorted(want.removes, key=lambda r: r.path)
    assert sorted(got.txns, key=lambda t: t.app_id) == sorted(want.txns, key=lambda t: t.app_id)
    assert sorted(got.domains, key=lambda d: d.domain) == sorted(want.domains, key=lambda d: d.domain)


def test_v2_json_checkpoint_with_sidecars(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    state = _v2_state()
    rows = _our_rows(tmp_path, state)
    sidecars = _write_sidecars(log, rows, 3)
    top = log / _name(V, f"{UUID_A}.json")
    _write_json_lines(top, [*_v2_header(rows, V), *(_sidecar_action(p) for p in sidecars)])
    fs, log_dir = fsspec.filesystem("file"), str(log)
    names = os.listdir(log)
    assert list_checkpoints(names) == [CheckpointFiles(V, "v2", (top.name,))]
    assert find_latest_checkpoint(fs, log_dir) == V
    _assert_same_state(read_checkpoint(fs, log_dir, V), state)
    _assert_same_state(read_checkpoint(fs, log_dir, V, listing=names), state)

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
    _assert_same_state(read_checkpoint(NoListing(), log_dir, V, last=info), state)


def test_v2_json_checkpoint_with_inline_file_actions(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    state = _v2_state()
    rows = _our_rows(tmp_path, state)
    actions = [*_v2_header(rows, V), *_py_actions(_kind_rows(rows, ("add", "remove")))]
    _write_json_lines(log / _name(V, f"{UUID_A}.json"), actions)
    _assert_same_state(read_checkpoint(fsspec.filesystem("file"), str(log), V), state)


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
    non_file = _kind_rows(rows, ("protocol", "metaData", "txn", "domainMetadata")).to_pylist()
    extra: list[dict[str, Any]] = [{"checkpointMetadata": {"version": version, "tags": []}}]
    extra += [{"sidecar": {**_sidecar_action(p)["sidecar"], "tags": []}} for p in sidecars]
    return pa.Table.from_pylist([*extra, *non_file], schema=schema)


@pytest.mark.parametrize("naming", ["uuid", "classic"])
def test_v2_parquet_checkpoint_with_sidecars(tmp_path: Path, naming: str) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    state = _v2_state()
    rows = _our_rows(tmp_path, state)
    sidecars = _write_sidecars(log, rows, 2)
    name = _name(V, f"{UUID_A}.parquet") if naming == "uuid" else _name(V, "parquet")
    pq.write_table(_v2_parquet(rows, V, sidecars), log / name)
    fs, log_dir = fsspec.filesystem("file"), str(log)
    kind = "v2" if naming == "uuid" else "classic"
    assert list_checkpoints(os.listdir(log)) == [CheckpointFiles(V, kind, (name,))]
    assert find_latest_checkpoint(fs, log_dir) == V
    _assert_same_state(read_checkpoint(fs, log_dir, V), state)


def test_v2_errors(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    state = _v2_state()
    rows = _our_rows(tmp_path, state)
    sidecars = _write_sidecars(log, rows, 2)
    fs, log_dir = fsspec.filesystem("file"), str(log)
    top = log / _name(V, f"{UUID_A}.json")

    # a sidecar is missing: FileNotFoundError (the checkpoint cannot be used)
    gone = log / "_sidecars" / f"{uuid.uuid4()}.parquet"
    _write_json_lines(
        top,
        [
            *_v2_header(rows, V),
            *(_sidecar_action(p) for p in sidecars),
            {"sidecar": {"path": gone.name, "sizeInBytes": 1, "modificationTime": 1}},
        ],
    )
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, V)

    # a corrupt sidecar: CorruptLogError naming it
    bad = log / "_sidecars" / "bad.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    _write_json_lines(
        top,
        [*_v2_header(rows, V), {"sidecar": {"path": "bad.parquet", "sizeInBytes": 1, "modificationTime": 1}}],
    )
    with pytest.raises(CorruptLogError) as info:
        read_checkpoint(fs, log_dir, V)
    assert info.value.uri == f"{log_dir}/_sidecars/bad.parquet"

    # checkpointMetadata of another version; a torn JSON line; a sidecar without a path
    header = _v2_header(rows, V)
    cases: list[tuple[list[Any], str]] = [
        ([{"checkpointMetadata": {"version": V + 1}}, *header[1:]], "checkpointMetadata"),
        ([*header, "torn"], "single action"),
        ([*header, {"sidecar": {"sizeInBytes": 1}}], r"sidecar\.path"),
    ]
    for actions, match in cases:
        _write_json_lines(top, actions)
        with pytest.raises(CorruptLogError, match=match) as info:
            read_checkpoint(fs, log_dir, V)
        assert (info.value.uri, info.value.version) == (str(top), V)
    top.write_bytes(b'{"checkpointMetadata": {"version": 7}}\n{"protocol": ')
    with pytest.raises(CorruptLogError):
        read_checkpoint(fs, log_dir, V)


def test_sidecar_paths_are_url_decoded_and_may_be_absolute(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    (log / "_sidecars").mkdir(parents=True)
    state = _v2_state()
    rows = _our_rows(tmp_path, state)
    files = _kind_rows(rows, ("add", "remove")).select(["add", "remove"])
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
    _write_json_lines(log / _name(V, f"{UUID_A}.json"), [*_v2_header(rows, V), *sidecars])
    _assert_same_state(read_checkpoint(fsspec.filesystem("file"), str(log), V), state)


# --------------------------------------------------------------------------- locating


def test_listing_prefers_classic_then_v2_then_multipart() -> None:
    names = [
        _name(3, "0000000001.0000000002.parquet"),
        _name(3, "0000000002.0000000002.parquet"),
        _name(3, f"{UUID_A}.json"),
        _name(3, "parquet"),
        _name(4, "0000000001.0000000001.parquet"),  # a 1-part set is complete
        _name(6, "0000000003.0000000002.parquet"),  # part beyond its count: ignored
        _name(8, "not-a-uuid.json"),
        "_sidecars/x.parquet",
    ]
    assert [(c.version, c.kind) for c in list_checkpoints(names)] == [
        (4, "multipart"),
        (3, "classic"),
        (3, "v2"),
        (3, "multipart"),
    ]
    assert find_latest_checkpoint(None, "unused", listing=names) == 4
    assert find_latest_checkpoint(None, "unused", at_or_before=3, listing=names) == 3


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (
            {"version": 4, "size": 10, "parts": 3, "sizeInBytes": 99, "numOfAddFiles": 5},
            LastCheckpoint(4, 10, 3, 99, 5),
        ),
        (
            {"version": 4, "size": -1, "parts": "3", "sizeInBytes": True, "numOfAddFiles": -2},
            LastCheckpoint(4, -1),
        ),  # wrong types dropped
        (
            {"version": 4, "size": 1, "v2Checkpoint": {"path": _name(4, f"{UUID_A}.parquet")}},
            LastCheckpoint(4, 1, v2_checkpoint=_name(4, f"{UUID_A}.parquet")),
        ),
        ({"version": 4, "v2Checkpoint": {"path": _name(5, f"{UUID_A}.parquet")}}, LastCheckpoint(4)),
        ({"version": 4, "v2Checkpoint": {"path": "junk"}}, LastCheckpoint(4)),
        ({"size": 4}, None),
        ([4], None),
    ],
)
def test_last_checkpoint_info(tmp_path: Path, content: Any, want: LastCheckpoint | None) -> None:
    (tmp_path / "_last_checkpoint").write_bytes(orjson.dumps(content))
    fs = fsspec.filesystem("file")
    assert read_last_checkpoint_info(fs, str(tmp_path)) == want
    assert read_last_checkpoint(fs, str(tmp_path)) == (None if want is None else want.version)


def test_last_checkpoint_files() -> None:
    assert LastCheckpoint(2).files() == CheckpointFiles(2, "classic", (_name(2, "parquet"),))
    assert LastCheckpoint(2, parts=2).files() == CheckpointFiles(
        2, "multipart", (_name(2, "0000000001.0000000002.parquet"), _name(2, "0000000002.0000000002.parquet"))
    )
    v2 = _name(2, f"{UUID_A}.json")
    assert LastCheckpoint(2, parts=2, v2_checkpoint=v2).files() == CheckpointFiles(2, "v2", (v2,))


# --------------------------------------------------------------------------- delta-rs


def _json_state(log: Path) -> dict[str, dict[str, Any]]:
    """The live add actions by path, replayed from a table's JSON commits."""
    live: dict[str, dict[str, Any]] = {}
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json")):
        for line in (log / name).read_bytes().splitlines():
            action = orjson.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return live


def _arrow(obj: Any) -> pa.Table:
    return obj if isinstance(obj, pa.Table) else pa.table(obj)


def test_reads_deltalake_checkpoint_like_deltalake(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    data = pa.table({"id": list(range(20)), "p": ["x", "y", None, "z"] * 5, "q": [1, 2] * 10})
    deltalake.write_deltalake(uri, data, partition_by=["p", "q"])
    deltalake.write_deltalake(uri, data.slice(0, 4), mode="append", partition_by=["p", "q"])
    deltalake.DeltaTable(uri).delete("id = 3")
    dt = deltalake.DeltaTable(uri)
    dt.create_checkpoint()
    log = Path(uri) / "_delta_log"
    state = read_checkpoint(fsspec.filesystem("file"), str(log), dt.version())

    theirs = {r["path"]: r for r in _arrow(dt.get_add_actions(flatten=True)).to_pylist()}
    table = state.add_table
    assert table.schema == ADD_SCHEMA
    assert sorted(table.column("path").to_pylist()) == sorted(theirs)
    for row in table.to_pylist():
        want = theirs[row["path"]]
        assert (row["size"], row["modificationTime"]) == (want["size_bytes"], want["modification_time"])
        typed = {"p": want["partition.p"], "q": want["partition.q"]}  # deltalake types them
        assert dict(row["partitionValues"]) == {k: None if v is None else str(v) for k, v in typed.items()}
        assert orjson.loads(row["stats"])["numRecords"] == want["num_records"]
    # and exactly the add actions of the JSON log (stats strings included)
    logged = _json_state(log)
    assert {r["path"]: (dict(r["partitionValues"]), r["stats"]) for r in table.to_pylist()} == {
        p: (a["partitionValues"], a["stats"]) for p, a in logged.items()
    }
    assert len(state.removes) >= 1 and state.remove_table.schema == REMOVE_SCHEMA


def test_reads_deltalake_checkpoint_with_deletion_vectors(tmp_path: Path) -> None:
    """deltalake (1.x) cannot write deletion vectors itself (its DELETE rewrites files), so
    the DVs are committed as JSON here and deltalake writes the checkpoint holding them."""
    uri = tmp_path / "t"
    deltalake.write_deltalake(
        str(uri),
        pa.table({"id": list(range(10)), "p": ["a"] * 5 + ["b"] * 5}),
        partition_by=["p"],
        configuration={"delta.enableDeletionVectors": "true"},
    )
    log = uri / "_delta_log"
    adds = [
        orjson.loads(line)["add"]
        for line in (log / f"{0:020d}.json").read_bytes().splitlines()
        if b'"add"' in line
    ]
    dvs = [
        {
            "storageType": "u",
            "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
            "offset": 1,
            "sizeInBytes": 36,
            "cardinality": 2,
        },
        {
            "storageType": "i",
            "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
            "sizeInBytes": 40,
            "cardinality": 1,
        },
    ]
    commit = [{"commitInfo": {"timestamp": 2, "operation": "DELETE"}}]
    for add, dv in zip(adds, dvs, strict=True):
        commit.append(
            {
                "remove": {
                    "path": add["path"],
                    "deletionTimestamp": 2,
                    "dataChange": True,
                    "partitionValues": add["partitionValues"],
                    "size": add["size"],
                }
            }
        )
        commit.append({"add": {**add, "deletionVector": dv}})
    _write_json_lines(log / f"{1:020d}.json", commit)
    dt = deltalake.DeltaTable(str(uri))
    dt.create_checkpoint()
    state = read_checkpoint(fsspec.filesystem("file"), str(log), 1)
    got = {a.path: a.deletion_vector for a in state.adds}
    assert got == {a["path"]: DeletionVectorDescriptor.from_json(dv) for a, dv in zip(adds, dvs, strict=True)}
    # as delta-rs wrote them (its tombstones of timestamp 2 are past retention: none kept)
    raw = pq.read_table(checkpoint_path(str(log), 1), columns=["add"]).column("add").drop_null()
    assert {r["path"]: r["deletionVector"] for r in raw.to_pylist()} == {
        a["path"]: dv for a, dv in zip(adds, [dvs[0], {**dvs[1], "offset": None}], strict=True)
    }
    assert state.remove_table.num_rows == 0


# --------------------------------------------------------------------------- scale


BIG_SCHEMA = orjson.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": name, "type": typ, "nullable": True, "metadata": {}}
            for name, typ in [
                ("id", "long"),
                ("name", "string"),
                ("ts", "timestamp"),
                ("day", "string"),
                ("region", "string"),
            ]
        ],
    }
).decode()


def big_add_table(n: int) -> pa.Table:
    """``n`` add rows built column-wise: 2 partition values, ~200-byte stats, DVs on 1 in 10."""
    i = np.arange(n)
    ids = pa.array(i.astype(str))
    day = pc.binary_join_element_wise("2024-01-", pa.array((i % 28 + 1).astype(str)), "")
    region = pc.binary_join_element_wise("r", pa.array((i % 5).astype(str)), "")
    path = pc.binary_join_element_wise("day=", day, "/region=", region, "/part-", ids, ".snappy.parquet", "")
    offsets = pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32))
    keys = pa.array(np.tile(np.array(["day", "region"], dtype=object), n), pa.string())
    values = pa.array(
        np.column_stack([day.to_numpy(zero_copy_only=False), region.to_numpy(zero_copy_only=False)]).ravel(),
        pa.string(),
    )
    stats = pc.binary_join_element_wise(
        '{"numRecords":',
        ids,
        ',"minValues":{"id":',
        ids,
        ',"name":"aaaaaaaaaaaaaaaaaaaa","ts":"2024-01-01T00:00:00.000Z"},',
        '"maxValues":{"id":',
        ids,
        ',"name":"zzzzzzzzzzzzzzzzzzzz","ts":"2024-01-31T23:59:59.999Z"},',
        '"nullCount":{"id":0,"name":0,"ts":0}}',
        "",
    )
    has_dv = i % 10 == 0
    dv_children = [
        pa.array(np.full(n, "u", dtype=object), pa.string()),
        pc.binary_join_element_wise("dv-", ids, ""),
        pa.array(np.where(has_dv, 1, 0).astype(np.int32)),
        pa.array(np.full(n, 40, dtype=np.int32)),
        pa.array(i.astype(np.int64)),
    ]
    dv = pa.StructArray.from_arrays(
        dv_children, fields=list(ADD_SCHEMA.field("deletionVector").type), mask=pa.array(~has_dv)
    )
    return pa.Table.from_arrays(
        [
            path,
            pa.MapArray.from_arrays(offsets, keys, values),
            pa.array(1_000_000 + i),
            pa.array(1_700_000_000_000 + i),
            pa.array(np.ones(n, dtype=bool)),
            stats,
            pa.nulls(n, ADD_SCHEMA.field("tags").type),
            dv,
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.int64()),
        ],
        schema=ADD_SCHEMA,
    )


def test_two_hundred_thousand_files_round_trip_and_deltalake_reads_them(tmp_path: Path) -> None:
    root = tmp_path / "t"
    log = root / "_delta_log"
    log.mkdir(parents=True)
    n = 200_000
    adds = big_add_table(n)
    tombstones = pa.Table.from_pylist(
        [
            {
                "path": f"day=2023-12-01/region=r0/old-{j}.parquet",
                "deletionTimestamp": 1_700_000_000_000 + j,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": [("day", "2023-12-01")],
                "size": j,
            }
            for j in range(1000)
        ],
        REMOVE_SCHEMA,
    )
    base = full_state(1)
    meta = dataclasses.replace(
        base.metadata, schema_string=BIG_SCHEMA, partition_columns=("day", "region"), configuration={}
    )
    protocol = Protocol(3, 7, ("deletionVectors",), ("deletionVectors",))
    state = CheckpointState(1, protocol, meta, adds, tombstones, base.txns, base.domains)
    # the commits the checkpoint stands for (delta-rs wants the JSON at its version)
    _write_json_lines(
        log / f"{0:020d}.json", [{"protocol": protocol.to_json()}, {"metaData": meta.to_json()}]
    )
    _write_json_lines(log / f"{1:020d}.json", [{"commitInfo": {"timestamp": 1, "operation": "WRITE"}}])
    fs = fsspec.filesystem("file")
    write_checkpoint(fs, str(log), state)

    pf = pq.ParquetFile(checkpoint_path(str(log), 1))
    assert pf.schema_arrow.remove_metadata() == CHECKPOINT_SCHEMA
    assert pf.metadata.num_row_groups == 1 + -(-n // ROW_GROUP_ROWS) + 1  # non-file, adds, removes

    got = read_checkpoint(fs, str(log), 1)
    assert got.add_table.equals(adds)
    assert got.remove_table.equals(tombstones)
    assert len(got.adds) == n and got.adds._items is None  # type: ignore[attr-defined]
    assert got.adds[10] == add_files(adds.slice(10, 1))[0]
    assert (got.protocol, got.metadata, list(got.txns)) == (protocol, meta, list(base.txns))

    dt = deltalake.DeltaTable(str(root))
    assert dt.version() == 1
    uris = dt.file_uris()
    assert len(uris) == n
    assert {u.removeprefix("file://").removeprefix(f"{root}/") for u in uris} == set(
        adds.column("path").to_pylist()
    )


def test_v2_checkpoint_is_a_reader_feature_only() -> None:
    # imported here: this module otherwise needs only eventlog.log
    from eventlog.snapshot.protocol import reader_missing, writer_missing

    assert reader_missing(V2_PROTOCOL) == []
    assert writer_missing(V2_PROTOCOL) == ["v2Checkpoint"]


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
    rows = _our_rows(tmp_path, state)
    if order == "interleaved":
        rows = rows.take(pa.array(np.random.default_rng(7).permutation(rows.num_rows)))
    pq.write_table(rows, log / _name(V, "parquet"), row_group_size=1_000_000)
    assert pq.ParquetFile(log / _name(V, "parquet")).metadata.num_row_groups == 1
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
    _write_multipart(tmp_path / "scratch", local, rich_state(3), parts=2)
    state = _v2_state(5)
    rows = _our_rows(tmp_path / "scratch", state)
    sidecars = _write_sidecars(local, rows, 2)
    _write_json_lines(
        local / _name(5, f"{UUID_A}.json"), [*_v2_header(rows, 5), *map(_sidecar_action, sidecars)]
    )
    fs = fsspec.filesystem("memory")
    root = f"/formats-{uuid.uuid4().hex}/_delta_log"
    try:
        for path in local.rglob("*.*"):
            fs.pipe_file(f"{root}/{path.relative_to(local)}", path.read_bytes())
        assert find_latest_checkpoint(fs, root) == 5
        assert find_latest_checkpoint(fs, root, at_or_before=4) == 3
        _assert_same_state(read_checkpoint(fs, root, 5), state)
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
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / _name(3, "parquet"))
    got = read_checkpoint(fsspec.filesystem("file"), str(tmp_path), 3)
    assert got.add_table.schema == ADD_SCHEMA and got.remove_table.schema == REMOVE_SCHEMA
    assert list(got.adds) == [
        AddFile("a", {"d": "1"}, 1, 2, deletion_vector=DeletionVectorDescriptor("i", "xyz", 3, 4)),
        AddFile("b", {}, 5, 6),
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
    state = _v2_state()
    rows = _our_rows(tmp_path, state)
    sidecars = _write_sidecars(log, rows, 2)
    _write_json_lines(
        log / _name(V, f"{UUID_A}.json"), [*_v2_header(rows, V), *map(_sidecar_action, sidecars)]
    )
    classic = log / _name(V, "parquet")
    classic.write_bytes(b"PAR1 torn by a crashed writer")
    fs, log_dir = fsspec.filesystem("file"), str(log)
    names = os.listdir(log)
    assert [cp.kind for cp in list_checkpoints(names)] == ["classic", "v2"]
    _assert_same_state(read_checkpoint(fs, log_dir, V), state)  # classic corrupt: listed
    _assert_same_state(read_checkpoint(fs, log_dir, V, listing=names), state)
    with pytest.raises(CorruptLogError) as info:  # named directly: no stand-in
        read_checkpoint(fs, log_dir, V, last=LastCheckpoint(V))
    assert info.value.uri == str(classic)
    os.remove(log / _name(V, f"{UUID_A}.json"))
    with pytest.raises(CorruptLogError):  # nothing else at that version: the first error
        read_checkpoint(fs, log_dir, V, listing=os.listdir(log))
