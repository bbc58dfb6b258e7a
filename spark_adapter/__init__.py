"""PySpark glue for :mod:`eventlog` tables: the ``eventlog`` Python data source.

``df.write.format("eventlog").mode("append"|"overwrite").save(uri)`` and
``spark.read.format("eventlog").load(uri)`` work without registering anything: Spark
auto-registers ``pyspark_eventlog.DefaultSource`` (:class:`EventlogDataSource`) in every
session. Options are listed in :mod:`spark_adapter.datasource` (object stores: ``storage.<name>`` and
``storageOptions`` carry fsspec storage options to every task); partition pruning and
file skipping by pushed filters are opt-in (``filterPushdown=true``, see
:mod:`spark_adapter.reader` for the pyspark 4.2 plan-caching bug that makes them unsafe by
default).

Threads: pyspark 4.2 resolves Python data sources through the JVM thread's *active*
session. A thread has one once it called ``spark.createDataFrame`` (or
``activate(spark)``); a thread that only calls ``spark.read`` / ``spark.range`` first
gets ``DATA_SOURCE_NOT_FOUND`` for *every* Python data source until it does.

Importing this package does not import pyspark (it is an optional dependency): the names
below load their modules on first use. Never imports ``kazoo`` (import-linter contract).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_adapter.datasource import EventlogDataSource, activate
    from spark_adapter.native import read_table
    from spark_adapter.reader import EventlogReader, FilesPartition, PruningReader, ScanSource
    from spark_adapter.s3a import s3a_jars
    from spark_adapter.table import EventlogTable
    from spark_adapter.writer import EventlogCommitMessage, EventlogWriter, WritePlan

_EXPORTS = {
    "EventlogTable": "spark_adapter.table",
    "EventlogDataSource": "spark_adapter.datasource",
    "activate": "spark_adapter.datasource",
    "read_table": "spark_adapter.native",
    "s3a_jars": "spark_adapter.s3a",
    "EventlogReader": "spark_adapter.reader",
    "FilesPartition": "spark_adapter.reader",
    "PruningReader": "spark_adapter.reader",
    "ScanSource": "spark_adapter.reader",
    "EventlogCommitMessage": "spark_adapter.writer",
    "EventlogWriter": "spark_adapter.writer",
    "WritePlan": "spark_adapter.writer",
}

__all__ = [
    "EventlogCommitMessage",
    "EventlogDataSource",
    "EventlogReader",
    "EventlogTable",
    "EventlogWriter",
    "FilesPartition",
    "PruningReader",
    "ScanSource",
    "WritePlan",
    "activate",
    "read_table",
    "s3a_jars",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_adapter' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
