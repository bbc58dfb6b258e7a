"""Reading change data: the rows a change data feed read returns for a list of files.

A change data feed read (:mod:`eventlog.snapshot.changes`) decides per commit which files
say what changed (Delta's ``CDCReader``) and hands them here as :class:`ChangeFile` values:

* ``cdc``: a change data file (``_change_data/...``), its rows' ``_change_type`` stored in it;
* ``insert`` / ``delete``: an added or removed data file, every live row of it (its deletion
  vector applied) inserted or deleted;
* ``dv``: one data file removed and added again in one commit with another deletion vector:
  the rows the new vector deletes that the old one did not are deleted, and the rows the old
  one deleted that the new one does not are inserted again.

:func:`read_change_rows` reads them all at once, as the table schema plus ``_change_type``
and ``_commit_version``. Files read whole (change data files, and added or removed files
without deletion vectors) are read in one pass, each row knowing its file, whose commit
version (and for inferred rows the change type) is then one ``take``; on local disk the
small ones (the usual change data file holds a few rows) are decoded one by one with
``pyarrow.parquet``, which costs a quarter of a Dataset scan's per-file overhead. Files
with deletion vectors carry the version and change type as partition values instead.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from pyroaring import BitMap64

from eventlog.errors import DataFileNotFoundError
from eventlog.files import column_mapping as cm
from eventlog.files.change_data import CHANGE_TYPE_COLUMN
from eventlog.files.deletion_vectors import read_deletion_vector
from eventlog.files.reader import FILE_INDEX, data_file_path, read_data_files
from eventlog.files.scan import FileScan, read_live_rows
from eventlog.files.schema import decode_partition_value
from eventlog.log.actions import AddFile, DeletionVectorDescriptor

__all__ = [
    "CHANGE_TYPE",
    "COMMIT_TIMESTAMP",
    "COMMIT_VERSION",
    "KINDS",
    "ChangeFile",
    "change_columns",
    "read_change_rows",
]

logger = logging.getLogger(__name__)

CHANGE_TYPE = CHANGE_TYPE_COLUMN
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
KINDS = ("cdc", "insert", "delete", "dv")
SMALL_FILE_BYTES = 8 << 20  # files up to this size are read one by one (_read_small_files)


def change_columns() -> list[pa.Field]:
    """The columns a change data feed read adds to the table's (Delta's ``cdcReadSchema``)."""
    return [
        pa.field(CHANGE_TYPE, pa.string()),
        pa.field(COMMIT_VERSION, pa.int64()),
        pa.field(COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC")),
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class ChangeFile:
    """One file a change data feed read takes rows from (see the module docstring).

    ``file`` is what to read: a ``cdc`` action's path, partition values and size; a removed
    file as an add with the remove's deletion vector; for ``dv``, the file with the new
    deletion vector, and ``before`` the one it had.
    """

    version: int
    kind: str
    file: AddFile
    before: DeletionVectorDescriptor | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "kind": self.kind, "file": self.file.to_json()}
        if self.before is not None:
            out["before"] = self.before.to_json()
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ChangeFile:
        before = d.get("before")
        return ChangeFile(
            version=int(d["version"]),
            kind=str(d["kind"]),
            file=AddFile.from_json(d["file"]),
            before=DeletionVectorDescriptor.from_json(before) if before else None,
        )


def _tagged(file: AddFile, version: int, change_type: str) -> AddFile:
    """``file`` with the change columns as partition values (read as constant columns)."""
    values = {**file.partition_values, COMMIT_VERSION: str(version), CHANGE_TYPE: change_type}
    return dataclasses.replace(file, partition_values=values)


def read_change_rows(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[ChangeFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    *,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The changed rows of ``files``: ``columns`` of ``schema`` (default all; the table schema,
    column mapping metadata included) then ``_change_type`` and ``_commit_version``, ordered
    by commit version (a commit's rows in the order of its files). Partition columns come
    from each file's partition values, columns a file lacks are null."""
    fields = list(schema) if columns is None else [schema.field(c) for c in schema.names if c in columns]
    wanted = [f.name for f in fields]
    change_type, version = change_columns()[:2]
    full = pa.schema([*schema, change_type], metadata=schema.metadata)
    parts = list(partition_columns)
    # Files read whole, all in one scan: each row's file gives its version, and (for files
    # read as inserted or deleted) its change type; change data files hold their own.
    whole = [f for f in files if f.kind == "cdc" or (f.kind != "dv" and f.file.deletion_vector is None)]
    rows = _read_whole(fs, root, [f.file for f in whole], full, parts, [*wanted, CHANGE_TYPE])
    index = rows.column(FILE_INDEX)
    kinds = pa.array([None if f.kind == "cdc" else f.kind for f in whole], pa.string()).take(index)
    out = [
        rows.select(wanted)
        .append_column(change_type, pc.coalesce(kinds, rows.column(CHANGE_TYPE)))
        .append_column(version, pa.array([f.version for f in whole], pa.int64()).take(index))
    ]
    tagged = [*parts, COMMIT_VERSION, CHANGE_TYPE]
    by_type = pa.schema([*schema, change_type, version], metadata=schema.metadata)
    names = [*wanted, CHANGE_TYPE, COMMIT_VERSION]
    live = [
        _tagged(f.file, f.version, f.kind)
        for f in files
        if f.kind != "cdc" and f.kind != "dv" and f.file.deletion_vector is not None
    ]
    if live:
        out.append(read_live_rows(fs, root, live, by_type, tagged, columns=names))
    for f in files:
        if f.kind == "dv":
            out.extend(_dv_changes(fs, root, f, by_type, tagged, names))
    table = pa.concat_tables([t.select(names) for t in out]) if len(out) > 1 else out[0]
    order = np.argsort(table.column(COMMIT_VERSION).to_numpy(), kind="stable")
    return table if _ascending(order) else table.take(pa.array(order, pa.int64()))


class _Unsupported(Exception):
    """A file :func:`_read_small_files` does not take (a column of another type that does
    not cast); the general reader then reads them all."""


def _read_whole(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[AddFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    columns: Sequence[str],
) -> pa.Table:
    """``read_data_files(..., columns=columns, file_index=True)``: the rows of ``files`` in
    their order, with a last column :data:`FILE_INDEX` naming each row's file.

    A change data feed read is mostly of small files (a few rows each): on local disk those
    are read by :func:`_read_small_files`, which costs about a quarter of a Dataset scan per
    file. Big files (over :data:`SMALL_FILE_BYTES`), other filesystems, ``id`` column mapping
    and files whose columns do not cast to the table's types go to the general reader."""
    small = [i for i, f in enumerate(files) if f.size <= SMALL_FILE_BYTES]
    if not isinstance(fs, LocalFileSystem) or not small or cm.is_id_mode(schema):
        return read_data_files(fs, root, files, schema, partition_columns, columns=columns, file_index=True)
    try:
        fast = _read_small_files(fs, root, [files[i] for i in small], schema, partition_columns, columns)
    except _Unsupported as exc:  # the general reader reads every file
        logger.debug("change data read by the general reader: %s", exc)
        return read_data_files(fs, root, files, schema, partition_columns, columns=columns, file_index=True)
    if len(small) == len(files):
        return fast
    wanted = set(small)
    big = [i for i in range(len(files)) if i not in wanted]
    rest = read_data_files(
        fs, root, [files[i] for i in big], schema, partition_columns, columns=columns, file_index=True
    )
    # Both as positions in ``files``, then in file order.
    parts = []
    for table, positions in ((fast, small), (rest, big)):
        index = pa.array(positions, pa.int32()).take(table.column(FILE_INDEX))
        parts.append(table.set_column(table.num_columns - 1, table.field(FILE_INDEX), index))
    both = pa.concat_tables(parts)
    order = np.argsort(both.column(FILE_INDEX).to_numpy(), kind="stable")
    return both.take(pa.array(order, pa.int64()))


def _read_small_files(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[AddFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    columns: Sequence[str],
) -> pa.Table:
    """:func:`_read_whole` one file after the other: each read into memory whole and decoded
    by ``pyarrow.parquet.ParquetFile`` (its columns only, no threads: the files are tiny and
    a pool only adds contention for the interpreter lock). Files with the same columns are
    concatenated, then each group is conformed to the table's types once: absent columns
    null, others cast. Partition columns come from the files' partition values (keyed by
    physical names under column mapping)."""
    wanted = set(columns)
    out = pa.schema([f for f in schema if f.name in wanted])
    physical = cm.physical_schema(out) if cm.is_mapped(schema) else out
    parts = {cm.physical_name(schema.field(c)) for c in partition_columns}
    stored = [f.name for f in physical if f.name not in parts]
    every = len(stored) == len([f for f in schema if cm.physical_name(f) not in parts])
    base = root.rstrip("/") + "/"
    groups: list[tuple[pa.Schema, list[pa.Table], list[int]]] = []  # files of the same columns
    for i, add in enumerate(files):
        # What data_file_path does, without parsing a path that cannot be a URI.
        path = base + unquote(add.path) if ":" not in add.path else data_file_path(fs, root, add.path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError as exc:
            raise DataFileNotFoundError(root, path, None) from exc
        pf = pq.ParquetFile(pa.BufferReader(data), coerce_int96_timestamp_unit="us")
        if every:  # all of it (columns not wanted are left out by _conform)
            table = pf.read(use_threads=False)
        else:
            present = set(pf.schema_arrow.names)
            table = pf.read(columns=[c for c in stored if c in present], use_threads=False)
        group = next((g for g in reversed(groups) if g[0].equals(table.schema)), None)
        if group is None:
            group = (table.schema, list[pa.Table](), list[int]())
            groups.append(group)
        group[1].append(table)
        group[2].append(i)
    conformed: list[pa.Table] = []
    file_index: list[np.ndarray] = []
    for _, tables, indexes in groups:
        group = pa.concat_tables(tables)
        conformed.append(_conform(group, physical, parts))
        counts = np.fromiter((t.num_rows for t in tables), dtype=np.int64, count=len(tables))
        file_index.append(np.repeat(np.asarray(indexes, dtype=np.int32), counts))
    table = pa.concat_tables(conformed) if len(conformed) > 1 else conformed[0]
    index = np.concatenate(file_index)
    order = np.argsort(index, kind="stable")
    if not _ascending(order):
        table, index = table.take(pa.array(order, pa.int64())), index[order]
    by_file = pa.array(index, pa.int32())
    cols = []
    for f in physical:
        if f.name in parts:
            cols.append(_partition_column(files, f, by_file))
        else:
            cols.append(table.column(f.name))
    fields = [*out, pa.field(FILE_INDEX, pa.int32())]
    logical = pa.schema(fields)
    if physical is out:
        return pa.Table.from_arrays([*cols, by_file], schema=logical)
    read = pa.Table.from_arrays([*cols, by_file], schema=pa.schema([*physical, fields[-1]]))
    return cm.to_logical(read, logical)


def _conform(group: pa.Table, physical: pa.Schema, parts: set[str]) -> pa.Table:
    """``group`` (files with the same columns) with every stored column of ``physical``, of
    its type: absent ones null, others cast."""
    cols: dict[str, pa.ChunkedArray | pa.Array] = {}
    for f in physical:
        if f.name in parts:
            continue
        if f.name not in group.column_names:
            cols[f.name] = pa.nulls(group.num_rows, f.type)
            continue
        col = group.column(f.name)
        if not col.type.equals(f.type):
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise _Unsupported(f"column {f.name}: {col.type} does not cast to {f.type}") from exc
        cols[f.name] = col
    return pa.table(cols)


def _partition_column(files: Sequence[AddFile], field: pa.Field, by_file: pa.Array) -> pa.Array:
    """A partition column: each file's value (parsed once per distinct one), per row."""
    parsed: dict[str | None, Any] = {}
    values = []
    for add in files:
        raw = add.partition_values.get(field.name)
        if raw not in parsed:
            parsed[raw] = decode_partition_value(raw, field.type)
        values.append(parsed[raw])
    return pa.array(values, field.type).take(by_file)


def _ascending(order: np.ndarray) -> bool:
    return bool(np.all(order[1:] > order[:-1])) if len(order) > 1 else True


def _dv_changes(
    fs: fsspec.AbstractFileSystem,
    root: str,
    change: ChangeFile,
    schema: pa.Schema,
    partition_columns: list[str],
    columns: list[str],
) -> Iterable[pa.Table]:
    """The rows a deletion vector change deletes (``delete``) and brings back (``insert``)."""
    after = _deleted(fs, root, change.file.deletion_vector)
    before = _deleted(fs, root, change.before)
    for change_type, positions in (("delete", after - before), ("insert", before - after)):
        if not positions:
            continue
        plain = dataclasses.replace(change.file, deletion_vector=None)
        scan = FileScan(fs, root, _tagged(plain, change.version, change_type), schema, partition_columns)
        index = np.fromiter(positions, dtype=np.int64, count=len(positions))
        yield scan.rows_at(index, columns)


def _deleted(fs: fsspec.AbstractFileSystem, root: str, dv: DeletionVectorDescriptor | None) -> BitMap64:
    if dv is None:
        return BitMap64()
    return BitMap64(read_deletion_vector(fs, root, dv))
