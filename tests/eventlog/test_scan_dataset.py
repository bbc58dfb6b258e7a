"""Larger-than-memory reads (issue 27): scan() streams batch by batch within a data file,
with deletion vectors and filters applied per batch; to_pyarrow_dataset() is a lazy dataset
that pyarrow, DuckDB and Polars read with pushdown; to_polars() builds from scan()."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

import eventlog
from eventlog import DatasetUnsupportedError, EventlogError, Table
from tests.conftest import SCHEMA, rows

BIG_ROWS = 200_000
PAYLOAD = 400  # bytes per row: 200,000 rows are ~80 MB in Arrow, two row groups of our writer


def _sorted(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def _big_table(uri: str, props: dict[str, str] | None = None) -> Table:
    """One data file of 200,000 rows in at least two row groups."""
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    t = Table.create(uri, schema, properties=props or {})
    ids = pa.array(range(BIG_ROWS), pa.int64())
    t.append(pa.table({"id": ids, "payload": pa.repeat(pa.scalar("p" * PAYLOAD), BIG_ROWS)}, schema=schema))
    return t


def _row_groups(uri: str, t: Table) -> list[int]:
    (add,) = t.snapshot().add_files
    meta = pq.ParquetFile(Path(uri) / add.path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def test_batches_within_one_big_file_are_bounded(local_uri: str) -> None:
    t = _big_table(local_uri)
    groups = _row_groups(local_uri, t)
    assert len(groups) >= 2 and sum(groups) == BIG_ROWS
    pool = pa.default_memory_pool()
    before = pa.total_allocated_bytes()
    sizes, ids, held = [], [], []
    for batch in t.scan(columns=["id", "payload"], batch_size=5_000):
        sizes.append(batch.num_rows)
        ids.append(batch.column("id"))
        held.append(pa.total_allocated_bytes() - before)
        del batch
    assert max(sizes) <= 5_000 and len(sizes) >= BIG_ROWS // 5_000
    assert pa.chunked_array(ids).to_pylist() == list(range(BIG_ROWS))  # file order, every row
    # The file decodes to ~80 MB; a scan holds a batch (2 MB) and the reader's buffers, not
    # the file (the ids kept above are 1.6 MB).
    assert max(held) < 40 * 1024 * 1024, (max(held), pool.backend_name)


def test_deletion_vectors_apply_per_batch_across_row_groups(local_uri: str) -> None:
    t = _big_table(local_uri, {"delta.enableDeletionVectors": "true"})
    boundary = _row_groups(local_uri, t)[0]
    # Rows deleted in both row groups, and a run across their boundary.
    t.delete(f"id % 7 = 0 OR (id >= {boundary - 3} AND id < {boundary + 3}) OR id >= {BIG_ROWS - 10}")
    (add,) = t.snapshot().add_files
    assert add.deletion_vector is not None  # deleted by a vector, not rewritten
    want = t.to_arrow(columns=["id"]).column("id").to_pylist()
    got = t.scan(columns=["id"], batch_size=997).read_all().column("id").to_pylist()
    assert got == sorted(want)
    assert len(got) == BIG_ROWS - len({i for i in range(BIG_ROWS) if i % 7 == 0 or
                                       boundary - 3 <= i < boundary + 3 or i >= BIG_ROWS - 10})  # fmt: skip
    # A filter on top of the deletion vector, and row groups skipped by their statistics.
    got = t.scan(f"id >= {boundary - 5} AND id < {boundary + 5}", ["id"], batch_size=3).read_all()
    assert got.column("id").to_pylist() == [
        i for i in range(boundary - 5, boundary + 5) if i % 7 and not boundary - 3 <= i < boundary + 3
    ]


def _events(uri: str, props: dict[str, str]) -> Table:
    t = Table.create(uri, SCHEMA, partition_by=["date"], properties=props)
    t.append(rows(list(range(0, 10)), "2024-01-01"))
    t.append(rows(list(range(10, 20)), "2024-01-02"))
    t.append(rows(list(range(20, 25)), "2024-01-03"))
    t.delete("id IN (3, 12, 21)")
    return t


@pytest.mark.parametrize(
    "props",
    [{}, {"delta.enableDeletionVectors": "true"}, {"delta.columnMapping.mode": "name"}],
    ids=["plain", "dv", "mapped"],
)
def test_scan_time_travel_by_version_and_timestamp(local_uri: str, props: dict[str, str]) -> None:
    t = _events(local_uri, props)
    times = {h["version"]: h["timestamp"] for h in t.history()}  # version -> commit time (ms)
    for version in (1, 2, 3, 4):
        want = t.to_arrow(version=version)
        assert _sorted(t.scan(version=version, batch_size=2).read_all()) == _sorted(want)
        assert _sorted(t.scan(timestamp=times[version], batch_size=2).read_all()) == _sorted(want)
    assert t.scan(version=2).read_all().num_rows == 20
    assert t.scan(version=4, filter="date = '2024-01-02'").read_all().num_rows == 9


def test_scan_of_a_table_on_another_filesystem(memory_uri: str) -> None:
    t = _events(memory_uri, {"delta.enableDeletionVectors": "true"})
    got = t.scan("x > 2", ["id", "date"], batch_size=2).read_all()
    assert max(b.num_rows for b in t.scan(batch_size=2)) == 2
    assert _sorted(got) == _sorted(t.to_arrow("x > 2", ["id", "date"]))
    assert 3 not in got.column("id").to_pylist() and got.num_rows == 19


# --------------------------------------------------------------------------- to_pyarrow_dataset


class _Counting(DirFileSystem):  # type: ignore[misc]
    """The local filesystem under ``path``, recording each data file opened (not local to
    us: the table's dataset then reads through fsspec, where we can count)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opened: list[str] = []

    def open(self, path: str, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(".parquet"):
            self.opened.append(str(path))
        return super().open(path, *args, **kwargs)


def test_dataset_rows_through_pyarrow_duckdb_and_polars(local_uri: str) -> None:
    t = _events(local_uri, {})
    dataset = t.to_pyarrow_dataset()
    want = t.to_arrow()
    assert dataset.schema == want.schema
    assert _sorted(dataset.to_table()) == _sorted(want) and want.num_rows == 22
    assert _sorted(duckdb.from_arrow(dataset).arrow().read_all()) == _sorted(want)
    assert _sorted(pl.scan_pyarrow_dataset(dataset).collect().to_arrow()) == _sorted(want)
    # Filters and projections, partition column included.
    flt = (pc.field("date") == "2024-01-02") & (pc.field("x") > 14)
    assert _sorted(dataset.to_table(columns=["id", "date"], filter=flt)) == _sorted(
        t.to_arrow("date = '2024-01-02' AND x > 14", ["id", "date"])
    )
    (got,) = duckdb.from_arrow(dataset).filter("date = '2024-01-01'").aggregate("count(*), sum(x)").fetchall()
    part = t.to_arrow("date = '2024-01-01'")
    assert got == (part.num_rows, sum(part.column("x").to_pylist()))
    frame = pl.scan_pyarrow_dataset(dataset).filter(pl.col("id") >= 20).select("id").collect()
    assert sorted(frame["id"].to_list()) == [20, 22, 23, 24]


def test_dataset_time_travel(local_uri: str) -> None:
    t = _events(local_uri, {})
    for version in (1, 2, 3, 4):
        assert _sorted(t.to_pyarrow_dataset(version).to_table()) == _sorted(t.to_arrow(version=version))
    assert t.to_pyarrow_dataset(1).count_rows() == 10


def test_duckdb_filter_on_a_partition_opens_only_its_files(local_uri: str) -> None:
    _events(local_uri, {})
    fs = _Counting(path=local_uri, fs=LocalFileSystem())
    t = Table.open("/", filesystem=fs)
    files = t.snapshot().add_files
    in_partition = {a.path for a in files if a.partition_values["date"] == "2024-01-02"}
    assert len(files) == 3 and len(in_partition) == 1
    con = duckdb.connect()
    con.register("events", t.to_pyarrow_dataset())
    fs.opened.clear()
    got = con.execute("SELECT count(*), sum(x) FROM events WHERE date = '2024-01-02'").fetchone()
    assert got == (9, sum(range(10, 20)) - 12)
    assert {p.lstrip("/") for p in fs.opened} == in_partition
    # And statistics: ids 20-24 live in one file of another partition.
    fs.opened.clear()
    assert con.execute("SELECT count(*) FROM events WHERE id >= 22").fetchone() == (3,)
    assert {p.lstrip("/") for p in fs.opened} == {
        a.path for a in files if a.partition_values["date"] == "2024-01-03"
    }


def test_statistics_guarantees_are_sound_with_nulls(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1, 2, 3]))
    t.append(
        pa.table({"id": [4, 5], "date": ["2024-01-01"] * 2, "x": [None, 50], "y": [1.0, 2.0]}, schema=SCHEMA)
    )
    dataset = t.to_pyarrow_dataset()
    guarantees = [str(f.partition_expression) for f in dataset.get_fragments()]
    assert sum("(x >= " in g for g in guarantees) == 1  # the file with a null x has no x bounds
    assert dataset.to_table(filter=pc.field("x").is_null()).column("id").to_pylist() == [4]
    assert sorted(dataset.to_table(filter=pc.field("x") > 2).column("id").to_pylist()) == [3, 5]
    assert len(list(dataset.get_fragments(filter=pc.field("id") > 3))) == 1


def test_dataset_of_a_table_on_another_filesystem(memory_uri: str) -> None:
    t = _events(memory_uri, {})
    assert _sorted(t.to_pyarrow_dataset().to_table()) == _sorted(t.to_arrow())


@pytest.mark.parametrize(
    ("props", "reason", "count"),
    [
        ({"delta.enableDeletionVectors": "true"}, "deletion vectors", 3),  # ids 3, 12, 21
        ({"delta.columnMapping.mode": "name"}, "column mapping", 0),
    ],
)
def test_dataset_refuses_what_it_cannot_express(
    local_uri: str, props: dict[str, str], reason: str, count: int
) -> None:
    t = _events(local_uri, props)
    with pytest.raises(DatasetUnsupportedError) as info:
        t.to_pyarrow_dataset()
    err = info.value
    assert isinstance(err, EventlogError)
    assert (err.uri, err.version, err.reason, err.count) == (t.log.root, 4, reason, count)
    assert "scan()" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.version, again.reason, again.count) == (
        DatasetUnsupportedError,
        4,
        reason,
        count,
    )
    assert "DatasetUnsupportedError" in eventlog.__all__
    if reason == "deletion vectors":  # a version before the deletes is a plain dataset
        assert _sorted(t.to_pyarrow_dataset(3).to_table()) == _sorted(t.to_arrow(version=3))


# --------------------------------------------------------------------------- to_polars


@pytest.mark.parametrize(
    "props",
    [{}, {"delta.enableDeletionVectors": "true"}, {"delta.columnMapping.mode": "name"}],
    ids=["plain", "dv", "mapped"],
)
def test_to_polars_equals_to_arrow(local_uri: str, props: dict[str, str]) -> None:
    t = _events(local_uri, props)
    for args in [(None, None, None), ("x > 5", ["id", "date"], None), (None, ["y"], 2)]:
        frame = t.to_polars(*args)
        assert isinstance(frame, pl.DataFrame)
        want = t.to_arrow(*args)
        assert frame.columns == want.column_names
        assert _sorted(frame.to_arrow()) == _sorted(want)
    empty = t.to_polars("id > 1000")
    assert empty.shape == (0, 4) and empty.columns == ["id", "date", "x", "y"]


def test_to_polars_without_polars(local_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t = _events(local_uri, {})
    monkeypatch.setitem(sys.modules, "polars", None)
    with pytest.raises(ImportError, match="pip install polars"):
        t.to_polars()


@pytest.mark.parametrize(
    "props",
    [
        {"delta.enableTypeWidening": "true"},
        {"delta.columnMapping.mode": "name", "delta.enableTypeWidening": "true"},
        {"delta.columnMapping.mode": "id", "delta.enableTypeWidening": "true"},
    ],
    ids=["plain", "name-mapped", "id-mapped"],
)
def test_scan_of_files_written_before_schema_changes(local_uri: str, props: dict[str, str]) -> None:
    schema = pa.schema([("id", pa.int32()), ("s", pa.struct([("a", pa.int32())])), ("p", pa.string())])
    t = Table.create(local_uri, schema, partition_by=["p"], properties=props)
    t.append(pa.table({"id": [1, 2], "s": [{"a": 1}, {"a": 2}], "p": ["x", "y"]}, schema=schema))
    t.change_column_type("id", pa.int64())  # old files hold int32
    t.add_columns([pa.field("note", pa.string())])  # old files lack it
    if "delta.columnMapping.mode" in props:
        t.rename_column("id", "key")
    t = Table.open(local_uri)
    want = t.to_arrow()
    got = t.scan(batch_size=1).read_all()
    assert got.schema == want.schema and got.schema.field(0).type == pa.int64()
    assert _sorted(got) == _sorted(want) and got.column("note").null_count == 2
    assert _sorted(t.scan(columns=["note", "p"]).read_all()) == _sorted(t.to_arrow(columns=["note", "p"]))
