"""Table.scan: a RecordBatchReader over the live rows, one data file at a time; the same rows
as to_arrow, read lazily, and readable by DuckDB."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.errors import DataFileNotFoundError, InvalidInputError, UnknownColumnError
from eventlog.snapshot.stream import read_ahead
from tests.conftest import SCHEMA, rows

PROPS: list[dict[str, str]] = [
    {},
    {"delta.enableDeletionVectors": "true"},
    {"delta.columnMapping.mode": "name", "delta.enableDeletionVectors": "true"},
]


def _table(uri: str, props: dict[str, str]) -> Table:
    t = Table.create(uri, SCHEMA, partition_by=["date"], properties=props)
    t.append(rows(list(range(0, 10)), "2024-01-01"))
    t.append(rows(list(range(10, 20)), "2024-01-02"))
    t.append(rows(list(range(20, 25)), "2024-01-01"))
    t.delete("id IN (3, 12, 21)")  # deletion vectors where enabled, rewrites elsewhere
    return t


def _sorted(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


@pytest.mark.parametrize("props", PROPS, ids=["plain", "dv", "mapped-dv"])
@pytest.mark.parametrize(
    ("filter", "columns", "version"),
    [
        (None, None, None),
        ("id > 4 AND x < 22", None, None),
        ("date = '2024-01-02'", ["id", "date"], None),
        (None, ["x"], 2),
        ("id < 100", ["date", "id"], 3),
    ],
)
def test_same_rows_as_to_arrow(
    local_uri: str, props: dict[str, str], filter: str | None, columns: list[str] | None, version: int | None
) -> None:
    t = _table(local_uri, props)
    reader = t.scan(filter, columns, version, batch_size=4)
    got = reader.read_all()
    want = t.to_arrow(filter, columns, version)
    assert got.schema == want.schema
    assert _sorted(got) == _sorted(want)


def test_batches_are_bounded_and_files_read_one_at_a_time(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableDeletionVectors": "true"})
    sizes = [b.num_rows for b in t.scan(batch_size=3)]
    assert max(sizes) <= 3 and sum(sizes) == 22
    with pytest.raises(InvalidInputError, match="batch_size"):
        t.scan(batch_size=0)
    with pytest.raises(UnknownColumnError):
        t.scan(columns=["nope"])


def test_nothing_is_read_until_iterated(local_uri: str) -> None:
    t = _table(local_uri, {})
    reader = t.scan(batch_size=100)  # the version and the files are fixed here
    for add in t.snapshot().add_files:
        os.remove(Path(local_uri) / add.path)
    with pytest.raises(DataFileNotFoundError):
        reader.read_all()


def test_a_later_commit_does_not_change_a_reader(local_uri: str) -> None:
    t = _table(local_uri, {})
    reader = t.scan()
    t.append(rows([100], "2024-01-03"))
    assert reader.read_all().num_rows == 22


@pytest.mark.parametrize("props", PROPS, ids=["plain", "dv", "mapped-dv"])
def test_duckdb_reads_the_stream(local_uri: str, props: dict[str, str]) -> None:
    t = _table(local_uri, props)
    con = duckdb.connect()
    con.register("events", t.scan(filter="date = '2024-01-01'"))
    got = con.execute("SELECT count(*), sum(x) FROM events").fetchone()
    want = t.to_arrow(filter="date = '2024-01-01'")
    assert got == (want.num_rows, sum(want.column("x").to_pylist()))


def test_to_pandas(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableDeletionVectors": "true"})
    df = t.to_pandas(filter="id > 20", columns=["id", "x"])
    assert sorted(df["id"].tolist()) == [22, 23, 24] and list(df.columns) == ["id", "x"]


def test_read_ahead_thread_stops_with_an_abandoned_reader(local_uri: str) -> None:
    t = _table(local_uri, {})
    reader = t.scan(batch_size=1)
    assert reader.read_next_batch().num_rows == 1  # the thread is reading ahead now
    assert any(th.name == "eventlog-scan-read-ahead" for th in threading.enumerate())
    del reader
    gc.collect()
    deadline = time.monotonic() + 5
    while any(th.name == "eventlog-scan-read-ahead" for th in threading.enumerate()):
        assert time.monotonic() < deadline, "the read-ahead thread outlived its reader"
        time.sleep(0.05)


def test_read_ahead_keeps_order_and_raises_errors_in_place() -> None:
    def source() -> Iterator[int]:
        yield from range(50)
        raise ValueError("source failed")

    got: list[int] = []
    with pytest.raises(ValueError, match="source failed"):
        for item in read_ahead(source(), 2):
            got.append(item)
    assert got == list(range(50))
