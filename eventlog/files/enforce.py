"""Schema enforcement and evolution on write: :func:`conform` makes data fit a table's
schema, :func:`merge_schema` widens a table's schema with the data's new columns (Delta's
``mergeSchema``).

Decisions worth knowing:

* :func:`conform` allows only lossless widening casts, with one exception: timestamps with a
  finer unit (ns) are *truncated* to microseconds, as Spark and Delta do on write.
* Every offending column is named in one :class:`SchemaMismatchError` (missing, extra,
  mistyped or holding nulls in a non-nullable column or nested field).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import NotNullViolationError, SchemaMismatchError
from eventlog.files.schema import _is_list_view, canonical_schema

__all__ = ["conform", "merge_schema"]

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
        count = _null_rows(dict(zip(table_schema.names, columns, strict=True)), bad[0])
        raise NotNullViolationError(
            f"{context}: NOT NULL constraint violated for column {bad[0]} ({count} rows); "
            f"null values in non-nullable columns {bad}",
            columns=bad,
            count=count,
        )
    return pa.Table.from_arrays(columns, schema=table_schema)


def _null_rows(columns: dict[str, pa.ChunkedArray], path: str) -> int:
    """Rows holding a null at ``path`` under a valid parent (struct paths; a path through a
    list or map counts the rows whose top-level value is present: at least one is bad)."""
    head, *rest = path.split(".")
    col = columns[head]
    if not rest:
        return int(col.null_count)
    if any(p in ("element", "key", "value") for p in rest):
        return max(1, int(len(col) - col.null_count))
    valid = pc.is_valid(col)
    value = col
    for part in rest:
        value = pc.struct_field(value, part)
        bad = pc.and_(valid, pc.is_null(value))
        valid = pc.and_(valid, pc.is_valid(value))
    return int(pc.sum(bad).as_py() or 0)


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
        if bad:
            count = _null_rows({f.name: relaxed}, bad[0])
            raise NotNullViolationError(
                f"{context}: NOT NULL constraint violated for column {bad[0]} ({count} rows)",
                columns=bad,
                count=count,
            ) from exc
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
