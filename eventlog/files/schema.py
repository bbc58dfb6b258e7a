"""Table schemas: the Spark JSON codec and canonical Arrow types.

A table stores its schema as Spark's JSON schema string (Delta PROTOCOL.md, "Schema
Serialization Format"). In Arrow the table schema is always *canonical*: one Arrow type per
Delta type (``string`` not ``large_string``, ``timestamp[us, tz=UTC]`` for ``timestamp``,
naive ``timestamp[us]`` for ``timestamp_ntz``...). Spark column metadata is kept in the Arrow
field metadata, each value JSON-encoded, so schemas round-trip exactly.

Write-time enforcement and evolution (``conform``, ``merge_schema``) live in
:mod:`eventlog.files.enforce`. Partition values live in :mod:`eventlog.files.partition_values`
and per-file statistics in :mod:`eventlog.files.stats`; their public functions are
re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
import pyarrow as pa

from eventlog.errors import InvalidInputError
from eventlog.files.partition_values import (
    decode_partition_value,
    encode_partition_value,
    partition_values_table,
)
from eventlog.files.stats import stats_table
from eventlog.userinput import check_schema

__all__ = [
    "canonical_schema",
    "decode_partition_value",
    "encode_partition_value",
    "from_spark_schema_json",
    "needs_timestamp_ntz",
    "partition_values_table",
    "stats_table",
    "to_spark_schema_json",
]


_SPARK_PRIMITIVES: dict[str, pa.DataType] = {
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
}
_ARROW_TO_SPARK = {str(v): k for k, v in _SPARK_PRIMITIVES.items()}
_DECIMAL_RE = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")
_CHAR_RE = re.compile(r"(?:var)?char\(\d+\)")
# Arrow-internal field metadata that must not leak into the Delta schema.
_INTERNAL_META_PREFIXES = (b"PARQUET:", b"ARROW:")


# --------------------------------------------------------------------------- Spark JSON


def to_spark_schema_json(schema: pa.Schema) -> str:
    """Spark's compact JSON schema string for ``schema`` (canonicalised first)."""
    schema = canonical_schema(schema)
    doc = {"type": "struct", "fields": [_field_to_spark(f) for f in schema]}
    return orjson.dumps(doc).decode()


def _field_to_spark(f: pa.Field) -> dict[str, Any]:
    return {
        "name": f.name,
        "type": _type_to_spark(f.type),
        "nullable": f.nullable,
        "metadata": _metadata_to_spark(f.metadata),
    }


def _type_to_spark(t: pa.DataType) -> Any:
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_struct(t):
        return {"type": "struct", "fields": [_field_to_spark(t.field(i)) for i in range(t.num_fields)]}
    if pa.types.is_list(t):
        return {
            "type": "array",
            "elementType": _type_to_spark(t.value_type),
            "containsNull": t.value_field.nullable,
        }
    if pa.types.is_map(t):
        return {
            "type": "map",
            "keyType": _type_to_spark(t.key_type),
            "valueType": _type_to_spark(t.item_type),
            "valueContainsNull": t.item_field.nullable,
        }
    return _ARROW_TO_SPARK[str(t)]


def _metadata_to_spark(meta: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (meta or {}).items():
        if k.startswith(_INTERNAL_META_PREFIXES):
            continue
        try:
            out[k.decode()] = orjson.loads(v)
        except orjson.JSONDecodeError:  # plain (non-JSON) Arrow metadata: keep as a string
            out[k.decode()] = v.decode("utf-8", "replace")
    return out


def from_spark_schema_json(schema_string: str) -> pa.Schema:
    """Parse a Spark/Delta JSON schema string into a canonical Arrow schema."""
    try:
        doc = orjson.loads(schema_string)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"schema string is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("type") != "struct":
        raise InvalidInputError("a table schema must be a JSON object of type 'struct'")
    return pa.schema([_field_from_spark(f, "") for f in doc.get("fields") or []])


def _field_from_spark(d: Mapping[str, Any], parent: str) -> pa.Field:
    name = d["name"]
    path = f"{parent}.{name}" if parent else name
    meta = {k: orjson.dumps(v) for k, v in (d.get("metadata") or {}).items()}
    return pa.field(
        name, _type_from_spark(d["type"], path), nullable=bool(d.get("nullable", True)), metadata=meta or None
    )


def _type_from_spark(t: Any, path: str) -> pa.DataType:
    if isinstance(t, str):
        if t in _SPARK_PRIMITIVES:
            return _SPARK_PRIMITIVES[t]
        if t == "decimal":
            return pa.decimal128(10, 0)
        m = _DECIMAL_RE.fullmatch(t)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        if _CHAR_RE.fullmatch(t):
            return pa.string()
        raise InvalidInputError(f"column {path!r}: unsupported Spark type {t!r}")
    kind = t.get("type")
    if kind == "struct":
        return pa.struct([_field_from_spark(f, path) for f in t.get("fields") or []])
    if kind == "array":
        elem = _type_from_spark(t["elementType"], f"{path}.element")
        return pa.list_(pa.field("item", elem, nullable=bool(t.get("containsNull", True))))
    if kind == "map":
        key = _type_from_spark(t["keyType"], f"{path}.key")
        val = _type_from_spark(t["valueType"], f"{path}.value")
        return pa.map_(key, pa.field("value", val, nullable=bool(t.get("valueContainsNull", True))))
    raise InvalidInputError(f"column {path!r}: unsupported Spark type {orjson.dumps(t).decode()}")


# --------------------------------------------------------------------------- canonical types


def canonical_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a table stores for ``schema`` (see module doc); rejects unsupported types,
    and names or field metadata the log cannot hold (:func:`eventlog.userinput.check_schema`)."""
    if not isinstance(schema, pa.Schema):
        raise InvalidInputError(f"a table schema must be a pyarrow.Schema, got {type(schema).__name__}")
    check_schema(schema)
    seen: dict[str, str] = {}
    for name in schema.names:
        if name.lower() in seen:
            raise InvalidInputError(
                f"duplicate column {name!r} (clashes with {seen[name.lower()]!r}; Delta column "
                "names are case-insensitive)"
            )
        seen[name.lower()] = name
    return pa.schema([_canonical_field(f, f.name) for f in schema])


def _canonical_field(f: pa.Field, path: str) -> pa.Field:
    t = _canonical_type(f.type, path)
    return f if t is f.type else pa.field(f.name, t, nullable=f.nullable, metadata=f.metadata)


def _canonical_type(t: pa.DataType, path: str) -> pa.DataType:
    types = pa.types
    if types.is_dictionary(t):
        return _canonical_type(t.value_type, path)
    if types.is_run_end_encoded(t):
        return _canonical_type(t.value_type, path)
    if types.is_boolean(t) or types.is_signed_integer(t) or t in (pa.float32(), pa.float64()):
        return t
    if types.is_unsigned_integer(t):
        if t.bit_width == 64:
            raise InvalidInputError(f"column {path!r}: uint64 has no lossless Delta type; cast to int64")
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}[t.bit_width]
    if t == pa.float16():
        return pa.float32()
    if types.is_string(t) or types.is_large_string(t) or types.is_string_view(t):
        return pa.string()
    if types.is_binary(t) or types.is_large_binary(t) or types.is_binary_view(t):
        return pa.binary()
    if types.is_fixed_size_binary(t) and not types.is_decimal(t):
        return pa.binary()
    if types.is_date(t):
        return pa.date32()
    if types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
    if types.is_decimal(t):
        if t.precision > 38:
            raise InvalidInputError(f"column {path!r}: decimal precision {t.precision} exceeds 38")
        return t if types.is_decimal128(t) else pa.decimal128(t.precision, t.scale)
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t) or _is_list_view(t):
        vf = t.value_field
        return pa.list_(pa.field("item", _canonical_type(vf.type, f"{path}.element"), vf.nullable))
    if types.is_map(t):
        key = _canonical_type(t.key_type, f"{path}.key")
        item = _canonical_type(t.item_type, f"{path}.value")
        return pa.map_(key, pa.field("value", item, nullable=t.item_field.nullable))
    if types.is_struct(t):
        if t.num_fields == 0:
            raise InvalidInputError(f"column {path!r}: a struct needs at least one field")
        names = [t.field(i).name for i in range(t.num_fields)]
        if len({n.lower() for n in names}) != len(names):
            raise InvalidInputError(f"column {path!r}: duplicate nested field names {names}")
        return pa.struct(
            [_canonical_field(t.field(i), f"{path}.{t.field(i).name}") for i in range(t.num_fields)]
        )
    raise InvalidInputError(f"column {path!r}: type {t} is not supported by Delta tables")


def _is_list_view(t: pa.DataType) -> bool:
    return bool(pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def needs_timestamp_ntz(schema: pa.Schema) -> bool:
    """True when any column (nested too) is a naive timestamp (Delta feature ``timestampNtz``)."""

    def walk(t: pa.DataType) -> bool:
        if pa.types.is_timestamp(t):
            return t.tz is None
        if pa.types.is_struct(t):
            return any(walk(t.field(i).type) for i in range(t.num_fields))
        if pa.types.is_map(t):
            return walk(t.key_type) or walk(t.item_type)
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return walk(t.value_type)
        if pa.types.is_dictionary(t):
            return walk(t.value_type)
        return False

    return any(walk(f.type) for f in schema)
