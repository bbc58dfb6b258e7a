"""Table definition and maintenance in SQL on our tables: CREATE TABLE (and CTAS), ALTER
TABLE, OPTIMIZE, REORG, VACUUM, RESTORE, DESCRIBE HISTORY / DETAIL and SHOW TBLPROPERTIES,
each run through the table API (:class:`~spark_adapter.table.EventlogTable` for the Spark
jobs, :class:`~eventlog.Table` for metadata), with Delta's result columns."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from sqlglot import exp

from eventlog import Table
from eventlog.errors import InvalidInputError, TableAlreadyExistsError
from eventlog.snapshot.protocol import features_of
from spark_adapter.errors import UnsupportedStatementError
from spark_adapter.sql import grammar as g
from spark_adapter.sql.names import Catalog, option_map, table_name, with_views
from spark_adapter.table import EventlogTable
from spark_adapter.types import spark_to_arrow_schema

__all__ = ["alter", "create", "maintenance"]

_EMPTY = StructType([])
_OPTIMIZE = StructType(
    [
        StructField("path", StringType()),
        StructField(
            "metrics",
            StructType(
                [StructField("numFilesAdded", LongType()), StructField("numFilesRemoved", LongType())]
            ),
        ),
    ]
)
_RESTORE = StructType(
    [
        StructField(n, LongType())
        for n in (
            "table_size_after_restore",
            "num_of_files_after_restore",
            "num_removed_files",
            "num_restored_files",
        )
    ]
)
_DETAIL = StructType(
    [
        StructField("format", StringType()),
        StructField("id", StringType()),
        StructField("name", StringType()),
        StructField("description", StringType()),
        StructField("location", StringType()),
        StructField("createdAt", TimestampType()),
        StructField("lastModified", TimestampType()),
        StructField("partitionColumns", ArrayType(StringType())),
        StructField("clusteringColumns", ArrayType(StringType())),
        StructField("numFiles", LongType()),
        StructField("sizeInBytes", LongType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("minReaderVersion", IntegerType()),
        StructField("minWriterVersion", IntegerType()),
        StructField("tableFeatures", ArrayType(StringType())),
    ]
)
_PROPERTIES = StructType([StructField("key", StringType()), StructField("value", StringType())])


def _sql(node: exp.Expression) -> str:
    return node.sql(dialect="spark")


def _int(result_metrics: object, name: str) -> int:
    assert isinstance(result_metrics, dict)
    return int(result_metrics.get(name, 0) or 0)


# --------------------------------------------------------------------------- maintenance


def maintenance(spark: SparkSession, catalog: Catalog, stmt: g.Maintenance, statement: str) -> DataFrame:
    location = catalog.require(stmt.table, statement)
    table = EventlogTable.forPath(spark, location)
    if isinstance(stmt, g.Optimize):
        builder = table.optimize()
        if stmt.where is not None:
            builder = builder.where(stmt.where)
        result = builder.executeZOrderBy(*stmt.zorder_by) if stmt.zorder_by else builder.executeCompaction()
        metrics = dict(result.metrics)
        return spark.createDataFrame(
            [(location, (_int(metrics, "numAddedFiles"), _int(metrics, "numRemovedFiles")))], _OPTIMIZE
        )
    if isinstance(stmt, g.Reorg):
        metrics = dict(table.reorgPurge(stmt.where).metrics)
        return spark.createDataFrame(
            [(location, (_int(metrics, "numAddedFiles"), _int(metrics, "numRemovedFiles")))], _OPTIMIZE
        )
    if isinstance(stmt, g.Vacuum):
        files = table.vacuum(stmt.retain_hours, dryRun=stmt.dry_run)
        rows = [(f,) for f in files] if stmt.dry_run else [(location,)]
        return spark.createDataFrame(rows, StructType([StructField("path", StringType())]))
    if isinstance(stmt, g.Restore):
        if stmt.version is not None:
            result = table.restoreToVersion(stmt.version)
        else:
            assert stmt.timestamp is not None
            result = table.restoreToTimestamp(stmt.timestamp)
        m = dict(result.metrics)
        num_files = len(table.table.refresh().add_files)
        row = (
            _int(m, "tableSizeAfterRestore"),
            num_files,
            _int(m, "numRemovedFiles"),
            _int(m, "numRestoredFiles"),
        )
        return spark.createDataFrame([row], _RESTORE)
    if isinstance(stmt, g.DescribeHistory):
        return table.history(stmt.limit)
    if isinstance(stmt, g.DescribeDetail):
        return _detail(spark, table.table, location)
    if isinstance(stmt, g.ShowProperties):
        props = dict(table.table.refresh().properties)
        pairs: list[tuple[str, str]] = sorted(props.items())
        if stmt.key is not None:
            value = props.get(stmt.key)
            pairs = [(stmt.key, value if value is not None else f"Table does not have property: {stmt.key}")]
        return spark.createDataFrame(pairs, _PROPERTIES)
    if isinstance(stmt, g.UnsetProperties):
        present = [k for k in stmt.keys if k in table.table.properties]
        missing = [k for k in stmt.keys if k not in present]
        if missing and not stmt.if_exists:
            raise InvalidInputError(f"cannot unset table properties that are not set: {missing}")
        if present:
            table.table.unset_properties(present)
        return spark.createDataFrame([], _EMPTY)
    if isinstance(stmt, g.DropFeature):
        table.dropFeature(stmt.feature, stmt.truncate_history)
        return spark.createDataFrame([], _EMPTY)
    if isinstance(stmt, g.ClusterByNone):
        table.table.cluster_by(None)
        return spark.createDataFrame([], _EMPTY)
    raise UnsupportedStatementError(statement, f"{type(stmt).__name__} is not supported")


def _detail(spark: SparkSession, table: Table, location: str) -> DataFrame:
    snap = table.refresh()
    meta = snap.metadata
    protocol = snap.protocol

    def ts(ms: int | None) -> dt.datetime | None:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC) if ms is not None else None

    stamps = snap.commit_timestamps
    row = (
        "delta",
        meta.id,
        meta.name,
        meta.description,
        location,
        ts(meta.created_time),
        ts(stamps[-1][1] if stamps else None),
        list(meta.partition_columns),
        table.clustering_columns(),
        len(snap.add_files),
        sum(a.size for a in snap.add_files),
        dict(meta.configuration),
        protocol.min_reader_version,
        protocol.min_writer_version,
        sorted(features_of(protocol)),
    )
    return spark.createDataFrame([row], _DETAIL)


# --------------------------------------------------------------------------- ALTER TABLE


def alter(spark: SparkSession, catalog: Catalog, tree: exp.Alter, statement: str) -> DataFrame:
    target = tree.this
    if not isinstance(target, exp.Table) or str(tree.args.get("kind", "")).upper() != "TABLE":
        raise UnsupportedStatementError(statement, "only ALTER TABLE is supported")
    location = catalog.require(table_name(target), statement)
    table = EventlogTable.forPath(spark, location)
    for action in tree.args.get("actions") or []:
        if isinstance(action, exp.AlterSet):
            props = {}
            for p in action.expressions:
                props.update(option_map(p))
            if not props:
                raise UnsupportedStatementError(statement, f"ALTER TABLE SET {_sql(action)}")
            table.table.set_properties(props)
        elif isinstance(action, exp.Schema):  # ADD COLUMNS (...)
            fields = _fields(spark, action.expressions, statement)
            table.table.add_columns(fields)
        elif isinstance(action, exp.ColumnDef):  # ADD COLUMN c T
            table.table.add_columns(_fields(spark, [action], statement))
        elif isinstance(action, exp.RenameColumn):
            table.renameColumn(_column_path(action.this), action.args["to"].name)
        elif isinstance(action, exp.Drop) and str(action.args.get("kind", "")).upper() in (
            "COLUMN",
            "COLUMNS",
        ):
            names = [
                _column_path(c)
                for t in action.args.get("tables") or []
                for c in (t.expressions if isinstance(t, exp.Schema) else [t])
            ]
            if action.args.get("exists"):  # DROP COLUMN IF EXISTS: only those there
                names = [n for n in names if _has_column(table.table.schema, n)]
            if names:
                table.dropColumns(*names)
        elif isinstance(action, exp.Drop) and str(action.args.get("kind", "")).upper() == "CONSTRAINT":
            (name,) = [t.name for t in action.args.get("tables") or []]
            table.dropConstraint(name, ifExists=bool(action.args.get("exists")))
        elif isinstance(action, exp.AddConstraint):
            for constraint in action.expressions:
                checks = [c for c in constraint.expressions if isinstance(c, exp.CheckColumnConstraint)]
                if len(checks) != 1:
                    raise UnsupportedStatementError(statement, "only CHECK constraints can be added")
                table.addConstraint(constraint.name, _sql(checks[0].this))
        elif isinstance(action, exp.ClusterProperty):
            columns = [c.name for c in action.expressions]
            table.clusterBy(*columns)
        else:
            raise UnsupportedStatementError(statement, f"ALTER TABLE action {_sql(action)} is not supported")
    return spark.createDataFrame([], _EMPTY)


def _column_path(node: exp.Expression) -> str:
    """A column reference as the Python API names it: ``a.b`` for a struct field."""
    if isinstance(node, exp.Column):
        return ".".join(part.name for part in node.parts)
    return node.name


def _has_column(schema: pa.Schema, path: str) -> bool:
    fields: pa.Schema | pa.StructType = schema
    for name in path.split("."):
        index = fields.get_field_index(name)
        if index < 0:
            return False
        kind = fields.field(index).type
        fields = kind if pa.types.is_struct(kind) else pa.struct([])
    return True


def _fields(spark: SparkSession, defs: list[exp.Expression], statement: str) -> list[pa.Field]:
    """Arrow fields of column definitions (``name TYPE [NOT NULL] [COMMENT '...']``), typed
    by Spark's own DDL parser."""
    parts = []
    for d in defs:
        if not isinstance(d, exp.ColumnDef):
            raise UnsupportedStatementError(statement, f"cannot read the column {_sql(d)}")
        for c in d.args.get("constraints") or []:
            if not isinstance(c.kind, (exp.NotNullColumnConstraint, exp.CommentColumnConstraint)):
                raise UnsupportedStatementError(statement, f"column constraint {_sql(c)} is not supported")
        parts.append(_sql(d))
    schema = spark.createDataFrame([], ", ".join(parts)).schema
    return list(spark_to_arrow_schema(schema))


# --------------------------------------------------------------------------- CREATE TABLE


def create(spark: SparkSession, catalog: Catalog, tree: exp.Create, statement: str) -> DataFrame:
    if str(tree.args.get("kind", "")).upper() != "TABLE":
        raise UnsupportedStatementError(statement, "only CREATE TABLE is supported")
    if tree.args.get("replace"):
        raise UnsupportedStatementError(statement, "CREATE OR REPLACE is not supported")
    node = tree.this
    schema_node = node if isinstance(node, exp.Schema) else None
    target = node.this if isinstance(node, exp.Schema) else node
    assert isinstance(target, exp.Table)
    name = table_name(target)
    props_node = tree.args.get("properties")
    provider, location, partition_by, cluster_by, tblprops = None, None, [], [], {}
    for prop in props_node.expressions if props_node is not None else []:
        if isinstance(prop, exp.FileFormatProperty) or (
            isinstance(prop, exp.Property) and prop.name == "USING"
        ):
            provider = _sql(prop.this).strip("`").lower()
        elif isinstance(prop, exp.LocationProperty):
            location = prop.this.name
        elif isinstance(prop, exp.PartitionedByProperty):
            part = prop.this
            partition_by = [e.name for e in (part.expressions if hasattr(part, "expressions") else [part])]
        elif isinstance(prop, exp.ClusterProperty):
            cluster_by = [e.name for e in prop.expressions]
        elif isinstance(prop, exp.Property):
            tblprops.update(option_map(exp.Properties(expressions=[prop])))
        else:
            raise UnsupportedStatementError(statement, f"CREATE TABLE clause {_sql(prop)} is not supported")
    if provider not in ("eventlog", "delta"):
        raise UnsupportedStatementError(
            statement, f"CREATE TABLE USING {provider}: only USING eventlog is ours"
        )
    if name.path is not None:
        if location is not None and location != name.path:
            raise UnsupportedStatementError(statement, "a path table cannot have another LOCATION")
        location = name.path
    if location is None:
        raise UnsupportedStatementError(
            statement, "CREATE TABLE ... USING eventlog needs a LOCATION (or eventlog.`/path`)"
        )
    exists = Table.exists(location)
    if exists and tree.args.get("exists"):  # IF NOT EXISTS
        if name.name is not None and catalog.location(name.name) is None:
            catalog.register(name.name, location)
        return spark.createDataFrame([], _EMPTY)
    query = tree.expression
    if query is not None:
        source = spark.sql(_sql(with_views(spark, catalog, query, statement)))
        arrow_schema = spark_to_arrow_schema(source.schema, nullable=True)
    elif schema_node is not None:
        arrow_schema = pa.schema(_fields(spark, schema_node.expressions, statement))
    elif exists:  # CREATE TABLE name USING eventlog LOCATION '<existing table>': register it
        arrow_schema = None
    else:
        raise UnsupportedStatementError(statement, "CREATE TABLE needs columns or AS SELECT")
    if arrow_schema is not None:
        if exists:
            raise TableAlreadyExistsError(location, Table.open(location).version)
        Table.create(
            location,
            arrow_schema,
            partition_by=partition_by or None,
            cluster_by=cluster_by or None,
            properties=tblprops or None,
        ).close()
    if name.name is not None:
        catalog.register(name.name, location)
    if query is not None:
        source.write.format("eventlog").mode("append").save(location)
    return spark.createDataFrame([], _EMPTY)


def drop_table(spark: SparkSession, catalog: Catalog, tree: exp.Drop, statement: str) -> DataFrame:
    """``DROP TABLE [IF EXISTS] name``: the name is forgotten; the table's files and log stay
    (our tables are external: Delta's DROP TABLE deletes nothing at a LOCATION either)."""
    tables = tree.args.get("tables") or []
    if len(tables) != 1 or not isinstance(tables[0], exp.Table):
        raise UnsupportedStatementError(statement, "DROP TABLE needs one table name")
    target = tables[0]
    name = table_name(target)
    if name.name is None:
        raise UnsupportedStatementError(statement, "a path table has no name to drop; delete its directory")
    if not catalog.unregister(name.name) and not tree.args.get("exists"):
        raise InvalidInputError(f"table {name.name} is not an eventlog table name")
    return spark.createDataFrame([], _EMPTY)
