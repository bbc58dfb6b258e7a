"""The test run's single SparkSession (starting one costs ~10 s; tests share it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def local_session(app_name: str, **config: str) -> Iterator[Any]:
    """A local[2] SparkSession for a test run (UI off, UTC, 1 GiB driver, errors-only logs)
    with ``config`` on top; stopped on exit."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
    )
    # The warehouse (catalog tables, spark_adapter.sql's names) in a directory of the run's
    # own, not the working directory's spark-warehouse.
    warehouse = tempfile.mkdtemp(prefix="eventlog-warehouse-")
    builder = builder.config("spark.sql.warehouse.dir", warehouse)
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        shutil.rmtree(warehouse, ignore_errors=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with Python filter pushdown enabled (needs Java 17), and S3A
    (``hadoop-aws`` and the AWS SDK, resolved by ``scripts/bootstrap_s3a.sh``) on its
    classpath, so ``s3://`` tables are scanned natively (``tests/spark/test_native_s3.py``)."""
    from spark_adapter import s3a_jars

    with local_session(
        "eventlog-tests",
        **{
            "spark.sql.python.filterPushdown.enabled": "true",
            "spark.sql.shuffle.partitions": "4",
            "spark.jars": ",".join(s3a_jars()),
        },
    ) as session:
        yield session


def write_from_four_threads(spark: Any, uri: str, **options: str) -> list[int]:
    """Four driver threads append two 5-row DataFrames each (``id bigint, writer int``) to
    ``uri`` with ``options``, started together; returns the ids written, sorted. Raises the
    first error a thread hit."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def writer(w: int) -> None:
        try:
            # createDataFrame makes the session active in this JVM thread, which is what
            # pyspark 4.2 looks Python data sources up in; nothing is registered here.
            frames = [
                spark.createDataFrame([(w * 100 + k * 10 + j, w) for j in range(5)], "id bigint, writer int")
                for k in range(2)
            ]
            barrier.wait()
            for df in frames:
                df.write.format("eventlog").mode("append").options(**options).save(uri)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a writer thread hung"
    return sorted(w * 100 + k * 10 + j for w in range(4) for k in range(2) for j in range(5))
