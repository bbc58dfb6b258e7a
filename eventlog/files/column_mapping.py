"""Column mapping (Delta PROTOCOL.md "Column Mapping"): logical and physical column names.

A table with ``delta.columnMapping.mode`` = ``name`` or ``id`` gives every field of its schema
(nested struct fields too) a ``delta.columnMapping.id`` and a
``delta.columnMapping.physicalName`` in its metadata, and the table property
``delta.columnMapping.maxColumnId`` holds the largest id handed out. Data files, statistics
(``minValues``/``maxValues``/``nullCount``) and ``partitionValues`` use physical names; the
Parquet field ids of the files are the column mapping ids. Users only ever see logical names:
renaming or dropping a column changes the schema, never a file.

In Arrow, the table schema carries that field metadata (JSON-encoded, like all Spark field
metadata here), so the schema alone says how a column is stored: :func:`physical_schema`
gives the files' schema (physical names, ``PARQUET:field_id`` = the id), :func:`to_physical`
and :func:`to_logical` rename Arrow data between the two without copying (same layout, other
names). Reads resolve a column by its physical name; in ``id`` mode (which the schema
carries as schema-level metadata, :func:`with_mode`) a file holding the column's field id
under another name is read by that id (:func:`resolve_by_id`), as the protocol asks.

Schema changes: :func:`assign` gives new fields ids and physical names (``col-<uuid>`` for
new columns, as Delta does; the logical name itself when mapping is enabled on an existing
table, so that its files keep working); :func:`rename` and :func:`drop` change logical names
only. :func:`strip` removes the mapping metadata from schemas shown to users.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

import orjson
import pyarrow as pa

__all__ = [
    "adopt",
    "FIELD_ID_KEY",
    "ID_KEY",
    "MAX_ID_KEY",
    "MODES",
    "MODE_KEY",
    "PHYSICAL_KEY",
    "assign",
    "drop",
    "field_id",
    "is_id_mode",
    "is_mapped",
    "max_id",
    "mode_of",
    "partition_keys",
    "physical_name",
    "physical_schema",
    "rename",
    "resolve_by_id",
    "strip",
    "to_logical",
    "to_physical",
    "with_mode",
]

MODE_KEY = "delta.columnMapping.mode"
MAX_ID_KEY = "delta.columnMapping.maxColumnId"
ID_KEY = "delta.columnMapping.id"
PHYSICAL_KEY = "delta.columnMapping.physicalName"
MODES = ("none", "name", "id")
#: How pyarrow reads and writes Parquet field ids: field metadata under this key.
FIELD_ID_KEY = b"PARQUET:field_id"
_MAPPING_KEYS = (ID_KEY.encode(), PHYSICAL_KEY.encode(), FIELD_ID_KEY)
_MODE_META = MODE_KEY.encode()  # schema-level: "id" when columns resolve by field id


def mode_of(configuration: Mapping[str, str]) -> str:
    """The table's column mapping mode (``none``, ``name`` or ``id``; as written, lowercased)."""
    return str(configuration.get(MODE_KEY, "none")).lower()


def max_id(configuration: Mapping[str, str], schema: pa.Schema) -> int:
    """The largest column id handed out: the property, or the largest id in ``schema``."""
    ids = [i for _, i in _ids(schema)]
    try:
        prop = int(configuration.get(MAX_ID_KEY, "0"))
    except ValueError:
        prop = 0
    return max([prop, *ids])


def _ids(schema: pa.Schema) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []

    def walk(f: pa.Field, path: str) -> None:
        i = field_id(f)
        if i is not None:
            out.append((path, i))
        for child in _children(f.type):
            walk(child, f"{path}.{child.name}")

    for f in schema:
        walk(f, f.name)
    return out


# --------------------------------------------------------------------------- one field


def _meta(f: pa.Field, key: str) -> object:
    raw = (f.metadata or {}).get(key.encode())
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def physical_name(f: pa.Field) -> str:
    """The name of ``f`` in data files, statistics and partition values."""
    name = _meta(f, PHYSICAL_KEY)
    return name if isinstance(name, str) and name else f.name


def field_id(f: pa.Field) -> int | None:
    """The column mapping id of ``f`` (None without one)."""
    value = _meta(f, ID_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_mapped(schema: pa.Schema) -> bool:
    """Whether ``schema`` stores any column under another name, or has mapping ids."""
    return any(PHYSICAL_KEY.encode() in (f.metadata or {}) for f in schema)


def partition_keys(schema: pa.Schema, partition_columns: Sequence[str]) -> list[str]:
    """The ``partitionValues`` keys of ``partition_columns`` (their physical names)."""
    return [physical_name(schema.field(c)) if c in schema.names else c for c in partition_columns]


def _children(t: pa.DataType) -> list[pa.Field]:
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [t.value_field]
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    return []


# --------------------------------------------------------------------------- schemas


def _map_type(t: pa.DataType, fn: Callable[[pa.Field], pa.Field]) -> pa.DataType:
    """``t`` with ``fn`` applied to every struct field (at any depth, inside lists and maps)."""
    if pa.types.is_struct(t):
        return pa.struct([fn(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_list(t):
        vf = t.value_field
        return pa.list_(vf.with_type(_map_type(vf.type, fn)))
    if pa.types.is_large_list(t):
        vf = t.value_field
        return pa.large_list(vf.with_type(_map_type(vf.type, fn)))
    if pa.types.is_map(t):
        kf, itf = t.key_field, t.item_field
        return pa.map_(kf.with_type(_map_type(kf.type, fn)), itf.with_type(_map_type(itf.type, fn)))
    return t


def _physical_field(f: pa.Field) -> pa.Field:
    meta = {k: v for k, v in (f.metadata or {}).items() if k not in _MAPPING_KEYS}
    i = field_id(f)
    if i is not None:
        meta[FIELD_ID_KEY] = str(i).encode()
    return pa.field(physical_name(f), _map_type(f.type, _physical_field), f.nullable, meta or None)


def physical_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of the data files: physical names, Parquet field ids = mapping ids."""
    return pa.schema([_physical_field(f) for f in schema])


def _strip_field(f: pa.Field) -> pa.Field:
    meta = {k: v for k, v in (f.metadata or {}).items() if k not in _MAPPING_KEYS}
    return pa.field(f.name, _map_type(f.type, _strip_field), f.nullable, meta or None)


def strip(schema: pa.Schema) -> pa.Schema:
    """``schema`` without column mapping metadata (what a reader of the table is shown)."""
    metadata = {k: v for k, v in (schema.metadata or {}).items() if k != _MODE_META}
    return pa.schema([_strip_field(f) for f in schema], metadata=metadata or None)


def with_mode(schema: pa.Schema, configuration: Mapping[str, str]) -> pa.Schema:
    """``schema`` marked with the table's mapping mode when it is ``id`` (readers then resolve
    columns by Parquet field id, :func:`resolve_by_id`); unchanged otherwise."""
    if mode_of(configuration) != "id":
        return schema
    return schema.with_metadata({**(schema.metadata or {}), _MODE_META: b"id"})


def is_id_mode(schema: pa.Schema) -> bool:
    """Whether ``schema`` was marked by :func:`with_mode` as an ``id``-mode table's."""
    return (schema.metadata or {}).get(_MODE_META) == b"id"


def resolve_by_id(file_schema: pa.Schema, wanted: pa.Schema) -> dict[str, str]:
    """Top-level columns of ``wanted`` (a :func:`physical_schema`) that a file with
    ``file_schema`` lacks by name but holds under another name with the same Parquet field
    id: {physical name: the file's name}."""
    by_id: dict[bytes, str] = {}
    for f in file_schema:
        raw = (f.metadata or {}).get(FIELD_ID_KEY)
        if raw is not None:
            by_id[raw] = f.name
    present = set(file_schema.names)
    out = {}
    for f in wanted:
        raw = (f.metadata or {}).get(FIELD_ID_KEY)
        if f.name not in present and raw is not None and raw in by_id:
            out[f.name] = by_id[raw]
    return out


def _view(col: pa.ChunkedArray, t: pa.DataType) -> pa.ChunkedArray:
    if col.type.equals(t, check_metadata=True):
        return col
    return pa.chunked_array([c.view(t) for c in col.chunks], t)


def to_physical(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` (columns of the logical ``schema``, any subset in any order) under physical
    names, zero-copy."""
    fields = [_physical_field(schema.field(n)) for n in data.column_names]
    cols = [_view(c, f.type) for c, f in zip(data.columns, fields, strict=True)]
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def to_logical(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` read under physical names, as ``schema`` (logical, same columns in the same
    order and layout), zero-copy."""
    cols = [_view(c, f.type) for c, f in zip(data.columns, schema, strict=True)]
    return pa.Table.from_arrays(cols, schema=schema)


def adopt(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` (conformed to the logical ``schema``: its columns, types and names) with the
    schema's field metadata, so that a write finds the physical names; zero-copy."""
    fields = [schema.field(n) for n in data.column_names]
    cols = [_view(c, f.type) for c, f in zip(data.columns, fields, strict=True)]
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


# --------------------------------------------------------------------------- changes


def assign(schema: pa.Schema, start: int, *, keep_names: bool = False) -> tuple[pa.Schema, int]:
    """``schema`` with an id and a physical name on every field that lacks them, ids counting
    up from ``start`` + 1; returns it and the largest id now in use. New physical names are
    ``col-<uuid>`` (Delta's), or the logical name itself with ``keep_names`` (enabling mapping
    on an existing table: its files store the columns under those names)."""
    counter = [start]

    def fix(f: pa.Field) -> pa.Field:
        meta = dict(f.metadata or {})
        if field_id(f) is None:
            counter[0] += 1
            meta[ID_KEY.encode()] = orjson.dumps(counter[0])
        if _meta(f, PHYSICAL_KEY) is None:
            phys = f.name if keep_names else f"col-{uuid.uuid4()}"
            meta[PHYSICAL_KEY.encode()] = orjson.dumps(phys)
        return pa.field(f.name, _map_type(f.type, fix), f.nullable, meta)

    fixed = pa.schema([fix(f) for f in schema], metadata=schema.metadata)
    return fixed, max([counter[0], *(i for _, i in _ids(fixed))])


def _edit(
    schema: pa.Schema, path: Sequence[str], change: Callable[[pa.Field], pa.Field | None]
) -> pa.Schema | None:
    """``schema`` with the field at ``path`` replaced by ``change(field)`` (removed when it
    returns None); None when no such field (struct fields only below the top)."""

    def edit(fields: list[pa.Field], rest: Sequence[str]) -> list[pa.Field] | None:
        for i, f in enumerate(fields):
            if f.name != rest[0]:
                continue
            if len(rest) == 1:
                new = change(f)
                return [*fields[:i], *([new] if new is not None else []), *fields[i + 1 :]]
            if not pa.types.is_struct(f.type):
                return None
            inner = edit([f.type.field(j) for j in range(f.type.num_fields)], rest[1:])
            if inner is None:
                return None
            return [*fields[:i], f.with_type(pa.struct(inner)), *fields[i + 1 :]]
        return None

    out = edit(list(schema), list(path))
    return None if out is None else pa.schema(out, metadata=schema.metadata)


def rename(schema: pa.Schema, path: Sequence[str], new_name: str) -> pa.Schema | None:
    """``schema`` with the field at ``path`` renamed to ``new_name`` (its physical name and id
    kept); None when there is no such field."""
    return _edit(schema, path, lambda f: f.with_name(new_name))


def drop(schema: pa.Schema, path: Sequence[str]) -> pa.Schema | None:
    """``schema`` without the field at ``path``; None when there is no such field."""
    return _edit(schema, path, lambda f: None)
