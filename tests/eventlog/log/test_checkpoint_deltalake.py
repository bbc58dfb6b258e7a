"""delta-rs interop: checkpoints written by delta-rs (also with deletion vectors) read like
deltalake reads them, and a 200,000-file checkpoint of ours round-tripped as an equal Arrow
table and read by deltalake.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from eventlog.log.actions import DeletionVectorDescriptor, Protocol
from eventlog.log.checkpoint import (
    CHECKPOINT_SCHEMA,
    ROW_GROUP_ROWS,
    CheckpointState,
    checkpoint_path,
    read_checkpoint,
    write_checkpoint,
)
from eventlog.log.filetable import ADD_SCHEMA, REMOVE_SCHEMA, add_files
from tests.eventlog.log.checkpoint_samples import write_json_lines
from tests.eventlog.log.test_checkpoint import full_state

deltalake = pytest.importorskip("deltalake")


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
    write_json_lines(log / f"{1:020d}.json", commit)
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
            pa.nulls(n, pa.string()),
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
    write_json_lines(log / f"{0:020d}.json", [{"protocol": protocol.to_json()}, {"metaData": meta.to_json()}])
    write_json_lines(log / f"{1:020d}.json", [{"commitInfo": {"timestamp": 1, "operation": "WRITE"}}])
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
