"""Auto-registration of ``format("eventlog")`` in every SparkSession.

Spark imports top-level modules whose name starts with ``pyspark_`` (found on the Python
workers' path) on its first data source lookup and registers their ``DefaultSource``.
pyspark 4.2 looks registered sources up in the JVM thread's active session, so a new
driver thread needs ``spark_adapter.activate(spark)`` (or a ``spark.createDataFrame``
call) before its first ``format("eventlog")``.
"""

from spark_adapter.datasource import EventlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
