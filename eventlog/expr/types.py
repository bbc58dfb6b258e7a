"""Private Arrow type helpers shared by the expression modules: the natural type of a
Python literal, the coarse type families (:func:`_kind`) used for type checking and
coercion, the common type two operands are cast to, the SQL-expressible canonical type and
its Spark SQL spelling. Nothing here knows about expression nodes or SQL syntax.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa

from eventlog.errors import PredicateError

_BOOL = pa.bool_()
_F64 = pa.float64()
_UTC = dt.UTC

# --------------------------------------------------------------------------- types


def _decimal_type(d: Decimal) -> pa.DataType:
    _, digits, exponent = d.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"{d} is not a finite decimal")
    scale = max(0, -exponent)
    precision = max(len(digits) + max(0, exponent), scale, 1)
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _natural_type(value: Any) -> pa.DataType:
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return pa.int64() if -(2**63) <= value < 2**63 else _decimal_type(Decimal(value))
    if isinstance(value, float):
        return _F64
    if isinstance(value, Decimal):
        return _decimal_type(value)
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, bytes):
        return pa.binary()
    if isinstance(value, dt.datetime):  # before date: datetime is a date subclass
        return pa.timestamp("us", "UTC" if value.tzinfo is not None else None)
    if isinstance(value, dt.date):
        return pa.date32()
    raise TypeError(f"unsupported literal value {value!r}")


def _kind(t: pa.DataType | None) -> str:
    """Coarse type family used for type checking and coercion."""
    if t is None or pa.types.is_null(t):
        return "null"
    for kind, test in _KINDS:
        if test(t):
            return kind
    return "other"


_KINDS: tuple[tuple[str, Callable[[pa.DataType], bool]], ...] = (
    ("bool", pa.types.is_boolean),
    ("int", pa.types.is_integer),
    ("float", pa.types.is_floating),
    ("decimal", pa.types.is_decimal),
    ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view()),
    (
        "binary",
        lambda t: (
            pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t)
            or t == pa.binary_view()
        ),
    ),
    ("date", pa.types.is_date),
    ("timestamp", pa.types.is_timestamp),
)
_NUMERIC = frozenset({"int", "float", "decimal"})
_UNITS = {"s": 0, "ms": 1, "us": 2, "ns": 3}


def _canonical(t: pa.DataType) -> pa.DataType:
    """The SQL-expressible type closest to ``t`` (literals always carry one of these)."""
    kind = _kind(t)
    if kind == "int" and pa.types.is_unsigned_integer(t):
        return pa.int64() if t.bit_width < 64 else pa.decimal128(20, 0)
    if kind == "float":
        return pa.float32() if t.bit_width <= 32 else _F64
    if kind == "decimal" and t.precision <= 38:
        return pa.decimal128(t.precision, t.scale)
    simple = {"date": pa.date32(), "string": pa.string(), "binary": pa.binary()}
    if kind in simple:
        return simple[kind]
    if kind == "timestamp":
        return pa.timestamp("us", "UTC" if t.tz else None)
    return t


def _as_decimal(t: pa.DataType) -> pa.DataType:
    if pa.types.is_decimal(t):
        return t
    digits = {8: 3, 16: 5, 32: 10, 64: 20 if pa.types.is_unsigned_integer(t) else 19}[t.bit_width]
    return pa.decimal128(digits, 0)


def _common_type(a: pa.DataType | None, b: pa.DataType | None) -> pa.DataType | None:
    """The type both sides are cast to for a comparison, arithmetic or COALESCE (None: none)."""
    ka, kb = _kind(a), _kind(b)
    if ka == "null" or a == b:
        return b if ka == "null" else a
    if kb == "null":
        return a
    kinds = {ka, kb}
    if kinds == {"int"}:
        return pa.int64()
    if kinds <= _NUMERIC and "float" in kinds:
        return _F64
    if kinds <= {"int", "decimal"}:
        da, db = _as_decimal(a), _as_decimal(b)
        scale = max(da.scale, db.scale)
        precision = max(da.precision - da.scale, db.precision - db.scale) + scale
        if precision > 76:
            return _F64
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    if kinds <= {"date", "timestamp"}:
        stamps: list[Any] = [t for t in (a, b) if pa.types.is_timestamp(t)]
        unit = max((t.unit for t in stamps), key=_UNITS.__getitem__)
        return pa.timestamp(unit, next((t.tz for t in stamps if t.tz), None))
    if kinds in ({"string"}, {"binary"}):
        return pa.large_string() if ka == "string" else pa.large_binary()
    return None


def _comparable(a: pa.DataType | None, b: pa.DataType | None) -> bool:
    if "null" in (_kind(a), _kind(b)):
        return True
    if "other" in (_kind(a), _kind(b)):
        return a == b and _kind(a) != "other"
    return _common_type(a, b) is not None


_TYPE_NAMES = {
    _BOOL: "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    _F64: "DOUBLE",
    pa.string(): "STRING",
    pa.binary(): "BINARY",
    pa.date32(): "DATE",
    pa.timestamp("us", "UTC"): "TIMESTAMP",
    pa.timestamp("us"): "TIMESTAMP_NTZ",
}


def _type_sql(t: pa.DataType) -> str:
    c = _canonical(t)
    if pa.types.is_decimal(c):
        return f"DECIMAL({c.precision},{c.scale})"
    if c in _TYPE_NAMES:
        return _TYPE_NAMES[c]
    raise PredicateError(f"type {t} has no SQL spelling", expression=str(t))
