"""Helpers of the Delta Spark peer tests: what Delta Spark sees of a table, compared with ours."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def delta_arrow(spark: Any, path: str, version: int | None = None) -> pa.Table:
    """Delta Spark's read of the table at ``path`` (at ``version``), as Arrow."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    result: pa.Table = reader.load(path).toArrow()
    return result


def delta_history(spark: Any, path: str) -> list[tuple[int, str]]:
    """``(version, operation)`` of each commit in Delta Spark's DESCRIBE HISTORY, newest first."""
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation").collect()
    return [(int(r.version), str(r.operation)) for r in rows]


def delta_detail(spark: Any, path: str) -> dict[str, Any]:
    """Delta Spark's DESCRIBE DETAIL: the protocol versions and the table's features."""
    row = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]
    return {
        "minReaderVersion": int(row.minReaderVersion),
        "minWriterVersion": int(row.minWriterVersion),
        "tableFeatures": sorted(row.tableFeatures or []),
    }


def schema_shape(schema: pa.Schema) -> list[tuple[str, str, bool]]:
    """Names, types and nullability of the columns (field metadata and the name of a list's
    item field, which Spark's Arrow export does not keep, left out)."""
    return [(f.name, str(_canonical(f.type)), f.nullable) for f in schema]


def _canonical(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field("item", _canonical(t.value_type), t.value_field.nullable))
    if pa.types.is_map(t):
        return pa.map_(
            pa.field("key", _canonical(t.key_type), False),
            pa.field("value", _canonical(t.item_type), t.item_field.nullable),
        )
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _canonical(f.type), f.nullable) for f in t])
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return t


def row_multiset(table: pa.Table) -> list[dict[str, Any]]:
    """The rows in a canonical order (equal lists: equal multisets of rows)."""
    return sorted(table.to_pylist(), key=repr)


def same_rows(ours: pa.Table, theirs: pa.Table) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Both tables' rows, canonically ordered, with Delta Spark's columns cast to our schema
    (Spark's Arrow export may pick other physical types: large strings, map key nullability)."""
    if theirs.schema.names != ours.schema.names:
        return row_multiset(ours), row_multiset(theirs)
    return row_multiset(ours), row_multiset(theirs.cast(ours.schema))
