"""Table names in SQL: which tables are ours, where they live, and reading them in queries.

A table is ours when it is written ``eventlog.`/path``` (or ``delta.`/path```, as Delta
users write it) or when its name is registered here: ``CREATE TABLE name USING eventlog
LOCATION '/path'`` through :func:`spark_adapter.sql.sql` registers it. Spark's catalog
cannot keep the location for a Python data source (it hands the source empty options), so
the mapping is kept by this module, in the file ``_eventlog_tables.json`` in the session's
warehouse directory (``spark.sql.warehouse.dir``): sessions that share a warehouse, as
sessions sharing a metastore do, share the names.

Queries read our tables through temporary views: every reference to one of them in a
statement's query (a SELECT, the source of an INSERT or MERGE, a subquery) is replaced by
a fresh temporary view over ``spark.read.format("eventlog")`` at the version the
reference asks for (``VERSION AS OF``, ``TIMESTAMP AS OF``), and Spark runs the rest.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp

from eventlog.errors import InvalidInputError
from spark_adapter.errors import UnsupportedStatementError
from spark_adapter.sql.grammar import PATH_CATALOGS, TableName

__all__ = ["Catalog", "read_table", "table_name", "with_views"]

REGISTRY_FILE = "_eventlog_tables.json"


def table_name(table: exp.Table) -> TableName:
    """The :class:`TableName` of a sqlglot table reference."""
    if table.args.get("catalog") is None and table.args.get("db") is not None:
        db = table.args["db"]
        if db.name.lower() in PATH_CATALOGS and table.this.args.get("quoted"):
            return TableName(path=table.name)
    parts = [p.name for p in table.parts]
    return TableName(name=".".join(parts))


class Catalog:
    """The names registered for eventlog tables (see the module docstring)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    @property
    def _file(self) -> str:
        warehouse = str(self.spark.conf.get("spark.sql.warehouse.dir"))
        if warehouse.startswith("file:"):
            warehouse = warehouse.removeprefix("file:").removeprefix("//")
        if "://" in warehouse:
            raise InvalidInputError(
                "eventlog table names need a local warehouse directory; "
                f"spark.sql.warehouse.dir is {warehouse}"
            )
        return os.path.join(warehouse, REGISTRY_FILE)

    def _key(self, name: str) -> str:
        parts = name.lower().split(".")
        if len(parts) == 1:
            parts = [str(self.spark.catalog.currentDatabase()).lower(), parts[0]]
        return ".".join(parts)

    def names(self) -> dict[str, str]:
        try:
            with open(self._file, encoding="utf-8") as f:
                data: dict[str, str] = json.load(f)
        except FileNotFoundError:
            return {}
        return data

    def location(self, name: str) -> str | None:
        return self.names().get(self._key(name))

    def register(self, name: str, location: str) -> None:
        names = self.names()
        key = self._key(name)
        if key in names and names[key] != location:
            raise InvalidInputError(f"table {name} is already registered at {names[key]}")
        names[key] = location
        self._write(names)

    def unregister(self, name: str) -> bool:
        names = self.names()
        if names.pop(self._key(name), None) is None:
            return False
        self._write(names)
        return True

    def _write(self, names: Mapping[str, str]) -> None:
        directory = os.path.dirname(self._file)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".eventlog-tables-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(names.items())), f, indent=1)
        os.replace(tmp, self._file)  # readers see the old file or the new one, whole

    def resolve(self, name: TableName) -> str | None:
        """The location of ``name`` if it is one of ours, else None (a Spark table)."""
        if name.path is not None:
            return name.path
        assert name.name is not None
        return self.location(name.name)

    def views(self) -> dict[str, str]:
        """{temporary view name: location} for the names of the current database."""
        database = str(self.spark.catalog.currentDatabase()).lower()
        return {
            key.split(".", 1)[1]: location
            for key, location in self.names().items()
            if key.split(".", 1)[0] == database
        }

    def refresh_view(self, name: str, location: str | None, run_sql: Any) -> None:
        """Keep the temporary view ``name`` (its last part) over the table at ``location``
        (dropped when None), so that plain ``spark.sql`` reads the table by its name too;
        ``run_sql`` is Spark's own ``spark.sql``. Spark plans a data source view's files once
        and keeps that plan, so the view shows the version of its last refresh: every
        statement :func:`spark_adapter.sql.sql` runs on the name refreshes it, and
        :func:`spark_adapter.sql.refresh` refreshes them all."""
        view = name.split(".")[-1]
        if location is None:
            self.spark.catalog.dropTempView(view)
            return
        quoted = location.replace("'", "\\'")
        run_sql(f"CREATE OR REPLACE TEMPORARY VIEW `{view}` USING eventlog OPTIONS (path '{quoted}')")

    def require(self, name: TableName, statement: str) -> str:
        location = self.resolve(name)
        if location is None:
            raise UnsupportedStatementError(
                statement,
                f"{name} is not an eventlog table (eventlog.`/path`, or a name created USING eventlog)",
            )
        return location


def read_table(spark: SparkSession, location: str, version: exp.Version | None, statement: str) -> DataFrame:
    """Our table at ``location`` as a DataFrame, at the version ``version`` asks for."""
    reader = spark.read.format("eventlog")
    if version is not None:
        kind = str(version.this).upper()
        value = version.expression
        if not isinstance(value, exp.Literal):
            raise UnsupportedStatementError(
                statement, f"{kind} AS OF needs a literal, got {value.sql('spark')}"
            )
        if kind == "VERSION":
            if value.is_string or not str(value.this).isdigit():
                raise UnsupportedStatementError(
                    statement, f"VERSION AS OF needs a version number, got {value.sql('spark')}"
                )
            reader = reader.option("versionAsOf", int(str(value.this)))
        else:
            reader = reader.option("timestampAsOf", str(value.this))
    return reader.load(location)


def with_views(spark: SparkSession, catalog: Catalog, tree: exp.Expression, statement: str) -> exp.Expression:
    """``tree`` with each reference to one of our tables replaced by a temporary view of it
    (at the version the reference asks for); the view keeps the reference's alias."""

    def replace(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Table) or not node.name:
            return node
        location = catalog.resolve(table_name(node))
        if location is None:
            return node
        view = f"__eventlog_{uuid.uuid4().hex[:16]}"
        read_table(spark, location, node.args.get("version"), statement).createOrReplaceTempView(view)
        alias = node.args.get("alias")
        if alias is None and table_name(node).name is not None:
            alias = exp.TableAlias(this=exp.to_identifier(table_name(node).name.split(".")[-1]))  # type: ignore[union-attr]
        out = exp.Table(this=exp.to_identifier(view))
        if alias is not None:
            out.set("alias", alias)
        return out

    return tree.transform(replace)


def option_map(properties: Any) -> dict[str, str]:
    """``TBLPROPERTIES``/``OPTIONS`` key-value pairs of a sqlglot Properties node."""
    out: dict[str, str] = {}
    for prop in properties.expressions if properties is not None else ():
        key, value = prop.this, prop.args.get("value")
        k = key.this if isinstance(key, exp.Literal) else key.sql("spark").strip("`")
        v = value.this if isinstance(value, exp.Literal) else value.sql("spark")
        out[str(k)] = str(v)
    return out
