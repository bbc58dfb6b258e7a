"""``spark.readStream.format("eventlog")`` on a real SparkSession.

Every query runs with ``trigger(availableNow=True)`` into the Parquet sink (restartable
from its checkpoint, unlike the memory sink) and every wait is bounded. Errors raised by
the source reach the driver as ``StreamingQueryException`` text; :func:`streaming.recover`
rebuilds the typed error from it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException

from eventlog import Table
from streaming import (
    ChangeCommitError,
    DataLossError,
    SourceMetadataChangedError,
    StreamingError,
    recover,
    supervise,
)
from tests.conftest import SCHEMA, rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

WAIT = 120  # seconds; a query that is not done by then fails the test


class Stream:
    """One streaming pipeline: an eventlog table → Parquet files, with its checkpoint."""

    def __init__(self, spark: Any, root: Path, uri: str) -> None:
        self.spark = spark
        self.uri = uri
        self.checkpoint = str(root / "checkpoint")
        self.out = str(root / "out")

    def load(self, **options: str) -> Any:
        return self.spark.readStream.format("eventlog").options(**options).load(self.uri)

    def start(self, df: Any = None, **options: str) -> Any:
        df = self.load(**options) if df is None else df
        return (
            df.writeStream.format("parquet")
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start(self.out)
        )

    def run(self, df: Any = None, **options: str) -> Any:
        """Run to the end; the query (raises StreamingQueryException if it failed)."""
        query = self.start(df, **options)
        try:
            assert query.awaitTermination(WAIT), "the query did not finish in time"
        finally:
            query.stop()
        return query

    def fail(self, df: Any = None, **options: str) -> StreamingError:
        """Run expecting a failure; the typed error recovered from Spark's exception."""
        with pytest.raises(StreamingQueryException) as info:
            self.run(df, **options)
        error = recover(info.value)
        assert error is not None, str(info.value)
        assert type(error).__name__ in str(info.value)  # the class name survives in the text
        return error

    def ids(self, *columns: str) -> list[Any]:
        """Sorted ids (or (id, *columns) tuples) of the committed output.

        Read with pyarrow from the files the sink's ``_spark_metadata`` log committed (no
        Spark job; files a failed batch left behind are not listed there).
        """
        log = Path(self.out) / "_spark_metadata"
        if not log.exists():
            return []
        paths = []
        entries = [e for e in log.iterdir() if e.name.split(".")[0].isdigit() and not e.name.endswith(".crc")]
        for entry in entries:
            for line in entry.read_text().splitlines()[1:]:
                action = json.loads(line)
                if action["action"] == "add":
                    paths.append(action["path"].removeprefix("file://"))
        tables = [pq.read_table(p) for p in paths]
        data = pa.concat_tables(tables, promote_options="default") if tables else pa.table({"id": []})
        if not columns:
            return sorted(data.column("id").to_pylist())
        return sorted(zip(*(data.column(c).to_pylist() for c in ("id", *columns)), strict=True))

    def offsets(self) -> list[dict[str, Any]]:
        """The source offset that ends each planned batch (the checkpoint's offset log)."""
        folder = Path(self.checkpoint) / "offsets"
        names = sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        return [json.loads(p.read_text().splitlines()[-1]) for p in names]


@pytest.fixture
def table(tmp_path: Path) -> Table:
    t = Table.create(str(tmp_path / "table"), SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    for k in range(3):
        t.append(rows([10 * k, 10 * k + 1]))  # versions 1..3
    return t


@pytest.fixture
def stream(spark: Any, tmp_path: Path, table: Table) -> Stream:
    return Stream(spark, tmp_path, table.uri)


def test_snapshot_then_commits_and_restart_from_checkpoint_without_repeats(
    stream: Stream, table: Table
) -> None:
    table.delete("id = 11")  # v4, a deletion vector: the snapshot applies it
    stream.run()
    assert stream.ids() == [0, 1, 10, 20, 21]
    (first,) = stream.offsets()
    assert {k: first[k] for k in ("sourceVersion", "version", "index", "isInitialSnapshot")} == {
        "sourceVersion": 1, "version": 5, "index": 0, "isInitialSnapshot": False,
    }  # fmt: skip
    table.append(rows([30]))
    table.append(rows([40, 41]))
    stream.run()
    assert stream.ids() == [0, 1, 10, 20, 21, 30, 40, 41]
    assert [o["version"] for o in stream.offsets()] == [5, 7]
    stream.run()  # nothing new: no batch, no repeat
    assert len(stream.offsets()) == 2 and len(stream.ids()) == 8


def test_a_running_query_picks_up_new_commits(stream: Stream, table: Table) -> None:
    query = (
        stream.load()
        .writeStream.format("parquet")
        .option("checkpointLocation", stream.checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start(stream.out)
    )
    try:
        wait_for(lambda: stream.ids() == [0, 1, 10, 11, 20, 21])
        table.append(rows([30]))
        wait_for(lambda: stream.ids() == [0, 1, 10, 11, 20, 21, 30])
        assert query.isActive and query.exception() is None
    finally:
        query.stop()


def wait_for(condition: Any, seconds: float = WAIT) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_max_files_and_bytes_per_trigger_split_batches(spark: Any, tmp_path: Path, table: Table) -> None:
    by_files = Stream(spark, tmp_path / "files", table.uri)
    by_files.run(maxFilesPerTrigger="1")
    assert [(o["version"], o["index"], o["isInitialSnapshot"]) for o in by_files.offsets()] == [
        (3, 1, True), (3, 2, True), (4, 0, False),
    ]  # fmt: skip
    by_bytes = Stream(spark, tmp_path / "bytes", table.uri)
    by_bytes.run(startingVersion="1", maxBytesPerTrigger="1")
    assert [o["version"] for o in by_bytes.offsets()] == [2, 3, 4]
    assert by_files.ids() == by_bytes.ids() == [0, 1, 10, 11, 20, 21]


def test_starting_version_timestamp_and_latest(spark: Any, tmp_path: Path, table: Table) -> None:
    from_two = Stream(spark, tmp_path / "v2", table.uri)
    from_two.run(startingVersion="2")
    assert from_two.ids() == [10, 11, 20, 21]
    committed = {h["version"]: h["timestamp"] for h in table.history()}
    from_time = Stream(spark, tmp_path / "ts", table.uri)
    from_time.run(startingTimestamp=dt.datetime.fromtimestamp(committed[3] / 1000, dt.UTC).isoformat())
    assert from_time.ids() == [20, 21]
    latest = Stream(spark, tmp_path / "latest", table.uri)
    latest.run(startingVersion="latest")
    table.append(rows([30]))
    latest.run(startingVersion="latest")
    assert latest.ids() == [30]


def test_change_commit_fails_naming_it_and_skip_change_commits_continues(
    stream: Stream, table: Table
) -> None:
    stream.run(startingVersion="1")
    table.update("id = 0", {"x": "99"})  # v4
    table.append(rows([30]))  # v5
    error = stream.fail(startingVersion="1")
    assert isinstance(error, ChangeCommitError)
    assert (error.version, error.operation) == (4, "UPDATE")
    stream.run(startingVersion="1", skipChangeCommits="true")  # same checkpoint: resumes at v4
    assert stream.ids() == [0, 1, 10, 11, 20, 21, 30]


def test_fail_on_data_loss_both_ways(spark: Any, tmp_path: Path, table: Table) -> None:
    table.optimize()  # v4: the files of v1..v3 are retired...
    time.sleep(0.05)
    assert table.vacuum(0, enforce_retention=False)  # ...and deleted
    table.append(rows([30]))  # v5
    strict = Stream(spark, tmp_path / "strict", table.uri)
    error = strict.fail(startingVersion="1")
    assert isinstance(error, DataLossError) and error.kind == "file"
    assert error.first_version in (1, 2, 3)  # whichever task failed first
    lenient = Stream(spark, tmp_path / "lenient", table.uri)
    lenient.run(startingVersion="1", failOnDataLoss="false")
    assert lenient.ids() == [30]


def test_metadata_change_fails_and_a_restart_reads_the_new_schema(stream: Stream, table: Table) -> None:
    stream.run()
    before = stream.load()  # the schema is resolved now
    table.add_columns([pa.field("z", pa.string())])  # v4
    table.append(rows([30]).append_column("z", pa.array(["new"])))  # v5
    error = stream.fail(before)
    assert isinstance(error, SourceMetadataChangedError)
    assert (error.version, error.changed, error.read_version) == (4, ["schema"], 3)
    assert "z" in error.new_schema and "z" not in error.old_schema
    assert "must be restarted" in str(error)
    stream.run()  # a fresh load() takes the new schema and resumes at v4
    assert stream.ids("z") == [
        (0, None),
        (1, None),
        (10, None),
        (11, None),
        (20, None),
        (21, None),
        (30, "new"),
    ]


def test_supervise_restarts_once_on_a_property_change(
    stream: Stream, table: Table, caplog: pytest.LogCaptureFixture
) -> None:
    stale = stream.load()
    table.set_properties({"owner": "ingest"})  # v4
    table.append(rows([30]))  # v5
    frames = [stale]

    def start() -> Any:
        return stream.start(frames.pop() if frames else None)

    with caplog.at_level(logging.WARNING, logger="streaming.supervise"):
        query = supervise(start, max_restarts=1, timeout=2 * WAIT)
    assert not query.isActive and query.exception() is None
    (restart,) = [r for r in caplog.records if getattr(r, "event", None) == "stream_restart"]
    assert (restart.__dict__["version"], restart.__dict__["changed"]) == (4, ["properties"])
    assert restart.__dict__["query_id"] == str(query.id)
    assert stream.ids() == [0, 1, 10, 11, 20, 21, 30]
