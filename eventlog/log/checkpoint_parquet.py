"""Writing checkpoint Parquet: the rows of a checkpoint, built column-wise, and publishing.

Shared by the classic writer (:mod:`eventlog.log.checkpoint`) and the V2 one
(:mod:`eventlog.log.checkpoint_v2`). The file actions are written from the state's Arrow
tables without a Python object per file: each block of rows becomes its own row groups
(non-file actions first, then adds, then removes), the flattened columns wrapped into the
struct column, the other columns null there.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eventlog.log.actions import Metadata, Protocol
from eventlog.log.checkpoint_locate import is_local, read_last_checkpoint
from eventlog.log.checkpoint_state import (
    DOMAIN_STRUCT,
    LAST_CHECKPOINT,
    METADATA_STRUCT,
    PROTOCOL_STRUCT,
    TXN_STRUCT,
    CheckpointState,
)
from eventlog.log.durable import is_durable, sync_file
from eventlog.log.filetable import ADD_STRUCT, DV_STRUCT, REMOVE_STRUCT

__all__ = [
    "ROW_GROUP_ROWS",
    "file_blocks",
    "file_struct",
    "non_file_blocks",
    "publish",
    "publish_pointer",
    "put_bytes",
    "struct_array",
    "with_stats",
    "write_actions",
]

# Rows per row group of file actions: ~25-40 MB of Arrow data with typical stats, small
# enough for readers to decode groups in parallel and to bound the writer's memory.
ROW_GROUP_ROWS = 131_072

# --------------------------------------------------------------------------- padding

# The Parquet writer rejects nulls in a required child even under a null parent, so a
# null row of a struct column needs non-null placeholder children: built here from zeroed
# buffers (no Python per row), and hidden by the parent's validity bitmap.


def _zero_offsets(n: int) -> pa.Array:
    return pa.array(np.zeros(n + 1, dtype=np.int32))


def _placeholder(typ: pa.DataType, n: int) -> pa.Array:
    """A non-null array of ``n`` zero/empty values of ``typ`` (nested types included)."""
    if pa.types.is_struct(typ):
        return pa.StructArray.from_arrays([_placeholder(f.type, n) for f in typ], fields=list(typ))
    if pa.types.is_map(typ):
        empty_keys, empty_items = pa.array([], typ.key_type), pa.array([], typ.item_type)
        return pa.MapArray.from_arrays(_zero_offsets(n), empty_keys, empty_items, type=typ)
    if pa.types.is_list(typ):
        return pa.ListArray.from_arrays(_zero_offsets(n), pa.array([], typ.value_type), type=typ)
    if pa.types.is_string(typ):
        return pa.Array.from_buffers(typ, n, [None, _zero_offsets(n).buffers()[1], pa.py_buffer(b"")])
    return pa.array(np.zeros(n, dtype=typ.to_pandas_dtype()), typ)


def _null_column(typ: pa.StructType, n: int) -> pa.StructArray:
    """``n`` null rows of struct ``typ``, with placeholder children the writer accepts."""
    children = [_placeholder(f.type, n) for f in typ]
    return pa.StructArray.from_arrays(children, fields=list(typ), mask=pa.array(np.ones(n, dtype=bool)))


def _padded(schema: pa.Schema, name: str, arr: pa.Array, cache: dict[tuple[str, int], pa.Array]) -> pa.Table:
    """A table of ``schema`` whose column ``name`` is ``arr`` and every other column null."""
    n = len(arr)
    columns = []
    for f in schema:
        if f.name == name:
            columns.append(arr)
            continue
        if (f.name, n) not in cache:
            cache[(f.name, n)] = _null_column(f.type, n)
        columns.append(cache[(f.name, n)])
    return pa.Table.from_arrays(columns, schema=schema)


# --------------------------------------------------------------------------- file actions


def _single(col: pa.ChunkedArray) -> pa.Array:
    if col.num_chunks == 1:
        return col.chunk(0)
    return pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], col.type)


def _map_or_empty(arr: pa.MapArray) -> pa.MapArray:
    """``arr`` with null maps made empty (partitionValues is required in an add)."""
    if arr.null_count == 0:
        return arr
    entries = pa.struct([arr.type.key_field, arr.type.item_field])
    as_list = arr.view(pa.list_(pa.field("entries", entries, False)))
    lengths = pc.fill_null(pc.list_value_length(as_list), 0).to_numpy()
    offsets = np.zeros(len(arr) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(as_list)
    return pa.MapArray.from_arrays(pa.array(offsets), flat.field(0), flat.field(1), type=arr.type)


def _fill_dv(arr: pa.StructArray, kind: str) -> pa.StructArray:
    """Deletion vectors with placeholder children under null rows (checked: a present
    descriptor must have its required fields)."""
    valid = arr.is_valid()
    children = []
    for f in DV_STRUCT:
        child = arr.field(f.name)
        if not f.nullable and child.null_count:
            if pc.any(pc.and_(valid, child.is_null())).as_py():
                raise ValueError(f"{kind}.deletionVector.{f.name} is null in a {kind} row")
            child = pc.fill_null(child, _placeholder(f.type, 1)[0])
        children.append(child)
    mask = pc.invert(valid) if arr.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(DV_STRUCT), mask=mask)


def file_struct(table: pa.Table, typ: pa.StructType, kind: str, with_stats: bool) -> pa.StructArray:
    """Rows of an ADD_SCHEMA/REMOVE_SCHEMA table as the checkpoint's struct column."""
    n = table.num_rows
    children = []
    for f in typ:
        child = _single(table.column(f.name))
        if f.name == "dataChange":
            child = pc.fill_null(child, True)
        elif f.name == "stats" and not with_stats:
            child = pa.nulls(n, f.type)
        elif f.name == "partitionValues" and not f.nullable:
            child = _map_or_empty(child)
        elif f.name == "deletionVector":
            child = _fill_dv(child, kind)
        if not f.nullable and child.null_count:
            raise ValueError(f"{kind}.{f.name} is null in a {kind} row")
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=list(typ))


# --------------------------------------------------------------------------- non-file actions


def _metadata_row(m: Metadata) -> tuple[Any, ...]:
    fmt = {"provider": m.format.provider, "options": list(m.format.options.items())}
    return (
        m.id, m.name, m.description, fmt, m.schema_string, list(m.partition_columns),
        m.created_time, list(m.configuration.items()),
    )  # fmt: skip


def _protocol_row(p: Protocol) -> tuple[Any, ...]:
    # PROTOCOL.md: readerFeatures must be non-null iff reader version 3, writerFeatures
    # iff writer version 7; below those versions the values must be null.
    rf = list(p.reader_features or ()) if p.min_reader_version >= 3 else None
    wf = list(p.writer_features or ()) if p.min_writer_version >= 7 else None
    return (p.min_reader_version, p.min_writer_version, rf, wf)


def _struct(typ: pa.StructType, rows: Sequence[tuple[Any, ...]]) -> pa.Array:
    """Build a struct array column-wise from row tuples (in the type's field order)."""
    if not rows:
        return pa.array([], typ)
    columns = list(zip(*rows, strict=True))
    children = [pa.array(col, typ.field(i).type) for i, col in enumerate(columns)]
    return pa.StructArray.from_arrays(children, fields=list(typ))


def struct_array(typ: pa.StructType, rows: Sequence[tuple[Any, ...]]) -> pa.Array:
    """A struct array of ``typ`` from row tuples (in the type's field order)."""
    return _struct(typ, rows)


def non_file_blocks(state: CheckpointState) -> list[tuple[str, pa.Array]]:
    """Protocol, metadata, txn and domain rows (a handful), one block per kind."""
    return [
        ("protocol", _struct(PROTOCOL_STRUCT, [_protocol_row(state.protocol)])),
        ("metaData", _struct(METADATA_STRUCT, [_metadata_row(state.metadata)])),
        ("txn", _struct(TXN_STRUCT, [(t.app_id, t.version, t.last_updated) for t in state.txns])),
        (
            "domainMetadata",
            _struct(
                DOMAIN_STRUCT, [(d.domain, d.configuration, False) for d in state.domains if not d.removed]
            ),
        ),
    ]


# --------------------------------------------------------------------------- write


def with_stats(state: CheckpointState) -> bool:
    """Whether file actions keep their JSON ``stats`` (``delta.checkpoint.writeStatsAsJson``)."""
    return state.metadata.configuration.get("delta.checkpoint.writeStatsAsJson", "true") != "false"


def file_blocks(state: CheckpointState) -> list[tuple[str, pa.Table, pa.StructType]]:
    """The file actions of ``state``: adds, then removes, as (column, table, struct type)."""
    return [("add", state.add_table, ADD_STRUCT), ("remove", state.remove_table, REMOVE_STRUCT)]


def write_actions(
    where: Any,
    schema: pa.Schema,
    blocks: Sequence[tuple[str, pa.Array]],
    files: Sequence[tuple[str, pa.Table, pa.StructType]],
    stats: bool,
) -> int:
    """Write checkpoint rows to ``where`` (a path or stream) as Parquet of ``schema``: the
    non-file ``blocks`` (column, struct array) first, then each file table in row groups of
    :data:`ROW_GROUP_ROWS`, every other column null. Returns the number of rows."""
    rows = 0
    cache: dict[tuple[str, int], pa.Array] = {}
    with pq.ParquetWriter(where, schema, compression="snappy") as writer:
        present = [_padded(schema, name, arr, cache) for name, arr in blocks if len(arr)]
        if present or not files:
            first = pa.concat_tables(present) if present else schema.empty_table()
            writer.write_table(first)
            rows += int(first.num_rows)
        for kind, table, typ in files:
            for start in range(0, table.num_rows, ROW_GROUP_ROWS):
                arr = file_struct(table.slice(start, ROW_GROUP_ROWS), typ, kind, stats)
                writer.write_table(_padded(schema, kind, arr, cache), row_group_size=ROW_GROUP_ROWS)
                rows += len(arr)
    return rows


def publish(fs: fsspec.AbstractFileSystem, path: str, write: Callable[[Any], None]) -> int:
    """Produce the file at ``path`` with ``write(sink)`` so readers never see a torn file;
    returns its size.

    Object stores publish a PUT atomically, so write in place there. On a local (POSIX)
    file system write a hidden temp file next to the target and rename it over; the
    leading dot keeps Delta readers from treating a leftover temp as a log file.
    """
    if not is_local(fs):
        sink = pa.BufferOutputStream()
        write(sink)
        data = sink.getvalue()
        fs.pipe_file(path, data.to_pybytes())
        return int(data.size)
    head, _, name = path.rpartition("/")
    tmp = f"{head}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        write(fs._strip_protocol(tmp))
        size = int(fs.size(tmp))
        if is_durable(fs):  # whole before it is renamed in (the rename's directory: ``mv``)
            sync_file(fs._strip_protocol(tmp))
        fs.mv(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.rm(tmp)
        raise
    return size


def put_bytes(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> int:
    """Publish ``data`` as the file at ``path`` (see :func:`publish`); returns its size."""

    def write(sink: Any) -> None:
        if isinstance(sink, str):
            with open(sink, "wb") as f:
                f.write(data)
        else:
            sink.write(data)

    return publish(fs, path, write)


def publish_pointer(fs: fsspec.AbstractFileSystem, log_dir: str, pointer: dict[str, Any]) -> None:
    """Point ``_last_checkpoint`` at the checkpoint ``pointer`` describes, unless it already
    names a newer one.

    The pointer must never move backwards: metadata cleanup may already have deleted the
    commits an older checkpoint would need to be replayed forwards. (Best effort: a
    concurrent checkpointer can still interleave; readers then just replay more.)
    """
    current = read_last_checkpoint(fs, log_dir)
    if current is None or current <= pointer["version"]:
        put_bytes(fs, f"{log_dir.rstrip('/')}/{LAST_CHECKPOINT}", orjson.dumps(pointer))
