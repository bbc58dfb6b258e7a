"""Reads and row-level writes in SQL on our tables, run as the table API runs them:
SELECT (with ``VERSION AS OF`` / ``TIMESTAMP AS OF``), INSERT INTO / INSERT OVERWRITE
(``REPLACE WHERE``), DELETE, UPDATE and MERGE INTO. Each returns what Delta's SQL returns
(the affected row counts for DML; the rows for SELECT; an empty result for INSERT)."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType
from sqlglot import exp

from eventlog.txn.transaction import CommitResult
from spark_adapter.errors import UnsupportedStatementError
from spark_adapter.sql.names import Catalog, table_name, with_views
from spark_adapter.table import EventlogTable
from spark_adapter.types import arrow_to_spark_schema

__all__ = ["delete", "insert", "merge", "select", "update"]

_COUNT = StructType([StructField("num_affected_rows", LongType())])
_MERGE = StructType(
    [
        StructField(n, LongType())
        for n in ("num_affected_rows", "num_updated_rows", "num_deleted_rows", "num_inserted_rows")
    ]
)


def _sql(node: exp.Expression) -> str:
    return node.sql(dialect="spark")


def _metric(result: CommitResult, *names: str) -> int:
    return sum(int(result.metrics.get(n, 0) or 0) for n in names)


def _unqualified(node: exp.Expression, qualifiers: set[str]) -> exp.Expression:
    """``node`` with column qualifiers that name the target table (its alias, or its name)
    removed: DELETE and UPDATE conditions are evaluated on the table's own rows."""

    def strip(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.table and n.table.lower() in qualifiers:
            return exp.Column(this=n.this)
        return n

    return node.copy().transform(strip)


def _qualifiers(table: exp.Table) -> set[str]:
    names = {p.name.lower() for p in table.parts}
    alias = table.args.get("alias")
    if alias is not None:
        names.add(alias.name.lower())
    return names


def select(spark: SparkSession, catalog: Catalog, tree: exp.Expression, statement: str) -> DataFrame:
    return spark.sql(_sql(with_views(spark, catalog, tree, statement)))


def insert(spark: SparkSession, catalog: Catalog, tree: exp.Insert, statement: str) -> DataFrame:
    target = tree.this
    columns: list[str] | None = None
    if isinstance(target, exp.Schema):
        columns = [c.name for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table):
        raise UnsupportedStatementError(statement, "INSERT needs a table to write to")
    location = catalog.require(table_name(target), statement)
    if tree.args.get("partition") or tree.args.get("by_name"):
        raise UnsupportedStatementError(statement, "INSERT ... PARTITION / BY NAME is not supported")
    query = tree.expression
    if query is None:
        raise UnsupportedStatementError(statement, "INSERT needs a query or VALUES")
    source = spark.sql(_sql(with_views(spark, catalog, query, statement)))
    schema = arrow_to_spark_schema(EventlogTable.forPath(spark, location).table.schema)
    names = schema.fieldNames()
    if columns is not None:
        if len(columns) != len(source.columns):
            raise UnsupportedStatementError(
                statement, f"{len(columns)} columns named but the query gives {len(source.columns)}"
            )
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise UnsupportedStatementError(statement, f"columns {unknown} are not in the table")
        given = source.toDF(*columns)
        # Columns left out are null, as in Spark's INSERT with a column list.
        source = given.select(
            *[(F.col(f"`{f.name}`") if f.name in columns else F.lit(None)).alias(f.name) for f in schema]
        )
    else:
        if len(source.columns) != len(names):
            raise UnsupportedStatementError(
                statement, f"the table has {len(names)} columns but the query gives {len(source.columns)}"
            )
        source = source.toDF(*names)  # by position, as Spark's INSERT
    # Cast to the table's types, as Spark's INSERT does (ANSI store assignment).
    source = source.select(*[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in schema])
    overwrite = bool(tree.args.get("overwrite"))
    writer = source.write.format("eventlog").mode("overwrite" if overwrite else "append")
    where = tree.args.get("where")
    if where is not None:
        if overwrite:
            raise UnsupportedStatementError(
                statement, "INSERT OVERWRITE with REPLACE WHERE is not Delta's syntax"
            )
        writer = writer.mode("overwrite").option("replaceWhere", _sql(where))
    writer.save(location)
    return spark.createDataFrame([], StructType([]))


def delete(spark: SparkSession, catalog: Catalog, tree: exp.Delete, statement: str) -> DataFrame:
    target = tree.this
    if not isinstance(target, exp.Table):
        raise UnsupportedStatementError(statement, "DELETE needs a table")
    if tree.args.get("using"):
        raise UnsupportedStatementError(statement, "DELETE ... USING is not supported")
    location = catalog.require(table_name(target), statement)
    where = tree.args.get("where")
    condition = _sql(_unqualified(where.this, _qualifiers(target))) if where is not None else None
    result = EventlogTable.forPath(spark, location).delete(condition)
    return spark.createDataFrame([(_metric(result, "numDeletedRows"),)], _COUNT)


def update(spark: SparkSession, catalog: Catalog, tree: exp.Update, statement: str) -> DataFrame:
    target = tree.this
    if not isinstance(target, exp.Table):
        raise UnsupportedStatementError(statement, "UPDATE needs a table")
    if tree.args.get("from") or tree.args.get("from_"):
        raise UnsupportedStatementError(statement, "UPDATE ... FROM is not supported: use MERGE INTO")
    location = catalog.require(table_name(target), statement)
    quals = _qualifiers(target)
    values: dict[str, str] = {}
    for assignment in tree.expressions:
        if not isinstance(assignment, exp.EQ) or not isinstance(assignment.this, exp.Column):
            raise UnsupportedStatementError(statement, f"cannot read the assignment {_sql(assignment)}")
        values[assignment.this.name] = _sql(_unqualified(assignment.expression, quals))
    where = tree.args.get("where")
    condition = _sql(_unqualified(where.this, quals)) if where is not None else None
    result = EventlogTable.forPath(spark, location).update(condition, values)
    return spark.createDataFrame([(_metric(result, "numUpdatedRows"),)], _COUNT)


def merge(spark: SparkSession, catalog: Catalog, tree: exp.Merge, statement: str) -> DataFrame:
    target = tree.this
    if not isinstance(target, exp.Table):
        raise UnsupportedStatementError(statement, "MERGE INTO needs a table")
    location = catalog.require(table_name(target), statement)
    alias_node = target.args.get("alias")
    target_alias = alias_node.name if alias_node is not None else target.name.split("/")[-1] or "target"
    using = tree.args["using"]
    source_alias = using.alias_or_name if isinstance(using, exp.Table) else using.alias
    if not source_alias:
        raise UnsupportedStatementError(statement, "the MERGE source needs an alias")
    body = using.copy()
    body.set("alias", None)
    query = body.this if isinstance(body, exp.Subquery) else exp.select("*").from_(body)
    source = spark.sql(_sql(with_views(spark, catalog, query, statement))).alias(source_alias)
    builder = EventlogTable.forPath(spark, location).alias(target_alias).merge(source, _sql(tree.args["on"]))
    whens = tree.args.get("whens")
    for when in whens.expressions if whens is not None else ():
        condition = when.args.get("condition")
        cond = _sql(condition) if condition is not None else None
        then = when.args.get("then")
        if when.args.get("source"):  # WHEN NOT MATCHED BY SOURCE
            if isinstance(then, exp.Var) and then.name.upper() == "DELETE":
                builder = builder.whenNotMatchedBySourceDelete(cond)
            elif isinstance(then, exp.Update) and not any(isinstance(e, exp.Star) for e in then.expressions):
                builder = builder.whenNotMatchedBySourceUpdate(
                    cond, _assignments(then.expressions, statement)
                )
            else:
                raise UnsupportedStatementError(statement, f"WHEN NOT MATCHED BY SOURCE THEN {_sql(then)}")
        elif when.args.get("matched"):
            if isinstance(then, exp.Var) and then.name.upper() == "DELETE":
                builder = builder.whenMatchedDelete(cond)
            elif isinstance(then, exp.Update):
                if len(then.expressions) == 1 and isinstance(then.expressions[0], exp.Star):
                    builder = builder.whenMatchedUpdateAll(cond)
                else:
                    builder = builder.whenMatchedUpdate(cond, _assignments(then.expressions, statement))
            else:
                raise UnsupportedStatementError(statement, f"WHEN MATCHED THEN {_sql(then)}")
        elif isinstance(then, exp.Insert):
            if isinstance(then.this, exp.Star):
                builder = builder.whenNotMatchedInsertAll(cond)
            else:
                names = [c.name for c in then.this.expressions]
                values = [_sql(v) for v in then.expression.expressions]
                if len(names) != len(values):
                    raise UnsupportedStatementError(statement, "INSERT names and VALUES differ in number")
                builder = builder.whenNotMatchedInsert(cond, dict(zip(names, values, strict=True)))
        else:
            raise UnsupportedStatementError(statement, f"WHEN NOT MATCHED THEN {_sql(then)}")
    result = builder.execute()
    counts = [
        _metric(result, "numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted"),
        _metric(result, "numTargetRowsUpdated"),
        _metric(result, "numTargetRowsDeleted"),
        _metric(result, "numTargetRowsInserted"),
    ]
    return spark.createDataFrame([tuple(counts)], _MERGE)


def _assignments(expressions: list[exp.Expression], statement: str) -> Mapping[str, str]:
    out: dict[str, str] = {}
    for a in expressions:
        if not isinstance(a, exp.EQ) or not isinstance(a.this, exp.Column):
            raise UnsupportedStatementError(statement, f"cannot read the assignment {_sql(a)}")
        out[a.this.name] = _sql(a.expression)
    return out
