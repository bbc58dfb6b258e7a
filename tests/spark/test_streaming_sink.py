"""``df.writeStream.format("eventlog")`` on a real SparkSession.

Inputs are deterministic: Parquet files read by Spark's file source with
``maxFilesPerTrigger=1`` (one file per micro-batch). Queries run with
``trigger(availableNow=True)`` unless a test needs a query that stays up, and every wait
is bounded. A second query on a shared checkpoint runs in a second Spark application, in a
child process (inside one JVM, Spark itself stops the older run of a query).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException

from eventlog import Table
from eventlog.log.commitlog import resolve_slots
from eventlog.log.storage import LogStore
from streaming.batchfiles import parse_batch_file_name
from streaming.ownership import lease_name
from streaming.sink import STREAMING_FIELD, STREAMING_OPERATION

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

WAIT = 120  # seconds; a query that is not done by then fails the test
SAME_CHECKPOINT = "several streaming queries are using the same checkpoint"


def wait_until(condition: Callable[[], bool], seconds: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Pipeline:
    """Parquet input files -> the eventlog sink, with the query's checkpoint."""

    def __init__(self, spark: Any, root: Path) -> None:
        self.spark = spark
        self.root = root
        self.input = root / "input"
        self.input.mkdir(parents=True, exist_ok=True)
        self.uri = str(root / "table")
        self.checkpoint = str(root / "checkpoint")
        self.files = 0

    def add_file(self, ids: list[int]) -> None:
        """One more input file (written aside, then renamed in: the source never sees half)."""
        table = pa.table(
            {"id": pa.array(ids, pa.int64()), "part": pa.array([i % 2 for i in ids], pa.int64())}
        )
        tmp = self.root / f".input-{self.files}.parquet"
        pq.write_table(table, tmp)
        os.replace(tmp, self.input / f"in-{self.files:04d}.parquet")
        self.files += 1

    def stream(self) -> Any:
        return (
            self.spark.readStream.schema("id long, part long")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(self.input))
        )

    def start(
        self, df: Any = None, *, mode: str = "append", trigger: dict[str, Any] | None = None, **options: str
    ) -> Any:
        writer = (
            (df if df is not None else self.stream())
            .writeStream.format("eventlog")
            .outputMode(mode)
            .option("checkpointLocation", self.checkpoint)
            .options(**options)
            .trigger(**(trigger or {"availableNow": True}))
        )
        return writer.start(self.uri)

    def run(self, df: Any = None, **kwargs: Any) -> Any:
        query = self.start(df, **kwargs)
        try:
            assert query.awaitTermination(WAIT), "the query did not finish in time"
        finally:
            query.stop()
        return query

    def ids(self) -> list[int]:
        with Table.open(self.uri) as t:
            return sorted(t.to_arrow().column("id").to_pylist())

    def history(self) -> list[dict[str, Any]]:
        with Table.open(self.uri) as t:
            return sorted(t.history(), key=lambda h: h["version"])

    def batches(self) -> list[int]:
        """The batch ids of the sink's commits, in version order."""
        return [
            h[STREAMING_FIELD]["batchId"] for h in self.history() if h["operation"] == STREAMING_OPERATION
        ]

    def data_files(self) -> set[str]:
        out = set()
        for directory, dirs, names in os.walk(self.uri):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            out |= {os.path.join(directory, n) for n in names if n.endswith(".parquet")}
        return out

    def drop_checkpoint_commit(self, batch: int, *, offsets: bool = False) -> None:
        """Forget that Spark committed ``batch`` (and with ``offsets``, that it planned it)."""
        kinds = ["commits", "offsets"] if offsets else ["commits"]
        for kind in kinds:
            for name in (str(batch), f".{batch}.crc"):
                path = Path(self.checkpoint) / kind / name
                if path.exists():
                    path.unlink()


@pytest.fixture
def pipeline(spark: Any, tmp_path: Path) -> Iterator[Pipeline]:
    yield Pipeline(spark, tmp_path)


def test_exactly_once_across_a_forced_replay_and_readable_by_deltalake(pipeline: Pipeline) -> None:
    for f in range(3):
        pipeline.add_file([f * 10 + i for i in range(4)])
    query = pipeline.run(partitionBy="part")
    assert pipeline.batches() == [0, 1, 2]
    expected = sorted(f * 10 + i for f in range(3) for i in range(4))
    assert pipeline.ids() == expected
    history = pipeline.history()
    assert history[-1][STREAMING_FIELD] == {
        "queryId": str(query.id), "runId": str(query.runId), "batchId": 2, "appId": str(query.id),
    }  # fmt: skip
    names = [parse_batch_file_name(p) for p in pipeline.data_files()]
    assert {n[:2] for n in names if n is not None} == {(str(query.id), b) for b in range(3)}
    assert None not in names
    # Spark forgets it committed batch 2: the restarted query replays it, the sink commits
    # nothing (the table already holds batch 2 under txn(queryId, 2)), then goes on.
    files_before = pipeline.data_files()
    pipeline.drop_checkpoint_commit(2)
    pipeline.add_file([100, 101])
    replay = pipeline.run(partitionBy="part")
    assert replay.id == query.id and replay.runId != query.runId
    assert pipeline.batches() == [0, 1, 2, 3]
    assert pipeline.ids() == sorted([*expected, 100, 101])
    new = {parse_batch_file_name(p) for p in pipeline.data_files() - files_before}
    assert files_before < pipeline.data_files() and {n[1] for n in new if n} == {3}  # replay's files gone
    # Read back by deltalake: the same rows and partitioning.
    deltalake = pytest.importorskip("deltalake")
    delta = deltalake.DeltaTable(pipeline.uri)
    assert delta.metadata().partition_columns == ["part"]
    theirs = delta.to_pyarrow_table().sort_by("id")
    with Table.open(pipeline.uri) as t:
        ours = t.to_arrow().select(theirs.column_names).sort_by("id")
    assert theirs.column("id").to_pylist() == ours.column("id").to_pylist() == pipeline.ids()
    assert theirs.column("part").to_pylist() == ours.column("part").to_pylist()
    assert delta.history(1)[0]["operation"] == STREAMING_OPERATION


def test_complete_mode_replaces_the_table_each_batch(pipeline: Pipeline) -> None:
    from pyspark.sql import functions as F

    pipeline.add_file([1, 2, 3])
    pipeline.add_file([4, 5])
    counts = pipeline.stream().groupBy((F.col("id") % 2).alias("odd")).agg(F.count("*").alias("n"))
    pipeline.run(counts, mode="complete")
    with Table.open(pipeline.uri) as t:
        assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["odd"]) == [
            {"odd": 0, "n": 2},
            {"odd": 1, "n": 3},
        ]
        assert [h["operationParameters"]["outputMode"] for h in t.history()] == ["Complete", "Complete"]
        assert len(t.files()) <= 4  # the last batch's files only (one per shuffle partition at most)
    pipeline.add_file([7])
    pipeline.run(counts, mode="complete")
    with Table.open(pipeline.uri) as t:
        assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["odd"]) == [
            {"odd": 0, "n": 2},
            {"odd": 1, "n": 4},
        ]


def test_update_mode_is_refused_by_spark(pipeline: Pipeline) -> None:
    from pyspark.sql import functions as F

    pipeline.add_file([1])
    counts = pipeline.stream().groupBy("part").agg(F.count("*").alias("n"))
    with pytest.raises(Exception, match=r"(?i)update mode"):
        pipeline.start(counts, mode="update").awaitTermination(WAIT)


def test_an_alter_fails_the_running_sink_and_a_restart_goes_on(pipeline: Pipeline) -> None:
    pipeline.add_file([0, 1])
    query = pipeline.start(trigger={"processingTime": "300 milliseconds"})
    try:
        wait_until(lambda: Table.exists(pipeline.uri) and pipeline.batches() == [0], what="batch 0")
        with Table.open(pipeline.uri) as t:
            t.set_properties({"delta.appendOnly": "false"})
            altered = t.version
        files = pipeline.data_files()
        pipeline.add_file([2, 3])
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(WAIT)
    finally:
        query.stop()
    error = str(failed.value)
    assert "MetadataChangedException" in error
    assert "Batch 1 was not committed" in error and "table properties" in error
    with Table.open(pipeline.uri) as t:
        assert t.version == altered  # nothing committed
    assert pipeline.data_files() == files  # and the failed batch's files are gone
    # The restart replays batch 1 with the new metadata; a column added meanwhile is null.
    with Table.open(pipeline.uri) as t:
        t.add_columns([pa.field("note", pa.string())])
    pipeline.run()
    assert pipeline.batches() == [0, 1]
    assert pipeline.ids() == [0, 1, 2, 3]
    with Table.open(pipeline.uri) as t:
        assert t.schema.names == ["id", "part", "note"]
        assert set(t.to_arrow().column("note").to_pylist()) == {None}


# --------------------------------------------------------------------------- two applications

_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from eventlog import Table

    args = json.loads(sys.argv[1])
    spark = (SparkSession.builder.master("local[2]").appName("second-application")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "512m").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def say(**kw):
        print(json.dumps(kw), flush=True)

    def stream(directory):
        return (spark.readStream.schema("id long, part long").option("maxFilesPerTrigger", 1)
                .parquet(directory))

    def attempt(lease):
        q = (stream(args["input"]).writeStream.format("eventlog")
             .option("checkpointLocation", args["checkpoint"]).option("checkpointLease", lease)
             .trigger(availableNow=True).start(args["table"]))
        try:
            q.awaitTermination(120)
            return str(q.exception() or "")
        except Exception as exc:
            return str(exc)
        finally:
            q.stop()

    say(stage="early", error=attempt("true"))
    say(stage="commit", error=attempt("false"))
    q = (stream(args["input2"]).writeStream.format("eventlog")
         .option("checkpointLocation", args["checkpoint2"])
         .trigger(processingTime="1 hour").start(args["table2"]))
    deadline = time.monotonic() + 120
    while not (Table.exists(args["table2"]) and Table.open(args["table2"]).version >= 0):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    say(stage="holding", query=str(q.id), run=str(q.runId), pid=os.getpid())
    time.sleep(600)
    """
)


def test_a_shared_checkpoint_fails_the_second_application(spark: Any, tmp_path: Path) -> None:
    """One child Spark application, three steps: (1) a query on a checkpoint that a running
    query of this application holds fails before any batch, naming the owner; (2) with the
    early check off, a run that replays a batch the owner already passed fails at commit
    time; (3) the child's own query holds another checkpoint until the child is SIGKILLed,
    then a query here takes it over."""
    first = Pipeline(spark, tmp_path / "first")
    for f in range(3):
        first.add_file([f])
    owner = first.start(trigger={"processingTime": "2 seconds"})
    second = Pipeline(spark, tmp_path / "second")
    for f in range(3):
        second.add_file([10 + f])
    child: subprocess.Popen[str] | None = None
    try:
        wait_until(
            lambda: Table.exists(first.uri) and first.batches() == [0, 1, 2], what="the owner's batches"
        )
        # The child's run will find batches 1 and 2 unplanned and uncommitted in the
        # checkpoint (the owner is idle: no new input), so it replays batch 1.
        first.drop_checkpoint_commit(2, offsets=True)
        first.drop_checkpoint_commit(1)
        version, files = first.history()[-1]["version"], first.data_files()
        args = {
            "table": first.uri, "checkpoint": first.checkpoint, "input": str(first.input),
            "table2": second.uri, "checkpoint2": second.checkpoint, "input2": str(second.input),
        }  # fmt: skip
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        reports = _read_reports(child, 3)
        early = reports["early"]["error"]
        assert SAME_CHECKPOINT in early and str(owner.id) in early
        assert f"(driver pid {_jvm_pid(spark)})" in early
        assert "no batch of this query was processed" in early
        commit = reports["commit"]["error"]
        assert SAME_CHECKPOINT in commit and "has already committed batch 2" in commit
        assert first.history()[-1]["version"] == version and first.data_files() == files
        assert first.ids() == [0, 1, 2]
        # (3) The child holds the second checkpoint; SIGKILL frees it.
        holder = _lease_owner(second)
        assert holder is not None and holder.info["queryId"] == reports["holding"]["query"]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        wait_until(lambda: _lease_owner(second) is None, 90, "the dead application's lease to end")
    finally:
        owner.stop()
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    second.run()
    assert second.ids() == [10, 11, 12]
    assert second.batches() == [0, 1, 2]


def _read_reports(child: subprocess.Popen[str], count: int) -> dict[str, dict[str, Any]]:
    reports: dict[str, dict[str, Any]] = {}
    assert child.stdout is not None
    deadline = time.monotonic() + 240
    while len(reports) < count:
        assert time.monotonic() < deadline, f"child reported only {sorted(reports)}"
        line = child.stdout.readline()
        if not line:
            pytest.fail(f"the child application exited ({child.poll()}) after {sorted(reports)}")
        if line.startswith("{"):
            report = json.loads(line)
            reports[report["stage"]] = report
    return reports


def _lease_owner(pipeline: Pipeline) -> Any:
    store = resolve_slots(None, LogStore(pipeline.uri))
    return store.lease_owner(lease_name(pipeline.checkpoint))


def _jvm_pid(spark: Any) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def test_a_stopped_query_restarts_in_the_same_application(pipeline: Pipeline) -> None:
    """The lease belongs to the application: its next run of the query goes on."""
    pipeline.add_file([1])
    pipeline.run()
    holder = _lease_owner(pipeline)
    assert holder is not None and holder.info["driverPid"] == str(_jvm_pid(pipeline.spark))
    pipeline.add_file([2])
    pipeline.run()
    assert pipeline.ids() == [1, 2]
    assert _lease_owner(pipeline) == holder


def test_bad_options_fail_before_any_task(pipeline: Pipeline) -> None:
    pipeline.add_file([1])
    with pytest.raises(StreamingQueryException, match="txnVersion is not a streaming sink option"):
        pipeline.run(txnVersion="3", txnAppId="x")
    with pytest.raises(StreamingQueryException, match="autoCompact must be"):
        pipeline.run(autoCompact="sometimes")
    assert not Table.exists(pipeline.uri)
    shutil.rmtree(pipeline.checkpoint, ignore_errors=True)
    pipeline.run(autoCompact="true", autoCompactMinNumFiles="2", userMetadata="from a stream")
    assert pipeline.history()[-1]["userMetadata"] == "from a stream"
