"""Table schemas: Spark JSON codec, canonical Arrow types, write-time enforcement, partition
values and per-file statistics.

A table stores its schema as Spark's JSON schema string (Delta PROTOCOL.md, "Schema
Serialization Format"). In Arrow the table schema is always *canonical*: one Arrow type per
Delta type (``string`` not ``large_string``, ``timestamp[us, tz=UTC]`` for ``timestamp``,
naive ``timestamp[us]`` for ``timestamp_ntz``...). Spark column metadata is kept in the Arrow
field metadata, each value JSON-encoded, so schemas round-trip exactly.

Decisions worth knowing:

* :func:`conform` allows only lossless widening casts, with one exception: timestamps with a
  finer unit (ns) are *truncated* to microseconds, as Spark and Delta do on write.
* Partition values follow "Partition Value Serialization": an empty string means null for
  *every* type, so an empty string written to a string partition column reads back as null
  (Spark's behaviour too). Binary values are stored one character per byte (U+0000-U+00FF).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import io
import json
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from eventlog.errors import InvalidInputError, SchemaMismatchError

__all__ = [
    "canonical_schema",
    "conform",
    "decode_partition_value",
    "encode_partition_value",
    "from_spark_schema_json",
    "merge_schema",
    "needs_timestamp_ntz",
    "partition_values_table",
    "stats_table",
    "to_spark_schema_json",
]

UTC = dt.UTC
# Decimal arithmetic on 38-digit values needs more than the default 28 digits of precision.
_DEC = decimal.Context(prec=100)
_EPOCH = dt.datetime(1970, 1, 1)

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
    """The schema a table stores for ``schema`` (see module doc); rejects unsupported types."""
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


# --------------------------------------------------------------------------- enforcement

_MERGE_HINT = "; to add columns, write with schema merging enabled (mergeSchema)"


def _widens(src: pa.DataType, dst: pa.DataType) -> bool:
    """True when every value of ``src`` converts to ``dst`` without loss (struct names aside)."""
    types = pa.types
    if types.is_dictionary(src) or types.is_run_end_encoded(src):
        return _widens(src.value_type, dst)
    if src == dst or types.is_null(src):
        return True
    if types.is_signed_integer(dst):
        if types.is_signed_integer(src):
            return bool(src.bit_width <= dst.bit_width)
        return bool(types.is_unsigned_integer(src) and src.bit_width < dst.bit_width)
    if types.is_floating(dst):
        if types.is_floating(src):
            return bool(src.bit_width <= dst.bit_width)
        mantissa = 24 if dst.bit_width == 32 else 53
        return bool(types.is_integer(src) and src.bit_width < mantissa)
    if types.is_decimal(dst):
        if types.is_decimal(src):
            return bool(src.scale <= dst.scale and src.precision - src.scale <= dst.precision - dst.scale)
        if types.is_integer(src):
            digits = {8: 3, 16: 5, 32: 10, 64: 20}[src.bit_width]
            return bool(digits <= dst.precision - dst.scale)
        return False
    if types.is_string(dst):
        return bool(types.is_string(src) or types.is_large_string(src) or types.is_string_view(src))
    if types.is_binary(dst):
        return bool(
            types.is_large_binary(src)
            or types.is_binary_view(src)
            or (types.is_fixed_size_binary(src) and not types.is_decimal(src))
        )
    if types.is_date32(dst):
        return bool(types.is_date(src))
    if types.is_timestamp(dst):
        # ns -> us truncates sub-microsecond digits: accepted on purpose (Spark does the same).
        return bool(types.is_timestamp(src) and (src.tz is None) == (dst.tz is None))
    return False


def _type_problems(src: pa.DataType, dst: pa.DataType, path: str) -> list[tuple[str, str]]:
    """(column path, description) for every incompatibility of ``src`` written as ``dst``."""
    types = pa.types
    if types.is_dictionary(src):
        src = src.value_type
    if types.is_struct(dst) and types.is_struct(src):
        problems: list[tuple[str, str]] = []
        src_names = {src.field(i).name: src.field(i) for i in range(src.num_fields)}
        dst_names = {dst.field(i).name for i in range(dst.num_fields)}
        for name, f in src_names.items():
            if name not in dst_names:
                problems.append(
                    (f"{path}.{name}", f"nested field {path}.{name} ({f.type}) is not in the table")
                )
        for i in range(dst.num_fields):
            df = dst.field(i)
            sf = src_names.get(df.name)
            if sf is None:
                if not df.nullable:
                    problems.append(
                        (f"{path}.{df.name}", f"non-nullable nested field {path}.{df.name} is missing")
                    )
                continue
            problems.extend(_type_problems(sf.type, df.type, f"{path}.{df.name}"))
        return problems
    src_is_list = (
        types.is_list(src) or types.is_large_list(src) or types.is_fixed_size_list(src) or _is_list_view(src)
    )
    if types.is_list(dst) and src_is_list:
        return _type_problems(src.value_type, dst.value_type, f"{path}.element")
    if types.is_map(dst) and types.is_map(src):
        return _type_problems(src.key_type, dst.key_type, f"{path}.key") + _type_problems(
            src.item_type, dst.item_type, f"{path}.value"
        )
    if _widens(src, dst):
        return []
    return [(path, f"{path}: data type {src} cannot be written to table type {dst}")]


def conform(data: pa.Table | pa.RecordBatch, table_schema: pa.Schema, *, context: str = "append") -> pa.Table:
    """Schema enforcement on write: ``data`` cast to exactly ``table_schema``.

    Missing nullable columns are filled with nulls; extra columns, missing non-nullable
    columns, non-widening type changes and nulls in non-nullable fields raise
    :class:`SchemaMismatchError` naming every offending column. Columns that already have the
    table type are reused as-is (no copy).
    """
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    names = data.column_names
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise SchemaMismatchError(f"{context}: duplicate columns {dups} in the data", columns=dups)
    table_names = table_schema.names
    lower = {n.lower(): n for n in table_names}
    extra = [n for n in names if n not in table_schema.names]
    if extra:
        hints = [
            f"{n!r} differs only in case from table column {lower[n.lower()]!r} (names are case-sensitive)"
            for n in extra
            if n.lower() in lower
        ]
        detail = f" ({'; '.join(hints)})" if hints else _MERGE_HINT
        raise SchemaMismatchError(
            f"{context}: columns {extra} are not in the table schema {table_names}{detail}", columns=extra
        )
    missing_required = [f.name for f in table_schema if f.name not in names and not f.nullable]
    if missing_required:
        raise SchemaMismatchError(
            f"{context}: non-nullable columns {missing_required} are missing from the data",
            columns=missing_required,
        )
    problems: list[tuple[str, str]] = []
    for f in table_schema:
        if f.name in names:
            problems.extend(_type_problems(data.schema.field(f.name).type, f.type, f.name))
    if problems:
        raise SchemaMismatchError(
            f"{context}: incompatible column types: " + "; ".join(p[1] for p in problems),
            columns=[p[0] for p in problems],
        )
    columns: list[pa.ChunkedArray] = []
    for f in table_schema:
        if f.name not in names:
            columns.append(pa.chunked_array([pa.nulls(data.num_rows, f.type)], f.type))
            continue
        col = data.column(f.name)
        if not _identical(col.type, f.type):
            col = _cast_column(col, f, context)
        columns.append(col)
    bad = [path for f, col in zip(table_schema, columns, strict=True) for path in _null_violations(col, f)]
    if bad:
        raise SchemaMismatchError(f"{context}: null values in non-nullable columns {bad}", columns=bad)
    return pa.Table.from_arrays(columns, schema=table_schema)


def _cast_column(col: pa.ChunkedArray, f: pa.Field, context: str) -> pa.ChunkedArray:
    try:
        return pc.cast(col, options=pc.CastOptions(f.type, allow_time_truncate=True))
    except pa.ArrowInvalid as exc:
        # Arrow validates nested nullability while casting; redo the cast with every nested
        # field nullable so the error can name the offending fields.
        try:
            relaxed = pc.cast(col, options=pc.CastOptions(_relaxed(f.type), allow_time_truncate=True))
            bad = _null_violations(relaxed, f.with_type(f.type))
        except pa.ArrowInvalid:
            bad = []
        columns = bad or [f.name]
        raise SchemaMismatchError(
            f"{context}: cannot write column(s) {columns}: {exc}", columns=columns
        ) from exc


def _relaxed(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable."""
    if pa.types.is_struct(t):
        return pa.struct(
            [t.field(i).with_type(_relaxed(t.field(i).type)).with_nullable(True) for i in range(t.num_fields)]
        )
    if pa.types.is_list(t):
        return pa.list_(pa.field("item", _relaxed(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field("value", _relaxed(t.item_type)))
    return t


def _identical(a: pa.DataType, b: pa.DataType) -> bool:
    # DataType equality ignores list/map child names; str() shows them, and the result must be
    # exactly the table type.
    return bool(a.equals(b)) and str(a) == str(b)


def _null_violations(col: pa.ChunkedArray, f: pa.Field) -> list[str]:
    if not f.nullable and col.null_count:
        return [f.name]
    if not _has_required_nested(f.type):
        return []
    out: list[str] = []
    for chunk in col.chunks:
        out.extend(_nested_nulls(chunk, f.type, f.name))
    return sorted(set(out))


def _has_required_nested(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(
            not t.field(i).nullable or _has_required_nested(t.field(i).type) for i in range(t.num_fields)
        )
    if pa.types.is_list(t):
        return not t.value_field.nullable or _has_required_nested(t.value_type)
    if pa.types.is_map(t):
        return not t.item_field.nullable or _has_required_nested(t.item_type)
    return False


def _nested_nulls(arr: pa.Array, t: pa.DataType, path: str) -> list[str]:
    """Paths of non-nullable nested fields holding nulls where their parent is valid."""
    out: list[str] = []
    if pa.types.is_struct(t):
        valid = arr.is_valid()
        for i in range(t.num_fields):
            cf = t.field(i)
            child = arr.field(i)
            if not cf.nullable and pc.any(pc.and_(valid, child.is_null())).as_py():
                out.append(f"{path}.{cf.name}")
            if _has_required_nested(cf.type):
                # Children under a null parent are ignored: keep only rows whose parent is valid.
                out.extend(_nested_nulls(child.filter(valid), cf.type, f"{path}.{cf.name}"))
    elif pa.types.is_list(t):
        out.extend(_values_nulls(arr.flatten(), t.value_field, f"{path}.element"))
    elif pa.types.is_map(t):
        # MapArray.items ignores slicing; cut it to this array's offsets.
        offsets = arr.offsets
        start = offsets[0].as_py() if len(offsets) else 0
        end = offsets[-1].as_py() if len(offsets) else 0
        out.extend(_values_nulls(arr.items.slice(start, end - start), t.item_field, f"{path}.value"))
    return out


def _values_nulls(values: pa.Array, vf: pa.Field, name: str) -> list[str]:
    out: list[str] = []
    if not vf.nullable and values.null_count:
        out.append(name)
    if _has_required_nested(vf.type):
        out.extend(_nested_nulls(values.filter(values.is_valid()), vf.type, name))
    return out


def merge_schema(table_schema: pa.Schema, data_schema: pa.Schema) -> pa.Schema:
    """Schema after a mergeSchema write: new columns (and nested fields) appended as nullable.

    Same-name columns keep the table type; the data type must widen to it (see :func:`conform`).
    """
    data_schema = canonical_schema(data_schema)
    problems: list[tuple[str, str]] = []
    fields = [
        _merge_field(f, data_schema.field(f.name), f.name, problems) if f.name in data_schema.names else f
        for f in table_schema
    ]
    fields.extend(_new_fields(table_schema.names, list(data_schema), "", problems))
    if problems:
        raise SchemaMismatchError(
            "cannot merge schemas: " + "; ".join(p[1] for p in problems), columns=[p[0] for p in problems]
        )
    return pa.schema(fields, metadata=table_schema.metadata)


def _new_fields(
    existing: list[str], candidates: list[pa.Field], parent: str, problems: list[tuple[str, str]]
) -> list[pa.Field]:
    lower = {n.lower(): n for n in existing}
    out = []
    for f in candidates:
        if f.name in existing:
            continue
        path = f"{parent}.{f.name}" if parent else f.name
        if f.name.lower() in lower:
            problems.append((path, f"{path} differs only in case from existing {lower[f.name.lower()]!r}"))
            continue
        # Files written before the merge lack this column, so it must accept nulls.
        out.append(f.with_nullable(True))
    return out


def _merge_field(tf: pa.Field, df: pa.Field, path: str, problems: list[tuple[str, str]]) -> pa.Field:
    merged = _merge_type(tf.type, df.type, path, problems)
    return tf if merged is tf.type else tf.with_type(merged)


def _merge_type(t: pa.DataType, d: pa.DataType, path: str, problems: list[tuple[str, str]]) -> pa.DataType:
    if pa.types.is_struct(t) and pa.types.is_struct(d):
        d_fields = {d.field(i).name: d.field(i) for i in range(d.num_fields)}
        t_fields = [t.field(i) for i in range(t.num_fields)]
        fields = [
            _merge_field(f, d_fields[f.name], f"{path}.{f.name}", problems) if f.name in d_fields else f
            for f in t_fields
        ]
        fields.extend(_new_fields([f.name for f in t_fields], list(d_fields.values()), path, problems))
        return pa.struct(fields)
    if pa.types.is_list(t) and pa.types.is_list(d):
        vt = _merge_type(t.value_type, d.value_type, f"{path}.element", problems)
        return t if vt is t.value_type else pa.list_(t.value_field.with_type(vt))
    if pa.types.is_map(t) and pa.types.is_map(d):
        _merge_type(t.key_type, d.key_type, f"{path}.key", problems)
        vt = _merge_type(t.item_type, d.item_type, f"{path}.value", problems)
        return t if vt is t.item_type else pa.map_(t.key_type, t.item_field.with_type(vt))
    if not _widens(d, t):
        problems.append((path, f"{path}: data type {d} is incompatible with table type {t}"))
    return t


# --------------------------------------------------------------------------- partition values


def encode_partition_value(value: Any, type: pa.DataType) -> str | None:
    """Delta's string form of a partition value (None for null and for empty strings)."""
    if isinstance(value, pa.Scalar):
        value = value.as_py()
    if value is None:
        return None
    t = type
    try:
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return str(value) or None
        if pa.types.is_boolean(t):
            if not isinstance(value, bool):
                raise TypeError("expected a bool")
            return "true" if value else "false"
        if pa.types.is_integer(t):
            if isinstance(value, bool | float):
                raise TypeError("expected an integer")
            return str(int(value))
        if pa.types.is_floating(t):
            return _format_float(float(value), t.bit_width == 32)
        if pa.types.is_decimal(t):
            d = value if isinstance(value, Decimal) else Decimal(str(value))
            d = d.quantize(Decimal(1).scaleb(-t.scale), context=_DEC)
            if len(d.as_tuple().digits) > t.precision:
                raise ValueError(f"more than {t.precision} digits")
            return format(d, "f")
        if pa.types.is_date(t):
            if isinstance(value, dt.datetime):
                value = value.date()
            if not isinstance(value, dt.date):
                raise TypeError("expected a date")
            return value.isoformat()
        if pa.types.is_timestamp(t):
            return _format_partition_ts(value, t)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return bytes(value).decode("latin-1") or None
    except (TypeError, ValueError, InvalidOperation, OverflowError) as exc:
        raise InvalidInputError(f"cannot encode partition value {value!r} as {t}: {exc}") from exc
    raise InvalidInputError(f"type {t} cannot be a partition column type")


def _format_float(v: float, single: bool) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    if not single:
        return repr(v)
    f32 = struct.unpack("f", struct.pack("f", v))[0]
    for digits in range(1, 10):  # shortest decimal form that reads back as the same float32
        s = f"{f32:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(s)))[0] == f32:
            return repr(float(s))
    return repr(f32)


def _format_partition_ts(value: Any, t: pa.TimestampType) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = _EPOCH + dt.timedelta(microseconds=value)
    if not isinstance(value, dt.datetime):
        raise TypeError("expected a datetime")
    if value.tzinfo is not None:
        if t.tz is None:
            raise ValueError("a timezone-aware datetime for a timestamp_ntz column")
        value = value.astimezone(UTC).replace(tzinfo=None)
    return f"{value.year:04d}-{value:%m-%d %H:%M:%S}.{value.microsecond:06d}"


def _int_fits(v: int, t: pa.DataType) -> bool:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return bool(0 <= v < 2**bits)
    return bool(-(2 ** (bits - 1)) <= v < 2 ** (bits - 1))


def _as_float(v: float, t: pa.DataType) -> float:
    """``v`` rounded to ``t``'s precision (the value Arrow would hold)."""
    if t.bit_width == 64:
        return v
    try:
        return float(struct.unpack("f", struct.pack("f", v))[0])
    except OverflowError:
        return math.copysign(math.inf, v)


def decode_partition_value(value: str | None, type: pa.DataType) -> Any:
    """Inverse of :func:`encode_partition_value`: a Python value (None for null or "")."""
    if value is None or value == "":
        return None
    t = type
    try:
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return value
        if pa.types.is_boolean(t):
            low = value.lower()
            if low not in ("true", "false"):
                raise ValueError("expected true or false")
            return low == "true"
        if pa.types.is_integer(t):
            if not _int_fits(int(value), t):
                raise ValueError("out of range")
            return int(value)
        if pa.types.is_floating(t):
            return _as_float(float(value), t)
        if pa.types.is_decimal(t):
            return Decimal(value)
        if pa.types.is_date(t):
            return dt.date.fromisoformat(value[:10])
        if pa.types.is_timestamp(t):
            parsed = dt.datetime.fromisoformat(value)
            if t.tz is None:
                return parsed.replace(tzinfo=None)
            # Delta stores timestamp partition values without a zone: they are UTC.
            return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            try:
                return value.encode("latin-1")
            except UnicodeEncodeError:  # written by a writer that used UTF-8 text
                return value.encode()
    except (ValueError, InvalidOperation) as exc:
        raise InvalidInputError(f"invalid partition value {value!r} for type {t}: {exc}") from exc
    raise InvalidInputError(f"type {t} cannot be a partition column type")


def partition_values_table(
    values: Sequence[Mapping[str, str | None]], partition_schema: pa.Schema
) -> pa.Table:
    """Typed table of partition values, one row per mapping (missing key or "" = null)."""
    columns = []
    for f in partition_schema:
        raw = pa.array([m.get(f.name) or None for m in values], pa.string())
        columns.append(_cast_strings(raw, f.type, functools.partial(_decode_as, f.type)))
    return pa.Table.from_arrays(columns, schema=pa.schema([f.with_nullable(True) for f in partition_schema]))


def _decode_as(t: pa.DataType, value: str) -> Any:
    return decode_partition_value(value, t)


def _cast_strings(raw: pa.Array, t: pa.DataType, slow: Callable[[str], Any]) -> pa.Array:
    """Vectorised string -> ``t`` conversion, falling back to ``slow`` per value."""
    if pa.types.is_string(t):
        return raw
    if not pa.types.is_binary(t):
        try:
            if pa.types.is_timestamp(t) and t.tz is not None:
                try:
                    return raw.cast(t)
                except pa.ArrowInvalid:  # zone-less strings are UTC: parse naive, then relabel
                    return raw.cast(pa.timestamp(t.unit)).cast(t)
            if pa.types.is_boolean(t):
                raw = pc.utf8_lower(raw)
            return raw.cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return pa.array([None if s is None else slow(s) for s in raw.to_pylist()], t)


# --------------------------------------------------------------------------- stats


def _stat_leaves(schema: pa.Schema) -> list[tuple[tuple[str, ...], pa.DataType]]:
    """(path, type) of every non-struct leaf, depth first (lists and maps are leaves)."""
    out: list[tuple[tuple[str, ...], pa.DataType]] = []

    def walk(prefix: tuple[str, ...], t: pa.DataType) -> None:
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk((*prefix, t.field(i).name), t.field(i).type)
        else:
            out.append((prefix, t))

    for f in schema:
        walk((f.name,), f.type)
    return out


def _has_minmax(t: pa.DataType) -> bool:
    types = pa.types
    return bool(
        types.is_integer(t)
        or types.is_floating(t)
        or types.is_decimal(t)
        or types.is_boolean(t)
        or types.is_string(t)
        or types.is_date(t)
        or types.is_timestamp(t)
    )


def _json_type(t: pa.DataType) -> pa.DataType:
    """How a stats value of type ``t`` appears in JSON, for Arrow's JSON reader."""
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64()
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return pa.string()
    return t


def _nest(leaves: list[tuple[tuple[str, ...], pa.DataType]]) -> pa.DataType:
    tree: dict[str, Any] = {}
    for path, t in leaves:
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = t

    def build(node: dict[str, Any]) -> pa.DataType:
        return pa.struct([(k, build(v) if isinstance(v, dict) else v) for k, v in node.items()])

    return build(tree)


def stats_table(stats: Sequence[str | None], schema: pa.Schema, num_files: int | None = None) -> pa.Table:
    """Parse add-action stats JSON into one row per file.

    Columns: ``numRecords``; per primitive leaf ``c`` (dotted path): ``min.c`` and ``max.c``
    typed as the column; per leaf (lists and maps included): ``nullCount.c``. Missing or
    unparseable stats give nulls. Values are as stored: writers other than this library
    truncate timestamp maxima to milliseconds, so skipping on ``max`` of a timestamp should
    allow for one extra millisecond. ``num_files`` (default ``len(stats)``) pads with null rows.
    """
    n = len(stats) if num_files is None else num_files
    if len(stats) > n:
        raise InvalidInputError(f"{len(stats)} stats strings for {n} files")
    leaves = _stat_leaves(schema)
    mm = [(p, t) for p, t in leaves if _has_minmax(t)]
    out_fields = [pa.field("numRecords", pa.int64())]
    for prefix in ("min", "max"):
        out_fields += [pa.field(f"{prefix}.{'.'.join(p)}", t) for p, t in mm]
    out_fields += [pa.field(f"nullCount.{'.'.join(p)}", pa.int64()) for p, _ in leaves]
    out_schema = pa.schema(out_fields)
    padded = list(stats) + [None] * (n - len(stats))
    if n == 0:
        return out_schema.empty_table()
    try:
        columns = _stats_columns_fast(padded, mm, leaves)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, KeyError):
        columns = _stats_columns_slow(padded, mm, leaves)
    return pa.Table.from_arrays(columns, schema=out_schema)


def _stats_columns_fast(
    stats: list[str | None],
    mm: list[tuple[tuple[str, ...], pa.DataType]],
    leaves: list[tuple[tuple[str, ...], pa.DataType]],
) -> list[pa.Array]:
    # Arrow's JSON reader parses all files at once in C++ (and decimals exactly); any surprise
    # in the input raises and the caller falls back to the per-value Python parser.
    fields = [pa.field("numRecords", pa.int64())]
    if mm:
        json_leaves = [(p, _json_type(t)) for p, t in mm]
        fields += [pa.field("minValues", _nest(json_leaves)), pa.field("maxValues", _nest(json_leaves))]
    if leaves:
        fields.append(pa.field("nullCount", _nest([(p, pa.int64()) for p, _ in leaves])))
    body = "\n".join([s or "{}" for s in stats]).encode()
    if body.count(b"\n") != len(stats) - 1:
        raise ValueError("stats spanning several lines")
    opts = pajson.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore")
    parsed = pajson.read_json(io.BytesIO(body), parse_options=opts)
    if parsed.num_rows != len(stats):
        raise ValueError("row count mismatch")
    flat = parsed
    while any(pa.types.is_struct(c.type) for c in flat.columns):
        flat = flat.flatten()
    cols = [flat.column("numRecords").combine_chunks()]
    for group in ("minValues", "maxValues"):
        for p, t in mm:
            col = flat.column(f"{group}.{'.'.join(p)}").combine_chunks()
            cols.append(_cast_strings(col, t, _raise) if pa.types.is_string(col.type) else col.cast(t))
    cols += [flat.column(f"nullCount.{'.'.join(p)}").combine_chunks() for p, _ in leaves]
    return cols


def _raise(_: str) -> Any:
    raise ValueError("unparseable stats value")


def _stats_columns_slow(
    stats: list[str | None],
    mm: list[tuple[tuple[str, ...], pa.DataType]],
    leaves: list[tuple[tuple[str, ...], pa.DataType]],
) -> list[pa.Array]:
    docs: list[dict[str, Any]] = []
    for s in stats:
        try:
            # The stdlib parser keeps numbers exact (Decimal); this path only runs for odd input.
            d = json.loads(s, parse_float=Decimal) if s else {}
        except ValueError:
            d = {}
        docs.append(d if isinstance(d, dict) else {})

    def get(d: Any, path: tuple[str, ...]) -> Any:
        for part in path:
            if not isinstance(d, dict):
                return None
            d = d.get(part)
        return d

    cols = [pa.array([_as_int(d.get("numRecords")) for d in docs], pa.int64())]
    for group, up in (("minValues", False), ("maxValues", True)):
        for p, t in mm:
            cols.append(pa.array([_stat_value(get(d.get(group), p), t, up) for d in docs], t))
    for p, _ in leaves:
        cols.append(pa.array([_as_int(get(d.get("nullCount"), p)) for d in docs], pa.int64()))
    return cols


def _as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _stat_value(v: Any, t: pa.DataType, upper: bool) -> Any:
    """One JSON stats value as a Python value of type ``t`` (None when unusable)."""
    if v is None:
        return None
    try:
        if pa.types.is_boolean(t):
            return v if isinstance(v, bool) else None
        if pa.types.is_integer(t):
            i = _as_int(v)
            return i if i is not None and _int_fits(i, t) else None
        if isinstance(v, bool) and not pa.types.is_boolean(t):
            return None
        if pa.types.is_floating(t):
            f = float(v) if isinstance(v, int | float | Decimal) else math.nan
            return None if math.isnan(f) else _as_float(f, t)
        if pa.types.is_string(t):
            return v if isinstance(v, str) else None
        if pa.types.is_decimal(t):
            if not isinstance(v, int | Decimal | str):
                return None
            rounding = ROUND_CEILING if upper else ROUND_FLOOR  # keep the bound a bound
            q = Decimal(v).quantize(Decimal(1).scaleb(-t.scale), rounding=rounding, context=_DEC)
            return q if len(q.as_tuple().digits) <= t.precision else None
        if pa.types.is_date(t):
            return dt.date.fromisoformat(v[:10])
        if pa.types.is_timestamp(t):
            parsed = dt.datetime.fromisoformat(v)
            if t.tz is None:
                return parsed.replace(tzinfo=None)
            return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, TypeError, InvalidOperation, OverflowError):
        return None
    return None
