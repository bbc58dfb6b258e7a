"""Delta's type widening (the ``typeWidening`` table feature): which column type changes are
allowed, and how each is recorded in the schema.

The changes are Delta 4's (its documentation's table, and the protocol's "Type Widening"):

* integers to wider integers: byte -> short -> int -> long;
* byte, short and int to double; float to double;
* any integer to a decimal with at least its digits before the point (3, 5, 10, 20);
* decimal(p, s) to decimal(p + k1, s + k2) with k1 >= k2 >= 0;
* date to timestamp_ntz.

Each change is appended to the field's ``delta.typeChanges`` metadata
(``{"fromType": ..., "toType": ...}``, plus ``"tableVersion"`` on tables with the preview
feature). Data files written before a change keep their narrower Parquet type; readers cast
them to the table's type, and statistics written under the old type stay valid bounds once
cast (integers, floats and decimals), so they keep serving data skipping. Changing a
partition column's type is refused for changes whose partition values would not parse as the
new type the same way (to decimal, to double and date to timestamp_ntz), as Delta refuses
them.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

__all__ = [
    "TYPE_CHANGES_KEY",
    "TYPE_WIDENING_PROPERTY",
    "delta_type_name",
    "type_changes",
    "widening_allowed",
    "with_type_change",
]

TYPE_WIDENING_PROPERTY = "delta.enableTypeWidening"
TYPE_CHANGES_KEY = "delta.typeChanges"

_INTEGER_WIDTH = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}
# Digits an integer type needs before the decimal point.
_INTEGER_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}
_DELTA_NAMES = {
    pa.int8(): "byte",
    pa.int16(): "short",
    pa.int32(): "integer",
    pa.int64(): "long",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.date32(): "date",
    pa.timestamp("us"): "timestamp_ntz",
}


def delta_type_name(t: pa.DataType) -> str:
    """Delta's name of a primitive type, as ``delta.typeChanges`` records it."""
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    name = _DELTA_NAMES.get(t)
    return name if name is not None else str(t)


def widening_allowed(src: pa.DataType, dst: pa.DataType, *, partition_column: bool = False) -> bool:
    """Whether Delta's type widening may change a column of type ``src`` to ``dst``."""
    src_width, dst_width = _INTEGER_WIDTH.get(src), _INTEGER_WIDTH.get(dst)
    if src_width is not None and dst_width is not None:
        return src_width < dst_width
    if partition_column:
        return False  # the partition values of the other changes are written differently
    if dst == pa.float64():
        return src == pa.float32() or (src_width is not None and src_width <= 32)
    if pa.types.is_decimal(dst):
        if src_width is not None:
            return bool(dst.precision - dst.scale >= _INTEGER_DIGITS[src_width])
        if pa.types.is_decimal(src):
            more_digits, more_scale = dst.precision - src.precision, dst.scale - src.scale
            return bool(more_digits >= more_scale >= 0 and (more_digits, more_scale) != (0, 0))
        return False
    return bool(src == pa.date32() and dst == pa.timestamp("us"))


def type_changes(field: pa.Field) -> list[dict[str, Any]]:
    """The type changes recorded on ``field`` (oldest first)."""
    raw = (field.metadata or {}).get(TYPE_CHANGES_KEY.encode())
    if raw is None:
        return []
    value = orjson.loads(raw)
    return list(value) if isinstance(value, list) else []


def with_type_change(field: pa.Field, new_type: pa.DataType, *, table_version: int | None = None) -> pa.Field:
    """``field`` with type ``new_type`` and the change appended to its ``delta.typeChanges``
    (``table_version``: the version the change commits at, which the preview feature records)."""
    change: dict[str, Any] = {"fromType": delta_type_name(field.type), "toType": delta_type_name(new_type)}
    if table_version is not None:
        change["tableVersion"] = table_version
    meta = dict(field.metadata or {})
    meta[TYPE_CHANGES_KEY.encode()] = orjson.dumps([*type_changes(field), change])
    return pa.field(field.name, new_type, nullable=field.nullable, metadata=meta)
