"""What the adapter needs from a SparkSession, for classic sessions and Spark Connect alike.

A Spark Connect client has no JVM: ``spark._jvm``, ``sparkContext`` (``parallelize``,
``broadcast``, ``setJobDescription``, ``defaultParallelism``...) and ``df._jdf`` raise
``JVM_ATTRIBUTE_NOT_SUPPORTED`` there. The helpers here keep the classic calls on classic
sessions (same jobs, same task counts) and use DataFrame-only equivalents on Connect.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from eventlog import expr as ex

__all__ = [
    "connect_alias",
    "connect_column_sql",
    "default_parallelism",
    "is_connect",
    "is_connect_column",
    "job_description",
    "spread",
]

_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9._:/=-]+")
_parallelism: dict[str, int] = {}  # Connect session id -> its default parallelism


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM on this side)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # the connect extra is not installed: no Connect session can exist
        return False
    return isinstance(spark, ConnectSession)


def default_parallelism(spark: SparkSession) -> int:
    """``sparkContext.defaultParallelism``; on Connect, the partition count of a
    ``spark.range`` without one (Spark gives it ``defaultParallelism`` slices), measured
    once per session by a tiny job."""
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    key = str(cast(Any, spark).session_id)
    if key not in _parallelism:
        ids = spark.range(0, 1 << 20).select(F.spark_partition_id().alias("p"))
        row = ids.agg(F.max("p").alias("p")).first()
        _parallelism[key] = max(1, int(row["p"]) + 1) if row is not None and row["p"] is not None else 1
    return _parallelism[key]


def spread(
    spark: SparkSession, rows: Sequence[tuple[Any, ...]], schema: StructType, slices: int
) -> DataFrame:
    """``rows`` as a DataFrame of ``slices`` partitions (``sparkContext.parallelize`` on a
    classic session). On Connect: the local rows, gathered into one partition and dealt
    round-robin into ``slices`` (a repartition by number, which adaptive execution leaves
    alone), so ``slices == len(rows)`` still puts exactly one row in each task."""
    slices = max(1, slices)
    if not is_connect(spark):
        return spark.createDataFrame(spark.sparkContext.parallelize(list(rows), slices), schema)
    return spark.createDataFrame(list(rows), schema).coalesce(1).repartition(slices)


@contextlib.contextmanager
def job_description(spark: SparkSession, text: str) -> Iterator[None]:
    """Label the Spark jobs run inside: the job description (Spark UI) on a classic session;
    on Connect, an operation tag (``spark.addTag``: listed with the jobs, usable with
    ``spark.interruptTag``) made of ``text``'s safe characters."""
    if not is_connect(spark):
        sc: Any = spark.sparkContext
        sc.setJobDescription(text)
        try:
            yield
        finally:
            sc.setJobDescription(None)  # None is what clears the JVM-side local property
        return
    tag = _TAG_UNSAFE.sub("_", text).strip("_")[:200] or "eventlog"
    spark.addTag(tag)
    try:
        yield
    finally:
        spark.removeTag(tag)


def connect_alias(df: DataFrame) -> str | None:
    """The name given with ``df.alias(name)`` when that is a Connect DataFrame's last step
    (its client-side plan is a ``SubqueryAlias``)."""
    from pyspark.sql.connect.plan import SubqueryAlias

    plan = getattr(df, "_plan", None)
    return str(plan._alias) if isinstance(plan, SubqueryAlias) else None


def connect_column_sql(column: Any) -> str | None:
    """SQL text of a Connect Column, rendered from its client-side (unresolved) expression:
    column references as written, literals, ``SQL`` snippets (``F.expr``), casts, the
    comparison/boolean/arithmetic operators, ``IS [NOT] NULL``, ``IN`` and plain function
    calls; None for anything else (callers then treat the condition as opaque: Spark
    evaluates the Column itself and the scan reads the whole table). On a classic session
    the analyzer's own SQL is used instead (:func:`spark_adapter.ops.jobs.condition_sql`)."""
    expr = getattr(column, "_expr", None)
    try:
        return None if expr is None else _expr_sql(expr)
    except _NoSql:
        return None


class _NoSql(Exception):
    """An expression with no SQL rendering here."""


_BINARY = {
    "==": "=", "<=>": "<=>", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "and": "AND", "or": "OR",
    "+": "+", "-": "-", "*": "*", "/": "/", "%": "%", "like": "LIKE", "rlike": "RLIKE",
}  # fmt: skip


def _expr_sql(expr: Any) -> str:
    from pyspark.sql.connect import expressions as E

    if isinstance(expr, E.ColumnReference):
        return str(expr._unparsed_identifier)
    if isinstance(expr, E.SQLExpression):
        return f"({expr._expr})"
    if isinstance(expr, E.LiteralExpression):
        return _literal_sql(expr._value, expr._dataType)
    if isinstance(expr, E.CastExpression):
        t = expr._data_type
        return f"CAST({_expr_sql(expr._expr)} AS {t if isinstance(t, str) else t.simpleString()})"
    if isinstance(expr, E.UnresolvedFunction) and not expr._is_distinct:
        name, args = str(expr._name), [_expr_sql(a) for a in expr._args]
        if name in _BINARY and len(args) == 2:
            return f"({args[0]} {_BINARY[name]} {args[1]})"
        if name == "not" and len(args) == 1:
            return f"(NOT {args[0]})"
        if name == "negative" and len(args) == 1:
            return f"(- {args[0]})"
        if name in ("isNull", "isNotNull") and len(args) == 1:
            return f"({args[0]} IS {'NOT ' if name == 'isNotNull' else ''}NULL)"
        if name == "in" and len(args) >= 2:
            return f"({args[0]} IN ({', '.join(args[1:])}))"
        if name.replace("_", "").isalnum():
            return f"{name}({', '.join(args)})"
    raise _NoSql(type(expr).__name__)


def _literal_sql(value: Any, data_type: Any) -> str:
    """A literal as eventlog's SQL renders it (Connect keeps dates as days and timestamps
    as microseconds since the epoch, typed by ``data_type``)."""
    from pyspark.sql import types as T

    if value is None:
        return "NULL"
    if isinstance(data_type, T.DateType) and isinstance(value, int):
        value = dt.date(1970, 1, 1) + dt.timedelta(days=value)
    elif isinstance(data_type, T.TimestampType | T.TimestampNTZType) and isinstance(value, int):
        value = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=value)
    if isinstance(value, float) and not math.isfinite(value):
        raise _NoSql(repr(value))
    if not isinstance(value, bool | int | float | decimal.Decimal | str | dt.date):
        raise _NoSql(type(value).__name__)
    return ex.to_sql(ex.Literal(value))


def is_connect_column(column: Any) -> bool:
    """Whether ``column`` is a Spark Connect Column (no ``_jc`` behind it)."""
    try:
        from pyspark.sql.connect.column import Column as ConnectColumn
    except ImportError:
        return False
    return isinstance(column, ConnectColumn)
