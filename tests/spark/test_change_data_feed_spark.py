"""``option("readChangeFeed", "true")`` on ``spark.read`` and ``spark.readStream`` with
``format("eventlog")``: the rows of ``Table.changes``, with Delta's options."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import PySparkException

from eventlog import Table

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

WAIT = 120
CDF = {"delta.enableChangeDataFeed": "true"}


def _table(uri: str) -> Table:
    """Versions: 0 create (partitioned by p), 1 append ids 1-4, 2 delete id 2, 3 update id 3,
    4 append id 5."""
    data = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "p": ["a", "a", "b", "b"]})
    table = Table.create(uri, data.schema, partition_by=["p"], properties=CDF)
    table.append(data)
    table.delete("id = 2")
    table.update("id = 3", {"id": "30"})
    table.append(pa.table({"id": pa.array([5], pa.int64()), "p": ["a"]}))
    return table


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=repr)


def _spark_rows(df: Any) -> list[dict[str, Any]]:
    return _sorted(df.toArrow().to_pylist())


def test_batch_read_equals_table_changes(spark: Any, tmp_path: Path) -> None:
    table = _table(str(tmp_path / "t"))
    df = (
        spark.read.format("eventlog")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(table.uri)
    )
    assert df.columns == ["id", "p", "_change_type", "_commit_version", "_commit_timestamp"]
    ours = table.changes(1)
    assert _spark_rows(df) == _sorted(ours.to_pylist())
    assert {r["_change_type"] for r in ours.to_pylist()} == {
        "insert",
        "delete",
        "update_preimage",
        "update_postimage",
    }
    ranged = (
        spark.read.format("eventlog")
        .options(readChangeFeed="true", startingVersion="2", endingVersion="3")
        .load(table.uri)
        .where("_change_type != 'update_preimage'")
        .select("id", "_change_type", "_commit_version")
    )
    assert _sorted([r.asDict() for r in ranged.collect()]) == _sorted(
        table.changes(
            2,
            3,
            filter="_change_type != 'update_preimage'",
            columns=["id", "_change_type", "_commit_version"],
        ).to_pylist()
    )


def test_batch_read_by_timestamp(spark: Any, tmp_path: Path) -> None:
    table = _table(str(tmp_path / "t"))
    times = table.changes(0).column("_commit_timestamp").to_pylist()
    start = times[0].isoformat()
    df = spark.read.format("eventlog").options(readChangeFeed="true", startingTimestamp=start).load(table.uri)
    assert _spark_rows(df) == _sorted(table.changes(start_timestamp=times[0]).to_pylist())
    for version in range(5):  # commit v dated (v + 1) * 1,000 s after the epoch
        ms = (version + 1) * 1_000_000
        os.utime(Path(table.uri, "_delta_log", f"{version:020d}.json"), ns=(ms * 10**6, ms * 10**6))
    between = {"startingTimestamp": "1970-01-01T00:33:40", "endingTimestamp": "1970-01-01T00:49:00"}
    assert (
        spark.read.format("eventlog")
        .option("readChangeFeed", "true")
        .options(**between)
        .load(table.uri)
        .count()
        == 0
    )
    until = {"startingTimestamp": "1970-01-01T00:33:20", "endingTimestamp": "1970-01-01T00:50:00"}
    df = spark.read.format("eventlog").option("readChangeFeed", "true").options(**until).load(table.uri)
    assert _spark_rows(df) == _sorted(table.changes(1, 2).to_pylist())


def test_batch_read_errors(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, data=pa.table({"id": pa.array([1], pa.int64())})).close()
    reader = spark.read.format("eventlog").option("readChangeFeed", "true")
    with pytest.raises(PySparkException) as err:
        reader.option("startingVersion", 0).load(uri).collect()
    assert "ChangeDataNotRecordedError" in str(err.value)
    with pytest.raises(PySparkException) as err:
        reader.option("startingVersion", 7).load(uri).collect()
    assert "InvalidChangeRangeError" in str(err.value)


def test_batch_read_across_a_rename_is_refused(spark: Any, tmp_path: Path) -> None:
    props = {**CDF, "delta.columnMapping.mode": "name"}
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    table = Table.create(str(tmp_path / "t"), data=data, properties=props)  # version 0
    table.rename_column("v", "w")  # 1
    table.append(pa.table({"id": pa.array([3], pa.int64()), "w": ["c"]}))  # 2
    reader = spark.read.format("eventlog").option("readChangeFeed", "true")
    with pytest.raises(PySparkException) as err:
        reader.option("startingVersion", 0).load(table.uri).collect()
    message = str(err.value)
    assert "ChangeDataSchemaChangeError" in message
    assert "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA" in message
    assert "from version 0 to 0, and from version 1 to 2" in message
    after = reader.option("startingVersion", 1).load(table.uri).select("id", "w", "_commit_version")
    assert [r.asDict() for r in after.collect()] == [{"id": 3, "w": "c", "_commit_version": 2}]
    before = reader.options(startingVersion="0", endingVersion="0").load(table.uri)
    assert before.columns[:2] == ["id", "v"] and before.count() == 2


# --------------------------------------------------------------------------- streaming


class Stream:
    """An eventlog change data feed → Parquet files, with its checkpoint."""

    def __init__(self, spark: Any, root: Path, uri: str) -> None:
        self.spark, self.uri = spark, uri
        self.checkpoint, self.out = str(root / "checkpoint"), str(root / "out")

    def run(self, **options: str) -> None:
        df = (
            self.spark.readStream.format("eventlog")
            .option("readChangeFeed", "true")
            .options(**options)
            .load(self.uri)
        )
        query = (
            df.writeStream.format("parquet")
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start(self.out)
        )
        try:
            assert query.awaitTermination(WAIT), "the query did not finish in time"
        finally:
            query.stop()

    def rows(self) -> list[dict[str, Any]]:
        """The committed output rows (read from the files the sink's log lists)."""
        paths = []
        for entry in sorted((Path(self.out) / "_spark_metadata").iterdir()):
            if entry.name.split(".")[0].isdigit() and not entry.name.endswith(".crc"):
                for line in entry.read_text().splitlines()[1:]:
                    action = json.loads(line)
                    if action["action"] == "add":
                        paths.append(action["path"].removeprefix("file://"))
        tables = [pq.read_table(p) for p in paths]
        return _sorted(pa.concat_tables(tables).to_pylist()) if tables else []


def _normal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with timestamps compared as UTC instants (the Parquet sink drops the zone)."""
    out = []
    for r in rows:
        ts = r["_commit_timestamp"]
        out.append({**r, "_commit_timestamp": ts.replace(tzinfo=None) if ts.tzinfo else ts})
    return _sorted(out)


def test_stream_from_a_starting_version_then_new_commits(spark: Any, tmp_path: Path) -> None:
    table = _table(str(tmp_path / "t"))
    stream = Stream(spark, tmp_path, table.uri)
    stream.run(startingVersion="2")
    assert _normal(stream.rows()) == _normal(table.changes(2).to_pylist())
    table.delete("id = 5")  # version 5: the restarted query reads only it
    stream.run(startingVersion="2")
    assert _normal(stream.rows()) == _normal(table.changes(2).to_pylist())


def test_stream_without_a_start_begins_with_the_latest_rows_as_inserts(spark: Any, tmp_path: Path) -> None:
    table = _table(str(tmp_path / "t"))
    stream = Stream(spark, tmp_path, table.uri)
    stream.run()
    rows = stream.rows()
    assert sorted(r["id"] for r in rows) == sorted(table.to_arrow().column("id").to_pylist())
    assert {(r["_change_type"], r["_commit_version"]) for r in rows} == {("insert", 4)}


def _batch_rows(query: Any) -> list[int]:
    """Input rows of each micro-batch the query ran."""
    return [p["numInputRows"] if isinstance(p, dict) else p.numInputRows for p in query.recentProgress]


def _run_to_parquet(df: Any, tmp_path: Path, out: Path) -> list[int]:
    """Run the stream ``df`` into Parquet files under ``out`` (availableNow) to its end;
    the input rows of each micro-batch."""
    query = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(str(out))
    )
    try:
        assert query.awaitTermination(WAIT), "the query did not finish in time"
        return _batch_rows(query)
    finally:
        query.stop()


def test_stream_admits_change_files_per_trigger_as_delta(spark: Any, tmp_path: Path) -> None:
    """maxFilesPerTrigger=1: the initial rows and plain appends file by file; an UPDATE's
    change data files (one per partition) all in one micro-batch, over the limit."""
    table = _table(str(tmp_path / "t"))  # 0 create, 1 append 2 files, 2 delete, 3 update, 4 append
    table.update("id = 1 OR id = 4", {"id": "id + 100"})  # 5: change data files in a and b
    cdc = [a for a in table.commits_between(5, 5)[0].others if type(a).__name__ == "AddCDCFile"]
    assert len(cdc) == 2
    out = tmp_path / "out"
    df = (
        spark.readStream.format("eventlog")
        .options(readChangeFeed="true", startingVersion="1", maxFilesPerTrigger="1")
        .load(table.uri)
    )
    batches = _run_to_parquet(df, tmp_path, out)
    # 1: two files of 2 rows; 2 and 3: one change data file each (delete 1 row; update 2);
    # 4: one file of 1 row; 5: two change data files (4 rows) admitted together.
    assert batches == [2, 2, 1, 2, 1, 4]
    written = pa.concat_tables([pq.read_table(p) for p in sorted(out.glob("*.parquet"))])
    assert sum(batches) == written.num_rows == table.changes(1).num_rows


def test_stream_admits_bytes_per_trigger_and_splits_the_initial_rows(spark: Any, tmp_path: Path) -> None:
    table = _table(str(tmp_path / "t"))  # latest rows in 2 files (partitions a and b)
    out = tmp_path / "out"
    df = (
        spark.readStream.format("eventlog")
        .options(readChangeFeed="true", maxBytesPerTrigger="1")
        .load(table.uri)
    )
    batches = _run_to_parquet(df, tmp_path, out)
    files = len(table.refresh().add_files)
    assert len(batches) == files  # one file of the initial snapshot per micro-batch
    assert sum(batches) == table.to_arrow().num_rows
