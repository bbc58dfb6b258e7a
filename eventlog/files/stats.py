"""Per-file statistics: :func:`stats_table` parses the ``stats`` JSON of add actions
(``numRecords``, ``minValues``, ``maxValues``, ``nullCount``) into one typed row per data
file, with Arrow's JSON reader when the input allows and an exact per-value Python parser
otherwise; missing or unusable values become nulls, and rounded decimal bounds stay bounds.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from eventlog.errors import InvalidInputError
from eventlog.files import column_mapping as cm
from eventlog.files.partition_values import _DEC, UTC, _as_float, _cast_strings, _int_fits

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


def stats_table(
    stats: Sequence[str | None] | pa.Array | pa.ChunkedArray, schema: pa.Schema, num_files: int | None = None
) -> pa.Table:
    """Parse add-action stats JSON into one row per file.

    Columns: ``numRecords``; per primitive leaf ``c`` (dotted path): ``min.c`` and ``max.c``
    typed as the column; per leaf (lists and maps included): ``nullCount.c``. Missing or
    unparseable stats give nulls. Values are as stored: writers other than this library
    truncate timestamp maxima to milliseconds, so skipping on ``max`` of a timestamp should
    allow for one extra millisecond. ``num_files`` (default ``len(stats)``) pads with null rows.
    ``stats`` may be an Arrow string array (a snapshot's ``stats`` column): it then reaches
    the JSON reader without a Python string per file.
    """
    if cm.is_mapped(schema):
        # Column mapping: the JSON is keyed by physical names; the columns keep logical ones.
        parsed = stats_table(stats, cm.physical_schema(schema), num_files)
        return parsed.rename_columns(stats_table([], cm.strip(schema), 0).column_names)
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
    if n == 0:
        return out_schema.empty_table()
    if isinstance(stats, pa.ChunkedArray | pa.Array):
        stats = (
            stats
            if len(stats) == n
            else pa.concat_arrays([_array(stats), pa.nulls(n - len(stats), pa.string())])
        )
        body = _lines(_array(stats))
    else:
        stats = list(stats) + [None] * (n - len(stats))
        body = "\n".join([s or "{}" for s in stats]).encode()
    try:
        columns = _stats_columns_fast(body, n, mm, leaves)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, KeyError):
        texts = stats.to_pylist() if isinstance(stats, pa.ChunkedArray | pa.Array) else stats
        columns = _stats_columns_slow(texts, mm, leaves)
    return pa.Table.from_arrays(columns, schema=out_schema)


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _lines(stats: pa.Array) -> pa.Buffer:
    """The stats strings as one buffer of lines (null = ``{}``), built by Arrow kernels."""
    filled = pc.fill_null(stats.cast(pa.string()), "{}")
    joined = pc.binary_join_element_wise(filled, pa.scalar(""), "\n")  # each string + newline
    offsets = joined.buffers()[1]
    data = joined.buffers()[2]
    first, last = np.frombuffer(offsets, dtype=np.int32)[[joined.offset, joined.offset + len(joined)]]
    return data.slice(int(first), int(last - first))


def _stats_columns_fast(
    body: bytes | pa.Buffer,
    n: int,
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
    opts = pajson.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore")
    parsed = pajson.read_json(pa.BufferReader(body), parse_options=opts)
    if parsed.num_rows != n:
        raise ValueError("stats spanning several lines")
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
