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
  MATCHED [BY TARGET] [AND c] THEN INSERT (...) VALUES (...) | INSERT *`` and ``WHEN NOT
  MATCHED BY SOURCE [AND c] THEN UPDATE SET ... | DELETE``;
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
from collections.abc import Callable, Iterator
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

__all__ = ["install", "refresh", "sql", "uninstall"]

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
    passthrough = _spark_sql(spark)
    catalog = Catalog(spark)
    ours = parse_maintenance(statement)
    if ours is not None:
        if catalog.resolve(ours.table) is None:
            return passthrough(statement, *args, **kwargs)  # a Delta or other table: Spark's
        _no_parameters(statement, args, kwargs)
        out = ddl.maintenance(spark, catalog, ours, statement)
        _refresh_names(spark, catalog, [ours.table.name])
        return out
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
    if isinstance(tree, exp.Query):
        return dml.select(spark, catalog, tree, statement)
    if isinstance(tree, (exp.Create, exp.Alter, exp.Drop)):
        return _definition(spark, catalog, tree, statement)
    if isinstance(tree, exp.Insert):
        out = dml.insert(spark, catalog, tree, statement)
    elif isinstance(tree, exp.Delete):
        out = dml.delete(spark, catalog, tree, statement)
    elif isinstance(tree, exp.Update):
        out = dml.update(spark, catalog, tree, statement)
    elif isinstance(tree, exp.Merge):
        out = dml.merge(spark, catalog, tree, statement)
    else:
        raise UnsupportedStatementError(
            statement, f"{tree.key.upper()} statements are not supported on eventlog tables"
        )
    _refresh_names(spark, catalog, [table_name(t).name for t in tree.find_all(exp.Table) if t.name])
    return out


def _refresh_names(spark: SparkSession, catalog: Catalog, names: list[str | None]) -> None:
    """The views of the registered names a statement wrote to show its commit."""
    for name in dict.fromkeys(n for n in names if n is not None):
        location = catalog.location(name)
        if location is not None:
            catalog.refresh_view(name, location, _spark_sql(spark))


def _spark_sql(spark: SparkSession) -> Callable[..., DataFrame]:
    """Spark's own ``spark.sql`` (also when :func:`install` replaced it)."""
    original: Callable[..., DataFrame] | None = getattr(spark, _ORIGINAL, None)
    return original or spark.sql


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


def _definition(spark: SparkSession, catalog: Catalog, tree: exp.Expression, statement: str) -> DataFrame:
    """CREATE, ALTER and DROP TABLE; then the name's view follows the table (its columns)."""
    target = tree.this if not isinstance(tree, exp.Drop) else (tree.args.get("tables") or [None])[0]
    if isinstance(target, exp.Schema):
        target = target.this
    if isinstance(tree, exp.Create):
        out = ddl.create(spark, catalog, tree, statement)
    elif isinstance(tree, exp.Alter):
        out = ddl.alter(spark, catalog, tree, statement)
    elif isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() == "TABLE":
        out = ddl.drop_table(spark, catalog, tree, statement)
    else:
        raise UnsupportedStatementError(statement, f"DROP {tree.args.get('kind')} is not supported")
    name = table_name(target).name if isinstance(target, exp.Table) else None
    if name is not None:
        catalog.refresh_view(name, catalog.location(name), _spark_sql(spark))
    return out


def _no_parameters(statement: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if args or kwargs:
        raise UnsupportedStatementError(statement, "parameter markers are not supported on eventlog tables")


def install(spark: SparkSession) -> None:
    """Make :func:`sql` the session's ``spark.sql`` (``uninstall`` restores Spark's), and
    give each registered table name of the current database a temporary view, so that code
    that calls Spark's SQL directly reads the tables by name too."""
    if getattr(spark, _ORIGINAL, None) is not None:
        return
    original = spark.sql
    object.__setattr__(spark, _ORIGINAL, original)
    object.__setattr__(spark, "sql", lambda statement, *a, **k: sql(spark, statement, *a, **k))
    refresh(spark)


def refresh(spark: SparkSession) -> None:
    """Refresh the temporary view of every registered table name of the current database
    (plain ``spark.sql`` then reads each table's latest version by its name)."""
    catalog = Catalog(spark)
    for view, location in catalog.views().items():
        catalog.refresh_view(view, location, _spark_sql(spark))


def uninstall(spark: SparkSession) -> None:
    original = getattr(spark, _ORIGINAL, None)
    if original is None:
        return
    object.__delattr__(spark, "sql")
    object.__delattr__(spark, _ORIGINAL)
