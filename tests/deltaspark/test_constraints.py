"""CHECK constraints and generated columns both ways with Delta Spark: tables where Delta Spark
added them are read and written by us with enforcement; tables where we added them are
written by Delta Spark, which enforces them too, and its DESCRIBE DETAIL / SHOW TBLPROPERTIES
show them."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from eventlog import ConstraintViolationError, Table
from tests.deltaspark.peer import delta_arrow, delta_detail, delta_history, same_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SPARK_ERRORS = (PySparkException, Py4JJavaError)


def _state(t: Table) -> tuple[int, list[str], list[str]]:
    files = sorted(
        str(p.relative_to(t.uri)) for p in Path(t.uri).rglob("*.parquet") if "_delta_log" not in p.parts
    )
    return t.refresh().version, sorted(t.files()), files


def _error_text(err: BaseException) -> str:
    if isinstance(err, Py4JJavaError):
        return str(err.java_exception.toString())
    return str(err)


def test_we_enforce_what_delta_spark_added(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "theirs")
    t_sql = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t_sql} (id BIGINT, ts TIMESTAMP, d DATE GENERATED ALWAYS AS (CAST(ts AS DATE)),"
        " v STRING) USING delta PARTITIONED BY (d)"
    )
    spark.sql(f"ALTER TABLE {t_sql} ADD CONSTRAINT id_pos CHECK (id > 0 AND length(v) < 5)")
    spark.sql(f"INSERT INTO {t_sql} (id, ts, v) VALUES (1, TIMESTAMP'2024-01-01 10:00:00', 'a')")
    table = Table.open(path)
    snap = table.refresh()
    assert snap.properties["delta.constraints.id_pos"] == "id > 0 AND length ( v ) < 5"  # Delta's spelling
    before = _state(table)
    utc = pa.timestamp("us", "UTC")
    with pytest.raises(ConstraintViolationError) as err:
        stamps = pa.array([dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 3)], utc)
        table.append(pa.table({"id": [2, -3], "ts": stamps, "v": ["b", "c"]}))
    assert (err.value.constraint, err.value.values) == ("id_pos", {"id": -3, "v": "c"})
    with pytest.raises(ConstraintViolationError) as err:
        table.append(pa.table({"id": [4], "ts": pa.array([dt.datetime(2024, 1, 4)], utc),
                               "d": [dt.date(2020, 1, 1)], "v": ["d"]}))  # fmt: skip
    assert err.value.constraint == "Generated Column"
    assert _state(table) == before
    table.append(pa.table({"id": [5], "ts": pa.array([dt.datetime(2024, 1, 5, 23)], utc), "v": ["e"]}))
    theirs = delta_arrow(spark, path)
    got, want = same_rows(table.to_arrow(), theirs)
    assert got == want
    assert {r["id"]: r["d"] for r in theirs.to_pylist()} == {1: dt.date(2024, 1, 1), 5: dt.date(2024, 1, 5)}
    assert delta_history(spark, path)[0] == (table.version, "WRITE")
    # and Delta Spark goes on writing after us, its constraint intact
    with pytest.raises(SPARK_ERRORS) as jerr:
        spark.sql(f"INSERT INTO {t_sql} (id, ts, v) VALUES (-1, TIMESTAMP'2024-01-06 00:00:00', 'f')")
    assert "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES" in _error_text(jerr.value)


def test_delta_spark_enforces_what_we_added(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "ours")
    t_sql = f"delta.`{path}`"
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("ts", pa.timestamp("us", "UTC")),
            pa.field("d", pa.date32(), metadata={"delta.generationExpression": "CAST(ts AS DATE)"}),
        ]
    )
    table = Table.create(path, schema, partition_by=["d"])
    table.append(
        pa.table({"id": [1], "ts": pa.array([dt.datetime(2024, 3, 1, 8)], pa.timestamp("us", "UTC"))})
    )
    table.add_constraint("id_small", "id < 100")
    detail = delta_detail(spark, path)
    assert {"checkConstraints", "generatedColumns"} <= set(detail["tableFeatures"])
    props = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {t_sql}").collect()}
    assert props["delta.constraints.id_small"] == "id < 100"
    before = _state(table)
    with pytest.raises(SPARK_ERRORS) as err:
        spark.sql(f"INSERT INTO {t_sql} (id, ts) VALUES (500, TIMESTAMP'2024-03-02 00:00:00')")
    assert "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES" in _error_text(err.value)
    with pytest.raises(SPARK_ERRORS) as err:  # NULL fails a CHECK in Delta too, before NOT NULL
        spark.sql(f"INSERT INTO {t_sql} (id, ts) VALUES (NULL, TIMESTAMP'2024-03-02 00:00:00')")
    assert "CHECK constraint id_small (id < 100) violated by row with values:\n - id : null" in _error_text(
        err.value
    )
    with pytest.raises(SPARK_ERRORS) as err:  # a supplied generated value that differs
        spark.sql(f"INSERT INTO {t_sql} VALUES (7, TIMESTAMP'2024-03-02 00:00:00', DATE'2000-01-01')")
    assert "Generated Column" in _error_text(err.value)
    assert _state(table) == before
    spark.sql(f"INSERT INTO {t_sql} (id, ts) VALUES (2, TIMESTAMP'2024-03-02 10:00:00')")
    got = {r["id"]: r["d"] for r in table.to_arrow().to_pylist()}
    assert got == {1: dt.date(2024, 3, 1), 2: dt.date(2024, 3, 2)}
    # Delta Spark's partition directory for its row follows the generated value
    assert any(p.startswith("d=2024-03-02") for p in table.files())
    spark.sql(f"ALTER TABLE {t_sql} DROP CONSTRAINT id_small")
    with pytest.raises(SPARK_ERRORS) as err:  # our NOT NULL column
        spark.sql(f"INSERT INTO {t_sql} (id, ts) VALUES (NULL, TIMESTAMP'2024-03-02 00:00:00')")
    assert "DELTA_NOT_NULL_CONSTRAINT_VIOLATED" in _error_text(err.value)
    table.append(pa.table({"id": [500], "ts": pa.array([None], pa.timestamp("us", "UTC"))}))
    assert sorted(r["id"] for r in delta_arrow(spark, path).to_pylist()) == [1, 2, 500]
    assert os.path.isdir(path)
