"""Auto-registration of ``format("eventlog")`` in every SparkSession and thread.

Spark imports top-level modules whose name starts with ``pyspark_`` on its first data
source lookup and registers their ``DefaultSource``.
"""

from spark_adapter.datasource import EventlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
