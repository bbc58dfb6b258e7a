"""CHECK constraints, NOT NULL and generated columns on Spark: the batch writer, the streaming
sink and the DML of ``EventlogTable`` enforce them inside the tasks; a violation reaches the
driver as a typed ``ConstraintViolationError`` (raised by the DML, recovered with
``spark_adapter.errors.recover_error`` from a ``save()``/streaming failure); nothing is
committed and no data file is left behind."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException, StreamingQueryException

from eventlog import ConstraintViolationError, InvalidInputError, NotNullViolationError, Table
from spark_adapter import EventlogTable
from spark_adapter.errors import recover_error

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SPARK_ERRORS = (PySparkException, Py4JJavaError)
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us", "UTC")),
        pa.field("x", pa.int64()),
        pa.field("d", pa.date32(), metadata={"delta.generationExpression": "CAST(ts AS DATE)"}),
    ]
)


def _data_files(uri: str) -> list[str]:
    out = []
    for directory, dirs, names in os.walk(uri):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        out += [os.path.join(directory, n) for n in names if n.endswith(".parquet")]
    return sorted(out)


def _state(uri: str) -> tuple[int, list[str], list[str]]:
    with Table.open(uri) as t:
        return t.refresh().version, sorted(t.files()), _data_files(uri)


def _table(path: str) -> None:
    t = Table.create(path, SCHEMA, partition_by=["d"])
    t.append(pa.table({"id": [1, 2], "ts": pa.array([dt.datetime(2024, 1, 1, 5), dt.datetime(2024, 1, 2, 5)],
                                                     pa.timestamp("us", "UTC")), "x": [1, 2]}))  # fmt: skip
    t.add_constraint("pos", "x > 0")


def _df(spark: Any, rows: list[tuple[int, str, int | None]]) -> Any:
    return spark.createDataFrame(rows, "id LONG, ts STRING, x LONG").selectExpr(
        "id", "CAST(ts AS TIMESTAMP) AS ts", "x"
    )


def test_batch_writer_computes_generated_columns_and_enforces_constraints(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path)
    _df(spark, [(3, "2024-01-03 10:00:00", 3)]).write.format("eventlog").mode("append").save(path)
    with Table.open(path) as t:
        row = t.to_arrow(filter="id = 3").to_pylist()[0]
    assert row["d"] == dt.date(2024, 1, 3)
    before = _state(path)
    bad = _df(spark, [(4, "2024-01-04 10:00:00", 4), (5, "2024-01-05 10:00:00", -5)]).repartition(2)
    with pytest.raises(SPARK_ERRORS) as err:
        bad.write.format("eventlog").mode("append").save(path)
    typed = recover_error(err.value)
    assert isinstance(typed, ConstraintViolationError)
    assert (typed.constraint, typed.expression, typed.count, typed.values) == ("pos", "x > 0", 1, {"x": -5})
    assert _state(path) == before
    with pytest.raises(SPARK_ERRORS) as err:  # a supplied generated value must match
        _df(spark, [(6, "2024-01-06 10:00:00", 6)]).selectExpr("*", "DATE'2000-01-01' AS d").write.format(
            "eventlog"
        ).mode("append").save(path)
    typed = recover_error(err.value)
    assert isinstance(typed, ConstraintViolationError) and typed.constraint == "Generated Column"
    with pytest.raises(SPARK_ERRORS) as err:  # NOT NULL
        _df(spark, [(7, "2024-01-07 10:00:00", 7)]).selectExpr(
            "CAST(NULL AS LONG) AS id", "ts", "x"
        ).write.format("eventlog").mode("append").save(path)
    assert isinstance(recover_error(err.value), NotNullViolationError)
    assert _state(path) == before


def test_dml_raises_the_typed_error(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path)
    handle = EventlogTable.forPath(spark, path)
    before = _state(path)
    with pytest.raises(ConstraintViolationError) as err:
        handle.update("id = 1", {"x": "x - 5"})
    assert (err.value.constraint, err.value.values, err.value.count) == ("pos", {"x": -4}, 1)
    source = spark.createDataFrame([(2, -2), (9, -9)], "id LONG, x LONG")
    with pytest.raises(ConstraintViolationError):
        handle.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdate(
            set={"x": "s.x"}
        ).execute()
    assert _state(path) == before


def test_dml_recomputes_generated_columns(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path)
    handle = EventlogTable.forPath(spark, path)
    handle.update("id = 1", {"ts": "TIMESTAMP'2023-03-04 05:06:07'"})
    source = spark.createDataFrame(
        [(2, "2022-02-02 00:00:00", 20), (9, "2021-01-01 12:00:00", 9)], "id LONG, ts STRING, x LONG"
    )
    (
        handle.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdate(set={"ts": "CAST(s.ts AS TIMESTAMP)", "x": "s.x"})
        .whenNotMatchedInsert(values={"id": "s.id", "ts": "CAST(s.ts AS TIMESTAMP)", "x": "s.x"})
        .execute()
    )
    with Table.open(path) as t:
        got = {r["id"]: (r["d"], r["x"]) for r in t.to_arrow().to_pylist()}
    assert got == {
        1: (dt.date(2023, 3, 4), 1),
        2: (dt.date(2022, 2, 2), 20),
        9: (dt.date(2021, 1, 1), 9),
    }
    handle.dropConstraint("POS")
    with pytest.raises(InvalidInputError):
        handle.dropConstraint("pos")
    handle.dropConstraint("pos", ifExists=True)
    handle.addConstraint("small", "x < 100")
    with Table.open(path) as t:
        assert t.refresh().properties == {"delta.constraints.small": "x < 100"}


def test_streaming_sink_enforces_constraints_in_its_tasks(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path)
    source = tmp_path / "in"
    source.mkdir()

    def add(name: str, ids: list[int], xs: list[int]) -> None:
        table = pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array(["2024-02-01 01:00:00"] * len(ids)),
                          "x": pa.array(xs, pa.int64())})  # fmt: skip
        pq.write_table(table, tmp_path / f".{name}")
        os.replace(tmp_path / f".{name}", source / name)

    def run() -> BaseException | None:
        """Run the query to the end: the error it failed with, or None."""
        stream = spark.readStream.schema("id LONG, ts STRING, x LONG").parquet(str(source))
        query = (
            stream.selectExpr("id", "CAST(ts AS TIMESTAMP) AS ts", "x")
            .writeStream.format("eventlog")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start(path)
        )
        try:
            assert query.awaitTermination(120)
        except StreamingQueryException as exc:
            return exc
        finally:
            query.stop()
        return None

    add("a.parquet", [10, 11], [10, 11])
    assert run() is None
    with Table.open(path) as t:
        assert sorted(t.to_arrow(filter="id >= 10").column("d").to_pylist()) == [dt.date(2024, 2, 1)] * 2
    before = _state(path)
    add("b.parquet", [12, 13], [12, -13])
    failed = run()
    assert failed is not None
    typed = recover_error(failed)
    assert isinstance(typed, ConstraintViolationError) and typed.values == {"x": -13}
    assert _state(path) == before
