"""Partition values: Delta's string form of a typed partition value and back
(:func:`encode_partition_value`, :func:`decode_partition_value`, following the protocol's
"Partition Value Serialization"), and :func:`partition_values_table`, which types the string
partition values of many files at once. An empty string means null for *every* type, so an
empty string written to a string partition column reads back as null (Spark's behaviour too);
binary values are stored one character per byte (U+0000-U+00FF).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import InvalidInputError, InvalidTextError
from eventlog.userinput import MAX_PARTITION_COLUMN_BYTES, preview

UTC = dt.UTC
# Hive/Spark ExternalCatalogUtils.charToEscape (plus NUL).
_ESCAPED = {chr(c) for c in range(0x00, 0x20)} | set("\"#%'*/:=?\\\x7f{[]^")
# Decimal arithmetic on 38-digit values needs more than the default 28 digits of precision.
_DEC = decimal.Context(prec=100)
_EPOCH = dt.datetime(1970, 1, 1)


def escape_path_name(value: str) -> str:
    """Escape a partition directory component like Hive/Spark (``%XX`` for unsafe chars)."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def check_partition_column(name: str) -> str:
    """A partition column name short enough for a partition directory name."""
    size = len(escape_path_name(name).encode("utf-8"))
    if size > MAX_PARTITION_COLUMN_BYTES:
        raise InvalidTextError(
            f"partition column {preview(name)} is {size} bytes long as a directory name; the "
            f"limit is {MAX_PARTITION_COLUMN_BYTES} (MAX_PARTITION_COLUMN_BYTES)",
            argument="partition column name",
            reason="too long",
        )
    return name


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
        fast = _vector_cast(raw, t)
        if fast is not None:
            return fast
    # Arrow's cast rejects whole arrays over one value it cannot parse (a date written with a
    # time part, a decimal with more digits than its scale, an out-of-range integer): the
    # per-value decoder then parses what it can and names the value it cannot.
    return pa.array([None if s is None else slow(s) for s in raw.to_pylist()], t)


def _vector_cast(raw: pa.Array, t: pa.DataType) -> pa.Array | None:
    """Arrow's vectorised string cast, or None when Arrow cannot parse every value."""
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
        return None
