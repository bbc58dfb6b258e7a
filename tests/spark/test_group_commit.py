"""Group commit from Spark: the ``groupCommit`` writer option (see eventlog.txn.groupcommit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from eventlog import Table
from eventlog.log.commit import GROUP_FIELD, member_txn_ids
from tests.support.spark import write_from_four_threads

pytestmark = pytest.mark.spark

FMT = "eventlog"
SPARK_ERRORS = (PySparkException, Py4JJavaError)


def _ids(spark: Any, uri: str) -> list[int]:
    return sorted(r.id for r in spark.read.format(FMT).load(uri).select("id").collect())


def test_group_commit_option_from_four_driver_threads(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "grouped")
    spark.createDataFrame([(-1, -1)], "id bigint, writer int").write.format(FMT).mode("append").save(uri)
    written = write_from_four_threads(spark, uri, groupCommit="true")
    table = Table.open(uri)
    history = sorted(table.history(), key=lambda h: h["version"])
    assert [h["version"] for h in history] == list(range(len(history)))  # contiguous
    # Eight acknowledged writes, each carried exactly once, in at most eight versions (how
    # many share one depends on how the jobs' commits overlap: often none on 2 cores).
    carried = [txn for h in history[1:] for txn in member_txn_ids(h)]
    assert len(carried) == len(set(carried)) == 8
    assert 2 <= len(history) <= 9
    for h in history[1:]:
        members = h.get(GROUP_FIELD)
        if members:  # a group lists each Spark write with its own metrics
            assert all(
                m["operation"] == "WRITE" and m["operationMetrics"]["numOutputRows"] == "5" for m in members
            )
            assert h["operationMetrics"]["numOutputRows"] == str(5 * len(members))
    assert _ids(spark, uri) == sorted([-1, *written])


def test_group_commit_option_must_be_a_boolean(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "bad")
    df = spark.createDataFrame([(1, 1)], "id bigint, writer int")
    df.write.format(FMT).mode("append").save(uri)
    with pytest.raises(SPARK_ERRORS, match="option groupCommit must be true or false"):
        df.write.format(FMT).mode("append").option("groupCommit", "sometimes").save(uri)
    assert Table.open(uri).version == 0
