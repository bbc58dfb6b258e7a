"""``format("eventlog")`` on a Spark Connect session: batch writes (append, overwrite,
``partitionBy``) and reads (latest, ``versionAsOf``), ``read_table``/``toDF`` (the Python data
source there), and a streaming write and read with ``trigger(availableNow=True)``, each checked
against the plain-Python ``eventlog.Table`` on the same table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from eventlog import Table
from eventlog.log.commitlog import resolve_slots
from eventlog.log.storage import LogStore
from spark_adapter import read_table
from spark_adapter.native import native_target
from spark_adapter.table import EventlogTable
from streaming.ownership import lease_name
from tests.conftest import SCHEMA, rows
from tests.support.spark_connect import CONNECT_MODE_ENV

# 300 s: the first test also waits for the Connect server to start.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

DDL = "id BIGINT, date STRING, x BIGINT, y DOUBLE"


def _data(ids: range, date: str) -> list[tuple[int, str, int, float]]:
    return [(i, date, i, float(i)) for i in ids]


def _ids(df: Any) -> list[int]:
    return sorted(r.id for r in df.collect())


def test_batch_write_and_read_match_the_python_api(connect_spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write = connect_spark.createDataFrame(_data(range(0, 10), "2024-01-01"), DDL).write.format("eventlog")
    write.mode("append").option("partitionBy", "date").save(uri)
    more = connect_spark.createDataFrame(_data(range(10, 15), "2024-01-02"), DDL)
    more.write.format("eventlog").mode("append").save(uri)
    with Table.open(uri) as t:
        assert t.version == 1
        assert list(t.partition_columns) == ["date"]
        assert sorted(t.to_arrow().column("id").to_pylist()) == list(range(15))
        assert [h["operation"] for h in sorted(t.history(), key=lambda h: h["version"])] == ["WRITE", "WRITE"]
    t = Table.open(uri)
    t.append(rows([100, 101], "2024-01-03"))  # the Python API writes, Connect reads
    read = connect_spark.read.format("eventlog")
    assert _ids(read.load(uri)) == [*range(15), 100, 101]
    assert _ids(read.option("versionAsOf", 0).load(uri)) == list(range(10))
    second = connect_spark.read.format("eventlog").load(uri).where("date = '2024-01-02'")
    assert _ids(second) == list(range(10, 15))
    over = connect_spark.createDataFrame(_data(range(50, 53), "2024-01-05"), DDL)
    over.write.format("eventlog").mode("overwrite").save(uri)
    assert t.refresh().version == 3
    assert sorted(t.to_arrow().column("id").to_pylist()) == [50, 51, 52]
    assert t.history(1)[0]["operation"] == "WRITE"
    assert t.history(1)[0]["operationParameters"]["mode"] == "Overwrite"
    assert _ids(connect_spark.read.format("eventlog").option("versionAsOf", 2).load(uri)) == [
        *range(15),
        100,
        101,
    ]
    t.close()


def test_read_table_and_to_df_use_the_python_data_source(connect_spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, partition_by=["date"], properties={"delta.enableDeletionVectors": "true"})
    t.append(rows(list(range(10)), "2024-01-01"))
    t.append(rows(list(range(10, 20)), "2024-01-02"))
    t.delete("x % 2 = 0")  # deletion vectors
    from eventlog.log.location import TableLocation

    assert isinstance(native_target(connect_spark, TableLocation.of(uri)), str)  # why: no JVM
    expected = sorted(t.to_arrow().column("id").to_pylist())
    assert _ids(read_table(connect_spark, uri)) == expected
    assert _ids(read_table(connect_spark, uri, version=1)) == list(range(10))
    assert _ids(read_table(connect_spark, uri, where="id >= 10")) == [i for i in expected if i >= 10]
    df = EventlogTable.forPath(connect_spark, uri).toDF()
    assert sorted(r.asDict()["id"] for r in df.collect()) == expected
    assert df.columns == ["id", "date", "x", "y"]
    t.close()


def _stream(spark: Any, src: str, dst: str, checkpoint: Path) -> Any:
    """eventlog -> eventlog: the streaming source and the streaming sink, started to run to
    the end (availableNow) from ``checkpoint``."""
    return (
        spark.readStream.format("eventlog")
        .load(src)
        .writeStream.format("eventlog")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(dst)
    )


def _copy_stream(spark: Any, src: str, dst: str, checkpoint: Path) -> None:
    """:func:`_stream` run to its end, which must come without an exception."""
    query = _stream(spark, src, dst, checkpoint)
    query.awaitTermination(120)
    assert query.exception() is None


def test_streaming_write_and_read_available_now(connect_spark: Any, tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    t = Table.create(src, SCHEMA)
    t.append(rows(list(range(5))))
    t.append(rows(list(range(5, 8))))
    # eventlog -> eventlog: the streaming source and the streaming sink, over Connect.
    _copy_stream(connect_spark, src, dst, tmp_path / "ckpt")
    with Table.open(dst) as out:
        assert sorted(out.to_arrow().column("id").to_pylist()) == list(range(8))
        first = out.version
    t.append(rows([100, 101]))  # a restart from the checkpoint reads only the new commit
    _copy_stream(connect_spark, src, dst, tmp_path / "ckpt")
    with Table.open(dst) as out:
        assert sorted(out.to_arrow().column("id").to_pylist()) == [*range(8), 100, 101]
        assert out.version == first + 1
        assert out.history(1)[0]["operation"] == "STREAMING UPDATE"
    t.close()


def test_the_sinks_checkpoint_lease_belongs_to_the_connect_server(
    connect_spark: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Connect the driver is the server: its application holds the checkpoint (the lease
    names the server's JVM), and a query of another application (the classic session here)
    on the same checkpoint fails before any batch, naming the owner."""
    src, dst, checkpoint = str(tmp_path / "src"), str(tmp_path / "dst"), tmp_path / "ckpt"
    source = Table.create(src, SCHEMA)
    source.append(rows([1, 2]))
    _copy_stream(connect_spark, src, dst, checkpoint)
    source.append(rows([3]))  # a batch for the other application to plan
    holder = resolve_slots(None, LogStore(dst)).lease_owner(lease_name(str(checkpoint)))
    assert holder is not None
    driver = Path(f"/proc/{holder.info['driverPid']}/cmdline").read_bytes()
    assert b"org.apache.spark.sql.connect.service.SparkConnectServer" in driver
    monkeypatch.delenv(CONNECT_MODE_ENV)  # the classic session's columns, for this part
    query = _stream(spark, src, dst, checkpoint)
    try:
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
    finally:
        query.stop()
    error = str(failed.value)
    assert "DELTA_CONCURRENT_TRANSACTION" in error
    assert "several streaming queries are using the same checkpoint" in error
    assert f"(driver pid {holder.info['driverPid']})" in error
    assert Table.open(dst).version == 0  # the second application wrote nothing
