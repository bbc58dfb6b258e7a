"""Durable mode through Spark (issue 28): the ``durable`` writer option, the streaming sink's
``durable`` option and ``EventlogTable.forPath(..., durable=True)``.

Every data file is written by Spark's Python workers (batch write tasks, DML and OPTIMIZE
tasks, streaming tasks), and the batch writer's commit runs in yet another Python worker:
a monkeypatched ``os.fsync`` in this process sees none of that. So the tables live on the
power-loss file system (tests/support/powerloss.py), which sees every fsync of every
process: a file's content is kept only once it was fsynced, an entry only once its
directory was. After the writes, the power is cut and the table is read back from what
the disk kept. A durable table must hold every acknowledged write (each file whole,
``verify`` passing, a new write accepted); a table written without ``durable`` beside it
is gone, which shows the check can fail. The file system's own fsync counter gives the
cost per write, and a monkeypatched ``os.fsync`` records what the driver itself synced
(EventlogTable's deletion vectors and commits), to tell the tasks' fsyncs from the
driver's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException

from eventlog import Table, TableNotFoundError
from eventlog.errors import InvalidInputError
from spark_adapter.errors import recover_error
from spark_adapter.table import EventlogTable
from tests.support.powerloss import PowerLossMount

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

FMT = "eventlog"
WAIT = 120  # seconds for a streaming query
COMMIT_SYNCS = 5  # staged commit, its directory, the claim's directory, _delta_log, the slot's completion
SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("v", pa.string())])


def _rows(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "p": [i % 2 for i in ids], "v": [f"v{i}" for i in ids]}, schema=SCHEMA)


def _frame(spark: Any, ids: range, tasks: int = 2) -> Any:
    """A DataFrame of ``ids`` spread round-robin over ``tasks`` tasks (each holding rows of
    both partitions when there are enough rows)."""
    return spark.createDataFrame(_rows(ids).to_pandas()).repartition(tasks)


def _ids(table: Table) -> list[int]:
    return sorted(table.to_arrow().column("id").to_pylist())


def _check_image(path: Path, ids: list[int], version: int) -> None:
    """A fresh handle on what the disk kept: every acknowledged row, ``verify`` passing, and
    a new write accepted."""
    with Table.open(path) as table:
        assert table.version == version
        assert _ids(table) == ids
        report = table.verify()
        assert report.ok, report
        assert table.append(_rows(range(1000, 1001))).version == version + 1


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[PowerLossMount]:
    with PowerLossMount(tmp_path / "mnt") as m:
        yield m


@pytest.fixture
def driver_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths this process (the Spark driver's Python side) fsyncs, in order."""
    paths: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


# --------------------------------------------------------------------------- the option


def test_a_bad_durable_value_is_refused_before_anything_is_written(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    with pytest.raises(Exception) as caught:
        _frame(spark, range(4)).write.format(FMT).mode("append").option("durable", "yes").save(uri)
    err = recover_error(caught.value)
    assert isinstance(err, InvalidInputError)
    assert "durable" in err.message and "'yes'" in err.message
    assert not Table.exists(uri)

    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(_rows(range(3)), source / "a.parquet")
    stream = spark.readStream.schema("id long, p long, v string").parquet(str(source))
    query = (
        stream.writeStream.format(FMT)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .option("durable", "sometimes")
        .trigger(availableNow=True)
        .start(uri)
    )
    try:
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(WAIT)
    finally:
        query.stop()
    err = recover_error(failed.value)
    assert isinstance(err, InvalidInputError)
    assert "durable" in err.message and "'sometimes'" in err.message
    assert not Table.exists(uri)


# --------------------------------------------------------------------------- batch writes


def test_durable_batch_writes_survive_a_power_loss_and_plain_ones_do_not(
    spark: Any, mount: PowerLossMount, tmp_path: Path
) -> None:
    durable, plain = mount.mountpoint / "durable", mount.mountpoint / "plain"
    first = _frame(spark, range(0, 40))
    first.write.format(FMT).mode("append").option("partitionBy", "p").option("durable", "true").save(
        str(durable)
    )  # creates it: version 0
    first.write.format(FMT).mode("append").option("partitionBy", "p").save(str(plain))
    second = _frame(spark, range(40, 100))
    before = mount.stats()["syncs"]
    second.write.format(FMT).mode("append").option("durable", "true").save(str(durable))
    cost = mount.stats()["syncs"] - before
    with Table.open(durable) as table:
        (adds,) = [c.adds for c in table.commits_between(1, 1)]
    before = mount.stats()["syncs"]
    second.write.format(FMT).mode("append").save(str(plain))
    assert mount.stats()["syncs"] == before  # without the option: nothing synced
    mount.cut(tmp_path / "image")
    mount.close()

    # Each data file synced with its directory entry in the task that wrote it (two tasks,
    # both partitions each: four files), then the commit's five.
    assert len(adds) == 4
    assert cost == 2 * len(adds) + COMMIT_SYNCS
    _check_image(tmp_path / "image" / "durable", list(range(100)), 1)
    with pytest.raises(TableNotFoundError):  # nothing of it was ever synced
        Table.open(tmp_path / "image" / "plain")


# --------------------------------------------------------------------------- EventlogTable


def test_durable_eventlog_table_operations_survive_a_power_loss(
    spark: Any, mount: PowerLossMount, tmp_path: Path, driver_syncs: list[str]
) -> None:
    uri = mount.mountpoint / "t"
    props = {"delta.enableDeletionVectors": "true"}
    Table.create(uri, data=_rows(range(0, 50)), partition_by=["p"], properties=props, durable=True).close()
    table = EventlogTable.forPath(spark, str(uri), durable=True)
    assert table.location.durable and table.table.log.durable

    driver_syncs.clear()
    before = mount.stats()["syncs"]
    updated = table.update("id < 10", set={"v": "'updated'"})  # tasks write, the driver DVs
    update_cost = mount.stats()["syncs"] - before
    with Table.open(uri) as t:
        (commit,) = t.commits_between(updated.version, updated.version)
    written = [a.path for a in commit.adds if a.deletion_vector is None]
    marked = [a.path for a in commit.adds if a.deletion_vector is not None]
    assert len(written) >= 2 and len(marked) == 2  # new rows in each partition; each old file a DV
    # The driver synced the one DV file of the commit (and its directory), then the
    # commit; the tasks synced the new data files, each with its directory entry.
    assert not [p for p in driver_syncs if p.endswith(".parquet")]
    assert sum(p.endswith(".bin") for p in driver_syncs) == 1
    assert len(driver_syncs) == 2 + COMMIT_SYNCS
    assert update_cost == 2 * len(written) + len(driver_syncs)

    deleted = table.delete("id >= 45")  # deletion vectors only, on the driver
    compacted = table.optimize().executeCompaction()  # tasks rewrite each partition
    assert (updated.version, deleted.version, compacted.version) == (1, 2, 3)
    mount.cut(tmp_path / "image")
    table.table.close()
    mount.close()

    image = tmp_path / "image" / "t"
    _check_image(image, list(range(45)), 3)
    with Table.open(image) as t:
        values = dict(zip(*(t.to_arrow().column(c).to_pylist() for c in ("id", "v")), strict=True))
    assert sorted(i for i, v in values.items() if v == "updated") == list(range(10))


# --------------------------------------------------------------------------- streaming sink


def test_durable_streaming_sink_keeps_every_acknowledged_batch(
    spark: Any, mount: PowerLossMount, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for n, ids in enumerate((range(0, 10), range(10, 25))):
        pq.write_table(_rows(ids), source / f"in-{n}.parquet")
    uri = mount.mountpoint / "stream"
    query = (
        spark.readStream.schema("id long, p long, v string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .writeStream.format(FMT)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .option("partitionBy", "p")
        .option("durable", "true")
        # The lease holder would keep a lease file on the mount open until the JVM exits.
        .option("checkpointLease", "false")
        .trigger(availableNow=True)
        .start(str(uri))
    )
    try:
        assert query.awaitTermination(WAIT), "the query did not finish in time"
    finally:
        query.stop()
    mount.cut(tmp_path / "image")
    mount.close()

    image = tmp_path / "image" / "stream"
    _check_image(image, list(range(25)), 1)  # one version per micro-batch
    with Table.open(image) as t:
        assert t.snapshot(1).txn_version(str(query.id)) == 1
