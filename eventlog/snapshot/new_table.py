"""What version 0 of a new table declares: :func:`check_partition_by` checks the partition
columns asked for against the schema, and :func:`new_table_metadata` builds the table's
first metadata action (id, schema, partition columns, properties, name, description).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import pyarrow as pa

from eventlog.errors import InvalidInputError, UnknownColumnError
from eventlog.files.partition_values import check_partition_column
from eventlog.files.schema import to_spark_schema_json
from eventlog.log.actions import Metadata
from eventlog.userinput import check_string_list

__all__ = ["check_partition_by", "new_table_metadata"]


def check_partition_by(partition_by: Sequence[str] | None, schema: pa.Schema) -> list[str]:
    """``partition_by`` as a list, once each name is known to be a flat column of ``schema``
    short enough for a directory name, none is listed twice, and a data column remains."""
    parts = check_string_list(partition_by or (), "partition column")
    for col in parts:
        if col not in schema.names:
            raise UnknownColumnError(col, list(schema.names), "partition_by")
        if pa.types.is_nested(schema.field(col).type):
            raise InvalidInputError(f"partition column {col!r} has nested type {schema.field(col).type}")
        check_partition_column(col)
    if len(set(parts)) != len(parts):
        raise InvalidInputError(f"partition_by lists a column twice: {parts}")
    if parts and len(parts) == len(schema):
        raise InvalidInputError("a table cannot be partitioned by all of its columns")
    return parts


def new_table_metadata(
    schema: pa.Schema,
    partition_columns: Sequence[str],
    properties: Mapping[str, str],
    *,
    name: str | None,
    description: str | None,
) -> Metadata:
    """The metadata action of a new table (a fresh id, created now) with the canonical
    ``schema``, checked partition columns and validated properties."""
    return Metadata(
        id=Metadata.new_id(),
        schema_string=to_spark_schema_json(schema),
        partition_columns=tuple(partition_columns),
        configuration=properties,
        created_time=int(time.time() * 1000),
        name=name,
        description=description,
    )
