"""Writing and reading data files: layout, stats, splitting, escaping and Delta compatibility."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import fsspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from eventlog.errors import InvalidInputError, UnknownColumnError
from eventlog.files.datafiles import delete_files, dictionary_columns, write_data_files
from eventlog.files.enforce import conform
from eventlog.files.reader import read_data_files
from eventlog.files.schema import (
    canonical_schema,
    needs_timestamp_ntz,
    stats_table,
    to_spark_schema_json,
)
from eventlog.files.write_stats import file_stats
from eventlog.log.actions import AddFile, CommitInfo, Metadata, Protocol, encode_commit

UTC = dt.UTC

SCHEMA = canonical_schema(
    pa.schema(
        [
            pa.field("id", pa.int32(), nullable=False),
            ("big", pa.int64()),
            ("dbl", pa.float64()),
            ("dec", pa.decimal128(12, 3)),
            ("str", pa.string()),
            ("flag", pa.bool_()),
            ("day", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("ntz", pa.timestamp("us")),
            ("arr", pa.list_(pa.int64())),
            ("st", pa.struct([("x", pa.int32()), ("y", pa.string())])),
            ("mp", pa.map_(pa.string(), pa.float64())),
            ("bin", pa.binary()),
            ("part", pa.string()),
        ]
    )
)


def sample(n: int = 8) -> pa.Table:
    base = dt.datetime(2024, 1, 1, 12, 0, 0)
    rows: dict[str, list[Any]] = {
        "id": list(range(n)),
        "big": [None if i % 5 == 4 else i * 10**12 for i in range(n)],
        "dbl": [i / 4 for i in range(n)],
        "dec": [Decimal(f"{i}.125") if i % 3 else None for i in range(n)],
        "str": [f"s{i}" if i % 4 else None for i in range(n)],
        "flag": [i % 2 == 0 for i in range(n)],
        "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)],
        "ts": [(base + dt.timedelta(seconds=i, microseconds=i * 7)).replace(tzinfo=UTC) for i in range(n)],
        "ntz": [base - dt.timedelta(days=i) for i in range(n)],
        "arr": [[i, None] if i % 2 else [] for i in range(n)],
        "st": [{"x": i, "y": None} if i % 3 else None for i in range(n)],
        "mp": [[("k", float(i))] if i % 2 else None for i in range(n)],
        "bin": [bytes([i, 0, 255]) if i % 2 else None for i in range(n)],
        "part": [["a", "b", None][i % 3] for i in range(n)],
    }
    return pa.Table.from_pydict(rows, schema=SCHEMA)


@pytest.fixture(params=["local", "memory"])
def location(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[fsspec.AbstractFileSystem, str]]:
    if request.param == "local":
        yield fsspec.core.url_to_fs(str(tmp_path / "table"))
        return
    uri = f"memory://eventlog-datafiles-tests/{uuid.uuid4().hex}"
    fs, root = fsspec.core.url_to_fs(uri)
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


def by_id(t: pa.Table) -> list[dict[str, Any]]:
    return t.sort_by("id").to_pylist()


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("partition_columns", [[], ["part"], ["part", "flag"]])
def test_write_read_round_trip(
    location: tuple[fsspec.AbstractFileSystem, str], partition_columns: list[str]
) -> None:
    fs, root = location
    data = sample()
    adds = write_data_files(fs, root, data, partition_columns=partition_columns)
    assert sum(orjson.loads(a.stats or "{}")["numRecords"] for a in adds) == data.num_rows
    for add in adds:
        assert add.path.endswith(".c000.snappy.parquet")
        assert add.path.split("/")[-1].startswith("part-")
        path = f"{root}/{unquote(add.path)}"
        assert fs.size(path) == add.size
        assert add.modification_time > 1_600_000_000_000 and add.data_change
        assert set(add.partition_values) == set(partition_columns)
        file_schema = pq.read_schema(fs.open(path, "rb"))
        assert file_schema.names == [n for n in SCHEMA.names if n not in partition_columns]
    got = read_data_files(fs, root, adds, SCHEMA, partition_columns)
    assert got.schema.equals(SCHEMA)
    assert [str(f.type) for f in got.schema] == [str(f.type) for f in SCHEMA]
    assert by_id(got) == by_id(data)


@pytest.mark.parametrize(
    ("type_", "values"),
    [
        (pa.int8(), [1, -1, None]),
        (pa.int64(), [2**40, -(2**40), None]),
        (pa.float64(), [1.5, -0.25, None]),
        (pa.decimal128(10, 2), [Decimal("1.50"), Decimal("-3.00"), None]),
        (pa.string(), ["a b", "é/ü", None]),
        (pa.bool_(), [True, False, None]),
        (pa.date32(), [dt.date(2024, 1, 1), dt.date(1900, 12, 31), None]),
        (
            pa.timestamp("us", tz="UTC"),
            [
                dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
                dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
                None,
            ],
        ),
        (pa.timestamp("us"), [dt.datetime(2024, 5, 6, 7, 8, 9), dt.datetime(1970, 1, 1), None]),
        (pa.binary(), [b"\x00\x01", b"a=b/c", None]),
    ],
)
def test_partition_column_types_round_trip(
    location: tuple[fsspec.AbstractFileSystem, str], type_: pa.DataType, values: list[Any]
) -> None:
    fs, root = location
    schema = pa.schema([("id", pa.int64()), ("p", type_)])
    data = pa.table({"id": list(range(6)), "p": pa.array(values * 2, type_)})
    adds = write_data_files(fs, root, data, partition_columns=["p"])
    assert len(adds) == 3
    assert any(a.partition_values["p"] is None and "p=__HIVE_DEFAULT_PARTITION__/" in a.path for a in adds)
    got = read_data_files(fs, root, adds, schema, ["p"])
    assert got.schema.equals(schema)
    assert by_id(got) == by_id(data)


def test_read_columns_filter_and_missing_columns(location: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = location
    old_schema = pa.schema([("id", pa.int64()), ("p", pa.string())])
    old = write_data_files(fs, root, pa.table({"id": [1, 2], "p": ["x", "y"]}), partition_columns=["p"])
    new_schema = pa.schema([("id", pa.int64()), ("p", pa.string()), ("extra", pa.float64())])
    new_data = pa.table({"id": [3], "p": ["x"], "extra": [0.5]}, schema=new_schema)
    new = write_data_files(fs, root, new_data, partition_columns=["p"])
    assert old_schema.names != new_schema.names
    everything = read_data_files(fs, root, old + new, new_schema, ["p"])
    assert by_id(everything) == [
        {"id": 1, "p": "x", "extra": None},
        {"id": 2, "p": "y", "extra": None},
        {"id": 3, "p": "x", "extra": 0.5},
    ]
    some = read_data_files(
        fs, root, old + new, new_schema, ["p"], columns=["extra", "id"], filter=pc.field("p") == "x"
    )
    assert some.column_names == ["id", "extra"]  # schema order
    assert by_id(some) == [{"id": 1, "extra": None}, {"id": 3, "extra": 0.5}]
    data_filter = read_data_files(fs, root, old + new, new_schema, ["p"], filter=pc.field("id") >= 2)
    assert sorted(data_filter.column("id").to_pylist()) == [2, 3]
    empty = read_data_files(fs, root, [], new_schema, ["p"], columns=["p"])
    assert empty.num_rows == 0 and empty.schema.equals(pa.schema([new_schema.field("p")]))
    with pytest.raises(UnknownColumnError):
        read_data_files(fs, root, old, new_schema, ["p"], columns=["nope"])


def test_write_validates_arguments(location: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = location
    data = pa.table({"id": [1], "s": [{"a": 1}]})
    with pytest.raises(UnknownColumnError):
        write_data_files(fs, root, data, partition_columns=["missing"])
    with pytest.raises(InvalidInputError):
        write_data_files(fs, root, data, partition_columns=["s"])
    with pytest.raises(InvalidInputError):
        write_data_files(fs, root, data.select(["id"]), partition_columns=["id"])
    assert write_data_files(fs, root, data.slice(0, 0), partition_columns=[]) == []


# --------------------------------------------------------------------------- layout


def test_partition_directories_are_escaped_and_paths_url_encoded(
    location: tuple[fsspec.AbstractFileSystem, str],
) -> None:
    fs, root = location
    values = ["a b", "x/y", "k=v", "100%", "a:b#c"]
    data = pa.table({"id": list(range(len(values))), "p": values})
    adds = write_data_files(fs, root, data, partition_columns=["p"])
    dirs = {a.partition_values["p"]: a.path.rsplit("/", 1)[0] for a in adds}
    assert dirs == {
        "a b": "p=a%20b",
        "x/y": "p=x%252Fy",
        "k=v": "p=k%253Dv",
        "100%": "p=100%2525",
        "a:b#c": "p=a%253Ab%2523c",
    }
    on_disk = {Path(p).name for p in fs.ls(root, detail=False)}
    assert on_disk == {"p=a b", "p=x%2Fy", "p=k%3Dv", "p=100%25", "p=a%3Ab%23c"}
    for add in adds:
        assert fs.exists(f"{root}/{unquote(add.path)}")
    got = read_data_files(fs, root, adds, pa.schema([("id", pa.int64()), ("p", pa.string())]), ["p"])
    assert by_id(got) == [{"id": i, "p": v} for i, v in enumerate(values)]


def test_files_split_by_max_rows(location: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = location
    data = pa.table({"id": list(range(25)), "p": ["a"] * 20 + ["b"] * 5})
    adds = write_data_files(fs, root, data, partition_columns=["p"], max_rows_per_file=7)
    counts = sorted((a.partition_values["p"], AddFile.num_records.fget(a)) for a in adds)  # type: ignore[attr-defined]
    assert counts == [("a", 6), ("a", 7), ("a", 7), ("b", 5)]
    assert len({a.path for a in adds}) == 4
    numbers = sorted(int(a.path.split("/")[-1].split("-")[1]) for a in adds)
    assert numbers == [0, 1, 2, 3]
    got = read_data_files(fs, root, adds, data.schema, ["p"])
    assert by_id(got) == by_id(data)
    # Rows keep their input order inside a partition.
    first = min((a for a in adds if a.partition_values["p"] == "a"), key=lambda a: a.path.split("/")[-1])
    assert orjson.loads(first.stats or "")["minValues"]["id"] == 0


def test_files_split_by_target_size(location: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = location
    data = pa.table({"id": pa.array(range(50_000), pa.int64())})
    adds = write_data_files(fs, root, data, partition_columns=[], target_file_size=64 * 1024)
    assert len(adds) > 3
    assert sum(a.num_records or 0 for a in adds) == 50_000
    assert all(a.size < 4 * 64 * 1024 for a in adds)
    assert by_id(read_data_files(fs, root, adds, data.schema, [])) == by_id(data)


def test_failed_write_deletes_its_files(
    location: tuple[fsspec.AbstractFileSystem, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, root = location
    calls = {"n": 0}
    original = pq.ParquetWriter.write_table

    def flaky(self: pq.ParquetWriter, table: pa.Table, row_group_size: int | None = None) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        original(self, table, row_group_size=row_group_size)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", flaky)
    data = pa.table({"id": list(range(10)), "p": list("aabbccddee")})
    with pytest.raises(OSError, match="disk full"):
        write_data_files(fs, root, data, partition_columns=["p"])
    assert [p for p in fs.find(root) if p.endswith(".parquet")] == []


def test_delete_files_is_best_effort(location: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = location
    adds = write_data_files(fs, root, pa.table({"id": [1, 2], "p": ["a b", "c"]}), partition_columns=["p"])
    delete_files(fs, root, [a.path for a in adds] + ["p=gone/part-00009-x.c000.snappy.parquet"])
    assert [p for p in fs.find(root) if p.endswith(".parquet")] == []


# --------------------------------------------------------------------------- stats


def test_stats_content() -> None:
    ts = pa.timestamp("us", tz="UTC")
    data = pa.table(
        {
            "i": pa.array([3, None, -7], pa.int32()),
            "f": pa.array([1.5, float("nan"), -2.0]),
            "g": pa.array([0.25, None, 4.0], pa.float32()),
            "dec": pa.array([Decimal("1.230"), Decimal("-99.999"), None], pa.decimal128(6, 3)),
            "s": ["b", "a" * 40, None],
            "long": ["z" * 33, "m", None],
            "b": [True, None, True],
            "d": [dt.date(2024, 3, 1), dt.date(1999, 12, 31), None],
            "ts": pa.array(
                [
                    dt.datetime(2024, 1, 1, 0, 0, 0, 500, tzinfo=UTC),
                    dt.datetime(2024, 1, 1, 0, 0, 1, 123456, tzinfo=UTC),
                    None,
                ],
                ts,
            ),
            "exact": pa.array([dt.datetime(2024, 1, 1, 0, 0, 1, 123000)] * 3, pa.timestamp("us")),
            "bin": [b"x", None, b"y"],
            "arr": [[1], None, None],
            "m": pa.array([None, [("k", 1)], None], pa.map_(pa.string(), pa.int64())),
            "st": pa.array(
                [{"x": 1, "y": {"z": "q"}}, None, {"x": None, "y": None}],
                pa.struct([("x", pa.int64()), ("y", pa.struct([("z", pa.string())]))]),
            ),
        }
    )
    stats = orjson.loads(file_stats(data))
    assert list(stats) == ["numRecords", "minValues", "maxValues", "nullCount"]
    assert stats["numRecords"] == 3
    mins, maxs, nulls = stats["minValues"], stats["maxValues"], stats["nullCount"]
    assert (mins["i"], maxs["i"]) == (-7, 3)
    assert mins["f"] == -2.0 and "f" not in maxs  # NaN sorts above numbers: max unknown
    assert (mins["g"], maxs["g"]) == (0.25, 4.0)
    assert (mins["dec"], maxs["dec"]) == (-99.999, 1.23)
    assert '"dec":1.230' in file_stats(data.select(["dec"]))  # exact digits as a JSON number
    assert mins["s"] == "a" * 32 and maxs["s"] == "b"
    assert mins["long"] == "m" and "long" not in maxs
    assert (mins["b"], maxs["b"]) == (True, True)
    assert (mins["d"], maxs["d"]) == ("1999-12-31", "2024-03-01")
    assert mins["ts"] == "2024-01-01T00:00:00.000Z"
    assert maxs["ts"] == "2024-01-01T00:00:01.124Z"  # rounded up to the next millisecond
    assert mins["exact"] == maxs["exact"] == "2024-01-01T00:00:01.123"  # naive: no Z, exact ms kept
    for col in ("bin", "arr", "m"):
        assert col not in mins and col not in maxs
    assert mins["st"] == {"x": 1, "y": {"z": "q"}} and maxs["st"] == {"x": 1, "y": {"z": "q"}}
    assert nulls == {
        "i": 1,
        "f": 0,
        "g": 1,
        "dec": 1,
        "s": 1,
        "long": 1,
        "b": 1,
        "d": 1,
        "ts": 1,
        "exact": 0,
        "bin": 1,
        "arr": 2,
        "m": 2,
        "st": {"x": 2, "y": {"z": 2}},
    }
    parsed = stats_table([file_stats(data)], canonical_schema(data.schema)).to_pylist()[0]
    assert parsed["max.ts"] == dt.datetime(2024, 1, 1, 0, 0, 1, 124000, tzinfo=UTC)
    assert parsed["min.dec"] == Decimal("-99.999") and parsed["nullCount.st.y.z"] == 2


def test_add_stats_cover_each_file(location: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = location
    data = sample(30)
    adds = write_data_files(fs, root, data, partition_columns=["part"], max_rows_per_file=4)
    table = stats_table([a.stats for a in adds], SCHEMA)
    assert sum(table.column("numRecords").to_pylist()) == 30
    for add, row in zip(adds, table.to_pylist(), strict=True):
        rows = read_data_files(fs, root, [add], SCHEMA, ["part"])
        ids = rows.column("id").to_pylist()
        assert row["min.id"] == min(ids) and row["max.id"] == max(ids)
        assert row["nullCount.str"] == rows.column("str").null_count
        assert row["min.part"] is None  # partition columns are not in the files' stats


# --------------------------------------------------------------------------- Delta readers


def _read_with_deltalake(path: Path) -> tuple[pa.Table, pa.Table]:
    # delta-rs can abort the interpreter at exit, so it runs in a child that leaves via _exit.
    code = f"""
import os, sys
import pyarrow as pa, pyarrow.feather as feather, deltalake
dt = deltalake.DeltaTable({str(path)!r})
feather.write_feather(dt.to_pyarrow_table(), {str(path / "rows.arrow")!r})
feather.write_feather(pa.table(dt.get_add_actions(flatten=True)), {str(path / "adds.arrow")!r})
sys.stdout.flush()
os._exit(0)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    return pa.ipc.open_file(str(path / "rows.arrow")).read_all(), pa.ipc.open_file(
        str(path / "adds.arrow")
    ).read_all()


@pytest.mark.parametrize("partition_columns", [[], ["part"], ["part", "day"]])
def test_deltalake_reads_our_files_and_stats(tmp_path: Path, partition_columns: list[str]) -> None:
    fs, root = fsspec.core.url_to_fs(str(tmp_path))
    data = conform(sample(12), SCHEMA)
    adds = write_data_files(fs, root, data, partition_columns=partition_columns, max_rows_per_file=5)
    ntz = needs_timestamp_ntz(SCHEMA)
    protocol = Protocol(3, 7, ("timestampNtz",), ("timestampNtz",)) if ntz else Protocol(1, 2)
    metadata = Metadata(
        id=str(uuid.uuid4()),
        schema_string=to_spark_schema_json(SCHEMA),
        partition_columns=tuple(partition_columns),
        created_time=0,
    )
    log = tmp_path / "_delta_log"
    log.mkdir()
    commit = encode_commit([CommitInfo(timestamp=0, operation="WRITE"), protocol, metadata, *adds])
    (log / "00000000000000000000.json").write_bytes(commit)

    rows, actions = _read_with_deltalake(tmp_path)
    got = rows.select(SCHEMA.names).cast(SCHEMA)
    assert by_id(got) == by_id(data)

    by_path = {a.path: a for a in adds}
    assert sorted(actions.column("path").to_pylist()) == sorted(by_path)
    for row in actions.to_pylist():
        ours = orjson.loads(by_path[row["path"]].stats or "")
        assert row["num_records"] == ours["numRecords"]
        assert row["min.id"] == ours["minValues"]["id"] and row["max.id"] == ours["maxValues"]["id"]
        assert row["null_count.str"] == ours["nullCount"]["str"]
        assert row["null_count.st.x"] == ours["nullCount"]["st"]["x"]
        assert row["max.ts"].strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" == ours["maxValues"]["ts"]
        for col in partition_columns:
            value = row[f"partition.{col}"]
            expected = by_path[row["path"]].partition_values[col]
            assert (None if value is None else str(value)) == expected


def test_dictionary_encoding_only_where_values_repeat(tmp_path: Path) -> None:
    n = 20_000
    data = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "country": pa.array([["de", "fr", "us"][i % 3] for i in range(n)]),
            "sparse": pa.array([None] * n, pa.string()),
        }
    )
    assert dictionary_columns(data) == ["country", "sparse"]
    fs = fsspec.filesystem("file")
    (add,) = write_data_files(fs, str(tmp_path), data, partition_columns=())
    meta = pq.ParquetFile(tmp_path / unquote(add.path)).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" in encodings["country"]
    assert "RLE_DICTIONARY" not in encodings["id"]
    assert pq.read_table(tmp_path / unquote(add.path)).equals(data)
    # Small inputs and nested schemas keep the encoder's default: dictionaries everywhere.
    assert dictionary_columns(data.slice(0, 10)) is True
    nested = pa.table({"id": pa.array(range(n)), "s": pa.array([{"x": i} for i in range(n)])})
    assert dictionary_columns(nested) is True
