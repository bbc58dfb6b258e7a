"""Streaming writes: append, overwrite, Table.create and write_table take a
RecordBatchReader, an Arrow C stream or an iterable of record batches, and write it chunk by
chunk (eventlog/files/datastream.py): files rolled at the target size, partitions split as
rows come, statistics per file, memory bounded by the buffers; a failure in the middle
deletes every file written and commits nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from eventlog import ConstraintViolationError, InvalidInputError, Table, identity_field, write_table
from eventlog.files import datastream
from tests.conftest import SCHEMA, rows

SMALL_FILES = {"delta.targetFileSize": str(64 * 1024)}  # ~64 KB files: many per stream


def _batches(n: int, size: int, date: str | None = None) -> Iterator[pa.RecordBatch]:
    for b in range(n):
        ids = list(range(b * size, (b + 1) * size))
        table = rows(ids, date or f"2024-01-0{1 + b % 3}")
        yield from table.to_batches()


def _data_files(t: Table) -> set[str]:
    return {str(p.relative_to(t.uri)) for p in Path(t.uri).rglob("*.parquet")}


def _ids(t: Table, **kw: Any) -> list[int]:
    return sorted(t.to_arrow(**kw).column("id").to_pylist())


def test_a_reader_is_written_as_files_rolled_at_the_target_size(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties=SMALL_FILES)
    reader = pa.RecordBatchReader.from_batches(SCHEMA, _batches(40, 5_000, "2024-01-01"))
    result = t.append(reader)
    assert _ids(t) == list(range(200_000))
    adds = t.snapshot().add_files
    assert len(adds) > 5 and result.metrics["numFiles"] == str(len(adds))
    assert result.metrics["numOutputRows"] == "200000"
    for add in adds:  # statistics per file, equal to the file's own contents
        data = pq.read_table(Path(t.uri) / add.path)
        stats = json.loads(add.stats or "{}")
        assert stats["numRecords"] == data.num_rows == add.num_records
        assert stats["minValues"]["id"] == pc.min(data["id"]).as_py()
        assert stats["maxValues"]["id"] == pc.max(data["id"]).as_py()
    # every file but the last of the stream reached the target before it was closed
    assert sorted(a.size for a in adds)[1] >= 64 * 1024


def test_partitions_are_split_as_rows_come(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"], properties=SMALL_FILES)
    t.append(_batches(30, 3_000))  # a generator; each batch in one of three partitions
    assert _ids(t) == list(range(90_000))
    for add in t.snapshot().add_files:
        data = pq.read_table(Path(t.uri) / add.path)
        assert add.path.startswith(f"date={add.partition_values['date']}/")
        assert "date" not in data.column_names and data.num_rows == add.num_records
    by_date = t.to_arrow(filter="date = '2024-01-02'").column("id").to_pylist()
    assert sorted(by_date) == [i for b in range(1, 30, 3) for i in range(b * 3_000, (b + 1) * 3_000)]


def test_lists_of_tables_and_arrow_c_streams(tmp_path: Path) -> None:
    class Producer:  # any object with the Arrow C stream interface (polars, DuckDB results)
        def __init__(self, table: pa.Table) -> None:
            self.table = table

        def __arrow_c_stream__(self, requested_schema: object = None) -> object:
            return self.table.__arrow_c_stream__(requested_schema)

    t = Table.create(str(tmp_path / "t"), SCHEMA)
    t.append([rows([1, 2]), rows([3])])
    t.append(Producer(rows([4, 5])))
    assert _ids(t) == [1, 2, 3, 4, 5]
    assert t.version == 2


def test_a_failing_source_leaves_nothing_behind(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"], properties=SMALL_FILES)
    t.append(rows([0]))
    before, version = _data_files(t), t.version
    written: list[int] = []

    def source() -> Iterator[pa.RecordBatch]:
        for batch in _batches(20, 4_000):
            yield batch
            written.append(len(_data_files(t)))
        raise ConnectionError("the upstream went away")

    with pytest.raises(ConnectionError, match="upstream went away"):
        t.append(source())
    assert max(written) > len(before)  # files were on disk before the failure...
    assert _data_files(t) == before  # ...and every one is gone
    assert t.refresh().version == version and _ids(t) == [0]


@pytest.mark.parametrize("bad", ["type", "constraint"])
def test_a_bad_chunk_in_the_middle_is_a_typed_error_and_writes_nothing(tmp_path: Path, bad: str) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties=SMALL_FILES)
    t.add_constraint("positive", "x >= 0")
    before, version = _data_files(t), t.version
    chunks = list(_batches(10, 4_000, "2024-01-01"))
    if bad == "type":
        chunks.insert(6, pa.record_batch({"id": ["not a number"], "date": ["d"], "x": [1], "y": [1.0]}))
    else:
        chunks.insert(6, rows([-1], x=-5).to_batches()[0])
    with pytest.raises(InvalidInputError) as err:
        t.append(iter(chunks))
    if bad == "constraint":
        assert isinstance(err.value, ConstraintViolationError)
        assert (err.value.constraint, err.value.count) == ("positive", 1)
    else:
        assert "id" in str(err.value)
    assert _data_files(t) == before and t.refresh().version == version


def test_overwrite_with_replace_where_checks_every_chunk(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"])
    t.append(rows([1, 2], "2024-01-01"))
    t.append(rows([3], "2024-01-02"))
    before, version = _data_files(t), t.version
    outside = [rows([10], "2024-01-01").to_batches()[0], rows([11], "2024-01-02").to_batches()[0]]
    with pytest.raises(InvalidInputError, match="does not match replaceWhere"):
        t.overwrite(iter(outside), replace_where="date = '2024-01-01'")
    assert _data_files(t) == before and t.refresh().version == version
    replaced = t.overwrite(_batches(2, 2, "2024-01-01"), replace_where="date = '2024-01-01'")
    assert replaced.metrics["numOutputRows"] == "4" and replaced.metrics["numDeletedRows"] == "2"
    assert _ids(t) == [0, 1, 2, 3, 3]


def test_create_and_write_table_take_their_schema_from_a_reader(tmp_path: Path) -> None:
    reader = pa.RecordBatchReader.from_batches(SCHEMA, _batches(3, 10))
    created = Table.create(str(tmp_path / "ctas"), data=reader, partition_by=["date"])
    assert created.schema.names == SCHEMA.names and _ids(created) == list(range(30))
    assert created.history(1)[0]["operationMetrics"]["numOutputRows"] == "30"
    write_table(str(tmp_path / "w"), pa.RecordBatchReader.from_batches(SCHEMA, _batches(2, 5)))
    write_table(str(tmp_path / "w"), _batches(1, 5), mode="overwrite")
    assert _ids(Table.open(str(tmp_path / "w"))) == list(range(5))
    with pytest.raises(InvalidInputError, match="needs a schema or data"):
        Table.create(str(tmp_path / "empty"), data=iter(()))


def test_merge_schema_and_identity_values_across_chunks(tmp_path: Path) -> None:
    schema = pa.schema([identity_field("id"), pa.field("v", pa.string())])
    t = Table.create(str(tmp_path / "t"), schema)
    chunks = (pa.record_batch({"v": [f"{b}-{i}" for i in range(100)]}) for b in range(5))
    t.append(chunks)
    ids = t.to_arrow().column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 500
    wider = pa.schema([pa.field("v", pa.string()), pa.field("w", pa.int64())])
    t.append(
        pa.RecordBatchReader.from_batches(wider, [pa.record_batch({"v": ["x"], "w": [7]})]),
        schema_mode="merge",
    )
    assert t.schema.names == ["id", "v", "w"]
    assert t.to_arrow(filter="w = 7").column("v").to_pylist() == ["x"]


def test_an_empty_stream_commits_an_empty_append(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    result = t.append(iter(()))
    assert (result.version, result.metrics["numFiles"], result.metrics["numOutputRows"]) == (1, "0", "0")
    assert _data_files(t) == set()


def test_items_that_are_not_batches_are_refused(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    with pytest.raises(InvalidInputError, match="item 1 of the rows is a dict"):
        t.append([rows([1]).to_batches()[0], {"id": 2}])
    with pytest.raises(InvalidInputError, match="got str"):
        t.append("id,date\n1,x")
    assert t.refresh().version == 0 and _data_files(t) == set()


def test_memory_holds_the_buffers_not_the_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrow memory while a 240 MB stream is written stays near the buffer budget (16 MB
    here) plus a batch: the source's batches are released as they are written."""
    monkeypatch.setattr(datastream, "BUFFER_BYTES", 16 * 1024 * 1024)
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"])
    batch_rows = 250_000  # 8 MB a batch (four 8-byte columns; the dates are small)
    peak = 0
    base = pa.total_allocated_bytes()

    def source() -> Iterator[pa.RecordBatch]:
        nonlocal peak
        for b in range(30):
            ids = pa.array(range(b * batch_rows, (b + 1) * batch_rows), pa.int64())
            yield pa.record_batch(
                [ids, pa.array([f"2024-01-0{1 + b % 3}"] * batch_rows), ids, pc.cast(ids, pa.float64())],
                schema=SCHEMA,
            )
            peak = max(peak, pa.total_allocated_bytes() - base)

    t.append(source())
    assert t.to_arrow(columns=["id"]).num_rows == 30 * batch_rows
    assert peak < 80 * 1024 * 1024, f"peak Arrow memory {peak / 2**20:.0f} MB"


def test_a_storage_failure_in_the_middle_of_a_transaction_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventlog.files import datafiles

    t = Table.create(str(tmp_path / "t"), SCHEMA, properties=SMALL_FILES)
    write = datafiles.DataFileWriter.write
    groups: list[int] = []

    def failing_disk(self: datafiles.DataFileWriter, chunk: pa.Table) -> None:
        groups.append(chunk.num_rows)
        if len(groups) == 6:
            raise OSError(28, "No space left on device")
        write(self, chunk)

    monkeypatch.setattr(datafiles.DataFileWriter, "write", failing_disk)
    txn = t.transaction()
    with pytest.raises(OSError, match="No space left"):
        txn.append(pa.RecordBatchReader.from_batches(SCHEMA, _batches(20, 4_000, "2024-01-01")))
    assert len(groups) == 6 and _data_files(t) == set()
    assert t.refresh().version == 0
