"""SQL on eventlog tables: :func:`sql` runs a statement, as ``spark.sql`` would if Spark
knew our tables.

Statements on our tables (``eventlog.`/path```, ``delta.`/path```, or a name created with
``CREATE TABLE name ... USING eventlog LOCATION '...'``) run as our operations, as Spark
jobs; every other statement goes to ``spark.sql`` unchanged. What runs:

* ``SELECT`` (any query: joins, subqueries, views) reading our tables, with ``VERSION AS
  OF n`` / ``TIMESTAMP AS OF '...'``;
* ``INSERT INTO`` / ``INSERT OVERWRITE`` (``VALUES`` or a query, an optional column list),
  and ``INSERT INTO t REPLACE WHERE predicate SELECT ...``;
* ``DELETE FROM``, ``UPDATE ... SET ... [WHERE]``, ``MERGE INTO ... USING ... ON ...``
  with ``WHEN MATCHED [AND c] THEN UPDATE SET ... | UPDATE SET * | DELETE`` and ``WHEN NOT
  MATCHED [BY TARGET] [AND c] THEN INSERT (...) VALUES (...) | INSERT *``;
* ``CREATE TABLE [IF NOT EXISTS] ... USING eventlog [PARTITIONED BY | CLUSTER BY]
  [LOCATION] [TBLPROPERTIES]``, and ``CREATE TABLE ... AS SELECT``; ``DROP TABLE name``
  forgets a name (the table stays where it is, as Delta's external tables);
* ``ALTER TABLE``: ``SET``/``UNSET TBLPROPERTIES``, ``ADD COLUMNS``, ``RENAME COLUMN``,
  ``DROP COLUMN(S)``, ``ADD CONSTRAINT ... CHECK``, ``DROP CONSTRAINT``, ``DROP FEATURE
  [TRUNCATE HISTORY]``, ``CLUSTER BY``;
* ``OPTIMIZE [WHERE] [ZORDER BY]``, ``REORG TABLE ... APPLY (PURGE)``, ``VACUUM [RETAIN n
  HOURS] [DRY RUN]``, ``RESTORE TABLE ... TO VERSION|TIMESTAMP AS OF``, ``DESCRIBE
  HISTORY [LIMIT n]``, ``DESCRIBE DETAIL``, ``SHOW TBLPROPERTIES``.

Parsing is sqlglot's (Spark dialect, never lenient) where it gives structured statements,
and :mod:`spark_adapter.sql.grammar` where it does not. A statement on our table that
cannot run raises :class:`~spark_adapter.errors.UnsupportedStatementError` (fields
``statement`` and ``reason``) before anything is written; the operations raise what the
table API raises (``ConcurrentAppendException``, ``ConstraintViolationError``...).

:func:`install` makes it the session's ``spark.sql``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import sqlglot
from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp
from sqlglot.errors import ParseError

from eventlog.errors import EventlogError
from spark_adapter.errors import UnsupportedStatementError, recover_error
from spark_adapter.sql import ddl, dml
from spark_adapter.sql.grammar import parse_maintenance
from spark_adapter.sql.names import Catalog, table_name

__all__ = ["install", "sql", "uninstall"]

_ORIGINAL = "_eventlog_original_sql"


def sql(spark: SparkSession, statement: str, *args: Any, **kwargs: Any) -> DataFrame:
    """Run one SQL statement (see the module docstring); ``args``/``kwargs`` (parameter
    markers) go to ``spark.sql`` for statements that are not ours."""
    with _typed_errors():
        return _run(spark, statement, args, kwargs)


@contextlib.contextmanager
def _typed_errors() -> Iterator[None]:
    """A Spark job failure that carries an eventlog error raises that error (chained)."""
    try:
        yield
    except EventlogError:
        raise
    except Exception as exc:
        typed = recover_error(exc)
        if typed is None:
            raise
        raise typed from exc


def _run(spark: SparkSession, statement: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DataFrame:
    passthrough = getattr(spark, _ORIGINAL, None) or spark.sql
    catalog = Catalog(spark)
    ours = parse_maintenance(statement)
    if ours is not None:
        if catalog.resolve(ours.table) is None:
            return passthrough(statement, *args, **kwargs)  # a Delta or other table: Spark's
        _no_parameters(statement, args, kwargs)
        return ddl.maintenance(spark, catalog, ours, statement)
    try:
        trees = sqlglot.parse(statement, dialect="spark", error_level=sqlglot.ErrorLevel.RAISE)
    except ParseError:
        return passthrough(statement, *args, **kwargs)  # not ours to judge: Spark reports it
    if len(trees) != 1 or trees[0] is None:
        return passthrough(statement, *args, **kwargs)
    tree = cast(exp.Expression, trees[0])
    if not _touches_ours(catalog, tree):
        return passthrough(statement, *args, **kwargs)
    _no_parameters(statement, args, kwargs)
    if isinstance(tree, exp.Insert):
        return dml.insert(spark, catalog, tree, statement)
    if isinstance(tree, exp.Delete):
        return dml.delete(spark, catalog, tree, statement)
    if isinstance(tree, exp.Update):
        return dml.update(spark, catalog, tree, statement)
    if isinstance(tree, exp.Merge):
        return dml.merge(spark, catalog, tree, statement)
    if isinstance(tree, exp.Create):
        return ddl.create(spark, catalog, tree, statement)
    if isinstance(tree, exp.Alter):
        return ddl.alter(spark, catalog, tree, statement)
    if isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() == "TABLE":
        return ddl.drop_table(spark, catalog, tree, statement)
    if isinstance(tree, exp.Query):
        return dml.select(spark, catalog, cast(exp.Expression, tree), statement)
    raise UnsupportedStatementError(
        statement, f"{tree.key.upper()} statements are not supported on eventlog tables"
    )


def _touches_ours(catalog: Catalog, tree: exp.Expression) -> bool:
    """Whether the statement names one of our tables, or creates one (``USING eventlog``)."""
    if isinstance(tree, exp.Create):
        props = tree.args.get("properties")
        for prop in props.expressions if props is not None else ():
            if (
                isinstance(prop, exp.FileFormatProperty)
                and prop.this.sql("spark").strip("`").lower() == "eventlog"
            ):
                return True
    return any(catalog.resolve(table_name(t)) is not None for t in tree.find_all(exp.Table) if t.name)


def _no_parameters(statement: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if args or kwargs:
        raise UnsupportedStatementError(statement, "parameter markers are not supported on eventlog tables")


def install(spark: SparkSession) -> None:
    """Make :func:`sql` the session's ``spark.sql`` (``uninstall`` restores Spark's)."""
    if getattr(spark, _ORIGINAL, None) is not None:
        return
    original = spark.sql
    object.__setattr__(spark, _ORIGINAL, original)
    object.__setattr__(spark, "sql", lambda statement, *a, **k: sql(spark, statement, *a, **k))


def uninstall(spark: SparkSession) -> None:
    original = getattr(spark, _ORIGINAL, None)
    if original is None:
        return
    object.__delattr__(spark, "sql")
    object.__delattr__(spark, _ORIGINAL)
