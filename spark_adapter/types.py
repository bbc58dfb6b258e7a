"""Spark type and option helpers shared by the reader and the writer.

Schemas cross between Spark and the table through Delta's own schema format: Spark's
``StructType.json()`` *is* the JSON a Delta ``metaData.schemaString`` holds, so
:func:`eventlog.files.schema.from_spark_schema_json` / :func:`to_spark_schema_json` do the
conversion both ways. Arrow batches handed back to Spark must match
``to_arrow_schema(schema, timezone="UTC")`` exactly (types, nullability, timezone string,
list/map child names), which :func:`to_spark_arrow` guarantees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from eventlog.errors import InvalidInputError, InvalidTextError
from eventlog.files.schema import canonical_schema, from_spark_schema_json, to_spark_schema_json
from eventlog.log.location import TableLocation
from spark_adapter.session import is_connect

__all__ = [
    "activate_session",
    "arrow_to_spark_schema",
    "nullable_schema",
    "option",
    "option_bool",
    "option_int",
    "spark_arrow_schema",
    "spark_to_arrow_schema",
    "storage_options",
    "storage_spark_options",
    "table_location",
    "table_uri",
    "write_location",
    "to_spark_arrow",
]

# --------------------------------------------------------------------------- schemas


def spark_to_arrow_schema(schema: StructType, *, nullable: bool = False) -> pa.Schema:
    """The canonical Arrow (table) schema of a Spark schema.

    ``nullable=True`` makes every field nullable, nested ones included: Delta does the
    same when a DataFrame creates a table (``data.schema.asNullable``), so later writes
    are not rejected just because one DataFrame happened to have no nulls.
    """
    doc = json.loads(schema.json())
    if nullable:
        doc = _as_nullable(doc)
    return canonical_schema(from_spark_schema_json(json.dumps(doc)))


def nullable_schema(schema: StructType) -> StructType:
    """``schema`` with every field, nested ones included, nullable."""
    return StructType.fromJson(_as_nullable(schema.jsonValue()))


def _as_nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_as_nullable(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_nullable(v) for k, v in node.items()}
    for key in ("nullable", "containsNull", "valueContainsNull"):
        if key in out:
            out[key] = True
    return out


def arrow_to_spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of a table schema (timestamps with time zone become TIMESTAMP)."""
    return StructType.fromJson(json.loads(to_spark_schema_json(schema)))


def spark_arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``DataSourceReader.read`` batches."""
    return to_arrow_schema(schema, timezone="UTC")


def to_spark_arrow(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` cast column by column to ``target`` (same column order).

    Only names differ in practice (list items are ``item`` in the table and ``element``
    for Spark; map entries likewise), plus nullability flags; values are not converted.
    """
    if table.schema.equals(target):
        return table
    columns = [
        col if col.type.equals(f.type) and str(col.type) == str(f.type) else col.cast(f.type)
        for col, f in zip(table.columns, target, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=target)


# --------------------------------------------------------------------------- options
# Spark hands options over as a CaseInsensitiveDict with lower-cased keys; ``.get`` on it
# is case-insensitive, ``dict(options)`` is not. Keep the mapping as it is and go through
# these helpers.


def option(options: Mapping[str, str], key: str) -> str | None:
    """The option's value (any key case), None when absent or empty."""
    value = options.get(key)
    if value is None:
        value = options.get(key.lower())
    if value is None or str(value).strip() == "":
        return None
    return str(value)


def option_bool(options: Mapping[str, str], key: str, default: bool = False) -> bool:
    value = option(options, key)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidInputError(f"option {key} must be true or false, got {value!r}")
    return lowered == "true"


def option_int(options: Mapping[str, str], key: str, *, minimum: int = 0) -> int | None:
    value = option(options, key)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise InvalidInputError(f"option {key} must be an integer, got {value!r}") from None
    if number < minimum:
        raise InvalidInputError(f"option {key} must be at least {minimum}, got {number}")
    return number


def table_uri(options: Mapping[str, str]) -> str:
    """The table location: ``load(uri)`` / ``save(uri)`` arrive as the ``path`` option."""
    uri = option(options, "path")
    if uri is None:
        raise InvalidInputError(
            "format('eventlog') needs a table location: use .load(uri) / .save(uri) or .option('path', uri)"
        )
    if uri.startswith("memory://"):
        # Spark tasks run in separate Python processes; an in-memory filesystem is not shared.
        raise InvalidInputError(f"{uri}: memory:// tables cannot be used from Spark (one per process)")
    return uri


STORAGE_PREFIX = "storage."
STORAGE_JSON = "storageOptions"


def storage_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The fsspec ``storage_options`` of a read or write: every ``storage.<name>`` option,
    and the JSON object of ``storageOptions`` (for nested or typed values, and for names
    with capitals: Spark lower-cases option *names*, never values).

    ``storage.<name>`` values are strings, except ``true``/``false`` (any case), which
    become booleans (fsspec's flags such as ``anon`` would take the string ``"false"`` as
    true). A name given both ways, an empty name, or ``storageOptions`` that is not a JSON
    object is an :class:`~eventlog.errors.InvalidTextError` whose ``argument`` names the
    option; values never appear in messages.
    """
    out: dict[str, Any] = {}
    raw_json = option(options, STORAGE_JSON)
    if raw_json is not None:
        try:
            doc = json.loads(raw_json)
        except json.JSONDecodeError as exc:
            raise InvalidTextError(
                f"option {STORAGE_JSON} must be a JSON object of fsspec options: "
                f"{exc.msg} at position {exc.pos}",
                argument=STORAGE_JSON,
                reason="not JSON",
                position=exc.pos,
            ) from None
        if not isinstance(doc, dict):
            raise InvalidTextError(
                f"option {STORAGE_JSON} must be a JSON object of fsspec options, "
                f"got a JSON {type(doc).__name__}",
                argument=STORAGE_JSON,
                reason="not a JSON object",
            )
        out.update(doc)
    for key in list(options.keys()):
        if not isinstance(key, str) or not key.lower().startswith(STORAGE_PREFIX):
            continue
        name = key[len(STORAGE_PREFIX) :]
        what = f"{STORAGE_PREFIX}{name}"
        if not name.strip():
            raise InvalidTextError(
                f"option {key!r} names no storage option (use storage.<name>)", argument=what, reason="empty"
            )
        if name in out:
            raise InvalidTextError(
                f"storage option {name!r} is given twice: as option {what} and inside {STORAGE_JSON}",
                argument=what,
                reason="given twice",
            )
        value = options[key]
        text = "" if value is None else str(value)
        out[name] = text.strip().lower() == "true" if text.strip().lower() in ("true", "false") else text
    return out


def table_location(options: Mapping[str, str]) -> TableLocation:
    """The table location of a read or write: the ``path`` option (see :func:`table_uri`)
    with its :func:`storage_options`."""
    return TableLocation.of(table_uri(options), storage_options(options))


def write_location(options: Mapping[str, str]) -> TableLocation:
    """The table location of a write (batch or streaming): :func:`table_location`, in durable
    mode with the ``durable`` option (``true``/``false``, default ``false``; any other value
    is InvalidInputError): every data file the tasks write, and the commit, fsynced before
    the commit is acknowledged (:mod:`eventlog.log.durable`)."""
    return TableLocation.of(table_location(options), durable=option_bool(options, "durable"))


def storage_spark_options(location: TableLocation) -> dict[str, str]:
    """Reader/writer options that carry ``location``'s storage options through Spark (one
    ``storageOptions`` JSON: case and types survive). InvalidTextError when a value cannot
    be written as JSON (only Python callers can pass such values)."""
    if not location.options:
        return {}
    try:
        return {STORAGE_JSON: json.dumps(location.storage_options, sort_keys=True)}
    except (TypeError, ValueError):
        bad = [k for k, v in location.options if not _json_ok(v)]
        raise InvalidTextError(
            f"storage options {bad} of {location.uri} cannot be passed to Spark as options (not JSON values)",
            argument="storage option",
            reason="not JSON",
        ) from None


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def activate_session(spark: Any) -> None:
    """Make ``spark`` the JVM's active session in the calling thread, where pyspark looks
    Python data sources up (a new thread has none until it calls ``createDataFrame``).
    Does nothing for sessions without a JVM (Spark Connect)."""
    if is_connect(spark):
        return
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
