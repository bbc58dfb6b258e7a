"""Reading data files: :func:`read_data_files` reads many files as one table with exactly
the table schema's types, :class:`DataFileReader` reads some row groups and columns of one
file and reports their Parquet statistics, and :func:`data_file_path` resolves an
``add.path`` (a percent-encoded relative URI path, or an absolute URI) to a filesystem path.

Partition columns come from each file's partition values (they are not stored in the
files); columns absent from older files read as nulls; INT96 timestamps (Spark's default)
read as microseconds. On a non-local filesystem files are fetched whole through fsspec and
decoded from memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlparse

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from eventlog.errors import CorruptDataFileError, DataFileNotFoundError, UnknownColumnError
from eventlog.files import column_mapping as cm
from eventlog.files.schema import decode_partition_value
from eventlog.files.stats import _has_minmax
from eventlog.log.actions import AddFile
from eventlog.log.storage import whole_file_options

__all__ = ["FILE_INDEX", "DataFileReader", "data_file_path", "read_data_files"]

FILE_INDEX = "__file_index"  # read_data_files(file_index=True): each row's file
_FRAGMENT_INDEX = "__fragment_index"  # the dataset scanner's own (the file's in the dataset)

_FETCH_BATCH_BYTES = 256 * 1024 * 1024  # compressed bytes fetched per batch (non-local fs)
_FETCH_THREADS = 16

_PARQUET_FORMAT = ds.ParquetFileFormat(
    # Spark writes INT96 timestamps by default; read them as microseconds like the table type.
    read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"),
)


def data_file_path(fs: fsspec.AbstractFileSystem, root: str, path: str) -> str:
    """The filesystem path of the data file an add action names by ``path`` (its ``add.path``)."""
    if urlparse(path).scheme:  # absolute URI (e.g. shallow clones)
        return str(fs._strip_protocol(unquote(path)))
    return f"{root.rstrip('/')}/{unquote(path)}"


def read_data_files(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[AddFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    *,
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,
    file_index: bool = False,
) -> pa.Table:
    """Read ``files`` as one table with exactly ``schema`` (or ``columns``, in schema order).

    Partition columns come from each file's partition values; columns absent from older files
    are null; ``filter`` (over column names, partition columns included) is applied with
    Parquet row-group and partition pruning. A column-mapped ``schema``
    (:mod:`eventlog.files.column_mapping`) is read by physical names and returned under
    logical ones (a ``filter`` then applies after the read). ``file_index``: a last column
    :data:`FILE_INDEX` (int32) gives each row's file, as its index in ``files``; rows come
    file by file, in the order of ``files``.
    """
    if cm.is_mapped(schema):
        return _read_mapped(fs, root, files, schema, partition_columns, columns, filter, file_index)
    out_schema = _out_schema(schema, partition_columns, columns)
    if not files:
        return _with_index_field(out_schema).empty_table() if file_index else out_schema.empty_table()
    part_types = {c: schema.field(c).type for c in partition_columns}
    cache: dict[tuple[tuple[str, str | None], ...], pc.Expression] = {}
    expressions: list[pc.Expression] = []
    for add in files:
        key = tuple((c, add.partition_values.get(c)) for c in partition_columns)
        expr = cache.get(key)
        if expr is None:
            expr = _partition_expression(key, part_types)
            cache[key] = expr
        expressions.append(expr)
    paths = [data_file_path(fs, root, add.path) for add in files]
    full_schema = pa.schema(list(schema))
    names = [*out_schema.names, _FRAGMENT_INDEX] if file_index else out_schema.names
    try:
        table = _read(fs, files, paths, expressions, full_schema, names, filter, partition_columns)
    except FileNotFoundError as exc:
        missing = next((p for p in paths if not fs.exists(p)), str(exc))
        raise DataFileNotFoundError(root, missing, None) from exc
    except pa.ArrowInvalid as exc:
        corrupt = next(((p, why) for p in paths if (why := not_parquet(fs, p)) is not None), None)
        if corrupt is None:
            raise
        raise CorruptDataFileError(root, corrupt[0], None, corrupt[1]) from exc
    if not file_index:
        return _exact_types(table, out_schema)
    index = table.column(_FRAGMENT_INDEX)
    typed = _exact_types(table.drop_columns([_FRAGMENT_INDEX]), out_schema)
    return typed.append_column(pa.field(FILE_INDEX, pa.int32()), index)


def _with_index_field(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field(FILE_INDEX, pa.int32()))


def _read_mapped(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[AddFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
    file_index: bool = False,
) -> pa.Table:
    """:func:`read_data_files` of a column-mapped table: the files' physical columns (partition
    values keyed by physical names too), renamed to the logical ``schema``."""
    out_schema = _out_schema(schema, partition_columns, columns)
    physical = cm.physical_schema(schema)
    to_physical = dict(zip(schema.names, physical.names, strict=True))
    wanted = None if columns is None or filter is not None else [to_physical[c] for c in out_schema.names]
    parts = [to_physical[c] for c in partition_columns]
    by_name, by_id = list(files), []
    positions = list(range(len(files)))  # of the files read by name, in ``files``
    if cm.is_id_mode(schema):  # id mode: a file may hold a column under another name
        renames = [cm.resolve_by_id(_file_schema(fs, root, add), physical) for add in files]
        by_name = [add for add, r in zip(files, renames, strict=True) if not r]
        positions = [i for i, r in enumerate(renames) if not r]
        by_id = [(i, add, r) for i, (add, r) in enumerate(zip(files, renames, strict=True)) if r]
    tables = [read_data_files(fs, root, by_name, physical, parts, columns=wanted, file_index=file_index)]
    if file_index and by_id:
        index = pa.array(positions, pa.int32()).take(tables[0].column(FILE_INDEX))
        tables[0] = tables[0].set_column(tables[0].num_columns - 1, FILE_INDEX, index)
    for i, add, rename in by_id:
        # This file's own names for the columns it holds by id, renamed back after the read.
        own = pa.schema([f.with_name(rename.get(f.name, f.name)) for f in physical])
        cols = None if wanted is None else [rename.get(c, c) for c in wanted]
        read = read_data_files(fs, root, [add], own, parts, columns=cols)
        if file_index:
            read = read.append_column(FILE_INDEX, pa.array([i] * read.num_rows, pa.int32()))
        tables.append(pa.Table.from_arrays(read.columns, schema=tables[0].schema))  # same positions
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    logical = pa.schema(list(schema)) if wanted is None else out_schema
    table = cm.to_logical(table, _with_index_field(logical) if file_index else logical)
    if filter is not None:
        table = table.filter(filter).select([*out_schema.names, *([FILE_INDEX] if file_index else [])])
    return table


def _file_schema(fs: fsspec.AbstractFileSystem, root: str, add: AddFile) -> pa.Schema:
    """The Arrow schema of a data file, Parquet field ids included (its footer only)."""
    with fs.open(data_file_path(fs, root, add.path), "rb") as f:
        return pq.read_schema(f)


def physical_row_count(fs: fsspec.AbstractFileSystem, root: str, add: AddFile) -> int:
    """Rows in the data file of ``add``, deleted ones included (its stats, else its footer)."""
    if add.num_records is not None:
        return add.num_records
    with fs.open(data_file_path(fs, root, add.path), "rb") as f:
        return int(pq.ParquetFile(f).metadata.num_rows)


def _read(
    fs: fsspec.AbstractFileSystem,
    files: Sequence[AddFile],
    paths: list[str],
    expressions: list[pc.Expression],
    full_schema: pa.Schema,
    columns: list[str],
    filter: pc.Expression | None,
    partition_columns: Sequence[str],
) -> pa.Table:
    if isinstance(fs, LocalFileSystem):
        # Native C++ I/O: parallel, column-pruned, as fast as pyarrow.parquet.read_table.
        dataset = ds.FileSystemDataset.from_paths(
            paths,
            schema=full_schema,
            format=_PARQUET_FORMAT,
            filesystem=pafs.LocalFileSystem(),
            partitions=expressions if partition_columns else None,
        )
        return dataset.to_table(columns=columns, filter=filter)
    return _read_via_fsspec(fs, files, paths, expressions, full_schema, columns, filter)


def _out_schema(
    schema: pa.Schema, partition_columns: Sequence[str], columns: Sequence[str] | None
) -> pa.Schema:
    """The schema a read returns: ``schema``, or its ``columns`` in schema order."""
    for c in partition_columns:
        if c not in schema.names:
            raise UnknownColumnError(c, schema.names, "partition columns")
    if columns is None:
        return pa.schema(list(schema))
    for c in columns:
        if c not in schema.names:
            raise UnknownColumnError(c, schema.names, "read columns")
    wanted = set(columns)
    return pa.schema([f for f in schema if f.name in wanted])


def _exact_types(table: pa.Table, out_schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``out_schema``'s types (the dataset may leave e.g. other units)."""
    if table.schema.equals(out_schema, check_metadata=True) and all(
        str(a.type) == str(b.type) for a, b in zip(table.schema, out_schema, strict=True)
    ):
        return table
    cols = [
        col if str(col.type) == str(f.type) else col.cast(f.type)
        for col, f in zip(table.columns, out_schema, strict=True)
    ]
    return pa.Table.from_arrays(cols, schema=out_schema)


def _read_via_fsspec(
    fs: fsspec.AbstractFileSystem,
    files: Sequence[AddFile],
    paths: list[str],
    expressions: list[pc.Expression],
    schema: pa.Schema,
    columns: list[str],
    filter: pc.Expression | None,
) -> pa.Table:
    """Fetch whole files through fsspec (concurrently), then decode them in C++ from memory.

    Why not ``pyarrow.fs.PyFileSystem(FSSpecHandler(fs))``: Arrow's I/O threads then call back
    into Python, and the interpreter intermittently aborts at exit ("terminate called without
    an active exception", apache/arrow#39162). Batches bound the compressed bytes held at once.
    """
    tables = []
    start = 0
    while start < len(files):
        end, size = start, 0
        while end < len(files) and (end == start or size + files[end].size <= _FETCH_BATCH_BYTES):
            size += files[end].size
            end += 1
        with ThreadPoolExecutor(max_workers=min(_FETCH_THREADS, end - start)) as pool:
            sizes = [f.size for f in files[start:end]]
            blobs = list(pool.map(fetch_file, [fs] * (end - start), paths[start:end], sizes))
        fragments = [
            _PARQUET_FORMAT.make_fragment(pa.BufferReader(pa.py_buffer(blob)), partition_expression=expr)
            for blob, expr in zip(blobs, expressions[start:end], strict=True)
        ]
        dataset = ds.FileSystemDataset(fragments, schema=schema, format=_PARQUET_FORMAT)
        table = dataset.to_table(columns=columns, filter=filter)
        if start and _FRAGMENT_INDEX in columns:  # fragments of this batch count from its start
            i = columns.index(_FRAGMENT_INDEX)
            table = table.set_column(
                i, _FRAGMENT_INDEX, pc.add(table.column(i), pa.scalar(start, pa.int32()))
            )
        tables.append(table)
        start = end
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _partition_expression(
    key: tuple[tuple[str, str | None], ...], types: Mapping[str, pa.DataType]
) -> pc.Expression:
    # The dataset materialises partition columns from these per-file guarantees (and prunes
    # files whose guarantee contradicts the filter).
    expr: pc.Expression | None = None
    for col, raw in key:
        value = decode_partition_value(raw, types[col])
        term = pc.field(col).is_null() if value is None else pc.field(col) == pa.scalar(value, types[col])
        expr = term if expr is None else expr & term
    return expr if expr is not None else pc.scalar(True)


def not_parquet(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    """Why the file at ``path`` cannot be Parquet (too small, no ``PAR1`` magic at either
    end), or None when it may be."""
    try:
        size = fs.size(path)
        if size < 12:
            return f"{size} bytes, too small for a Parquet file"
        with fs.open(path, "rb") as f:
            head = f.read(4)
            f.seek(size - 4)
            tail = f.read(4)
    except FileNotFoundError:
        return None
    return None if head == tail == b"PAR1" else "no Parquet magic bytes at its start or end"


class DataFileReader:
    """One data file, opened for reads of some of its row groups and columns.

    The footer is read once, on construction; :meth:`read` then decodes only the row groups
    and columns asked for, with exactly the table schema's types like :func:`read_data_files`
    (partition columns from the file's partition values, columns absent from the file null).
    Row groups are returned in file order, so physical row positions (what deletion vectors
    address) follow from :attr:`row_group_starts`. On a non-local filesystem the file is
    fetched whole, once, like :func:`read_data_files` does.
    """

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        add: AddFile,
        schema: pa.Schema,
        partition_columns: Sequence[str],
    ) -> None:
        _out_schema(schema, partition_columns, None)  # validates the partition columns
        # A column-mapped table's files are read by physical names (partition values too).
        self._logical: pa.Schema | None = None
        self._logical_parts = tuple(partition_columns)
        self._to_physical: dict[str, str] = {}
        if cm.is_mapped(schema):
            self._logical = schema
            physical = cm.physical_schema(schema)
            self._to_physical = dict(zip(schema.names, physical.names, strict=True))
            partition_columns = [self._to_physical[c] for c in partition_columns]
            schema = physical
        self.add = add
        self.schema = pa.schema(list(schema))
        self.partition_columns = tuple(partition_columns)
        key = tuple((c, add.partition_values.get(c)) for c in partition_columns)
        expr = _partition_expression(key, {c: schema.field(c).type for c in partition_columns})
        path = data_file_path(fs, root, add.path)
        if isinstance(fs, LocalFileSystem):
            self._fragment = _PARQUET_FORMAT.make_fragment(
                path, filesystem=pafs.LocalFileSystem(), partition_expression=expr
            )
        else:
            source = pa.BufferReader(pa.py_buffer(fetch_file(fs, path, add.size)))
            self._fragment = _PARQUET_FORMAT.make_fragment(source, partition_expression=expr)
        try:
            self.metadata: pq.FileMetaData = self._fragment.metadata
        except pa.ArrowInvalid as exc:  # no Parquet footer: an empty or torn file
            raise CorruptDataFileError(root, path, None, str(exc)) from exc
        if self._logical is not None and cm.is_id_mode(self._logical):
            # id mode: columns this file holds under other names (same field id) read by those.
            rename = cm.resolve_by_id(self._fragment.physical_schema, self.schema)
            if rename:
                self.schema = pa.schema([f.with_name(rename.get(f.name, f.name)) for f in self.schema])
                self._to_physical = {k: rename.get(v, v) for k, v in self._to_physical.items()}
        rows = [self.metadata.row_group(i).num_rows for i in range(self.metadata.num_row_groups)]
        #: First physical row of each row group, then the file's row count.
        self.row_group_starts: list[int] = [0]
        for n in rows:
            self.row_group_starts.append(self.row_group_starts[-1] + n)

    @property
    def num_rows(self) -> int:
        """Physical rows in the file (deleted ones included)."""
        return self.row_group_starts[-1]

    @property
    def num_row_groups(self) -> int:
        return len(self.row_group_starts) - 1

    def read(self, columns: Sequence[str] | None = None, row_groups: Sequence[int] | None = None) -> pa.Table:
        """``columns`` (default all, in schema order) of ``row_groups`` (default all, in file order)."""
        if self._logical is not None:
            logical = _out_schema(self._logical, self._logical_parts, columns)
            physical = self._read([self._to_physical[c] for c in logical.names], row_groups)
            return cm.to_logical(physical, logical)
        return self._read(columns, row_groups)

    def _read(self, columns: Sequence[str] | None, row_groups: Sequence[int] | None) -> pa.Table:
        out_schema = _out_schema(self.schema, self.partition_columns, columns)
        fragment = self._fragment
        if row_groups is not None and list(row_groups) != list(range(self.num_row_groups)):
            fragment = fragment.subset(row_group_ids=list(row_groups))
        dataset = ds.FileSystemDataset([fragment], schema=self.schema, format=_PARQUET_FORMAT)
        return _exact_types(dataset.to_table(columns=out_schema.names), out_schema)

    def read_hidden(self, names: Sequence[str], row_groups: Sequence[int] | None = None) -> pa.Table | None:
        """Columns ``names`` that are in the file but not in the table schema (row tracking's
        materialized ids), as int64, of ``row_groups`` (default all): None when the file has
        none of them, a null column for each one it lacks."""
        present = [n for n in names if n in self._fragment.physical_schema.names]
        if not present:
            return None
        fragment = self._fragment
        if row_groups is not None and list(row_groups) != list(range(self.num_row_groups)):
            fragment = fragment.subset(row_group_ids=list(row_groups))
        read = fragment.to_table(columns=present)
        return pa.table(
            {
                n: read.column(n).cast(pa.int64()) if n in present else pa.nulls(read.num_rows, pa.int64())
                for n in names
            }
        )

    def row_group_stats(self, columns: Iterable[str]) -> pa.Table:
        """The row groups' Parquet statistics in :func:`eventlog.files.stats.stats_table`'s layout
        (one row per row group), for :func:`eventlog.expr.skipping.may_match`.

        ``numRecords``, and for each of ``columns`` that is a flat top-level data column:
        ``min.<c>`` and ``max.<c>`` (typed as the schema) and ``nullCount.<c>``; a column the
        file lacks is all null. Anything not known for sure is left null or out (unknown):
        INT96 values, values that do not convert to the column's type, and the max of
        floating-point columns (Parquet writers leave NaN out of min/max, SQL orders NaN
        above every number; the min is still a lower bound).
        """
        if self._logical is not None:
            names = {self._to_physical[c]: c for c in columns if c in self._to_physical}
            stats = self._row_group_stats(names)
            return stats.rename_columns(
                [n if n == "numRecords" else f"{n.partition('.')[0]}.{names[n.partition('.')[2]]}"
                 for n in stats.column_names]
            )  # fmt: skip
        return self._row_group_stats(columns)

    def _row_group_stats(self, columns: Iterable[str]) -> pa.Table:
        n = self.num_row_groups
        groups = [self.metadata.row_group(i) for i in range(n)]
        names: list[str] = ["numRecords"]
        arrays: list[pa.Array] = [pa.array([g.num_rows for g in groups], pa.int64())]
        leaves = self._flat_leaves()
        parts = set(self.partition_columns)
        for name in dict.fromkeys(columns):
            if name not in self.schema.names or name in parts:
                continue
            t = self.schema.field(name).type
            if name not in leaves:
                if any(name == f.name for f in self._fragment.physical_schema):
                    continue  # nested in the file: nothing known
                # absent from the file: every value is null (no comparison holds)
                names.append(f"nullCount.{name}")
                arrays.append(pa.array([g.num_rows for g in groups], pa.int64()))
                if _has_minmax(t):
                    names += [f"min.{name}", f"max.{name}"]
                    arrays += [pa.nulls(n, t), pa.nulls(n, t)]
                continue
            stats = [groups[i].column(leaves[name]).statistics for i in range(n)]
            nulls = [s.null_count if s is not None and s.has_null_count else None for s in stats]
            names.append(f"nullCount.{name}")
            arrays.append(pa.array(nulls, pa.int64()))
            if not _has_minmax(t) or self.metadata.schema.column(leaves[name]).physical_type == "INT96":
                continue
            names.append(f"min.{name}")
            arrays.append(_typed_bounds([_stat_bound(s, "min") for s in stats], t))
            if not pa.types.is_floating(t):
                names.append(f"max.{name}")
                arrays.append(_typed_bounds([_stat_bound(s, "max") for s in stats], t))
        return pa.Table.from_arrays(arrays, names=names)

    def _flat_leaves(self) -> dict[str, int]:
        """Parquet leaf index of each flat top-level column of the file (unambiguous paths only)."""
        schema = self.metadata.schema
        top = {f.name for f in self._fragment.physical_schema if not pa.types.is_nested(f.type)}
        found: dict[str, int] = {}
        seen: set[str] = set()
        for i in range(len(schema)):
            col = schema.column(i)
            path = col.path
            if path in seen:
                found.pop(path, None)  # two leaves with one dotted path: trust neither
                continue
            seen.add(path)
            if path in top and col.max_repetition_level == 0:
                found[path] = i
        return found


def _stat_bound(stats: Any, which: str) -> Any:
    """The row group's min or max as a Python value, or None when absent or unreadable."""
    if stats is None or not stats.has_min_max:
        return None
    try:
        value = getattr(stats, which)
    except (ValueError, TypeError, OverflowError, pa.ArrowException):
        return None
    if isinstance(value, float) and value != value:  # NaN: no bound
        return None
    return value


def _typed_bounds(values: list[Any], t: pa.DataType) -> pa.Array:
    """``values`` as an array of type ``t``; a value that does not convert becomes null."""
    # The fast path converts all at once; any unconvertible value sends us to the slow path.
    with contextlib.suppress(ValueError, TypeError, OverflowError, pa.ArrowException):
        return pa.array(values, t)
    out = []
    for v in values:
        try:
            out.append(None if v is None else pa.scalar(v, t).as_py())
        except (ValueError, TypeError, OverflowError, pa.ArrowException):
            out.append(None)
    return pa.array(out, t)


# Files up to this size are fetched in one GET; larger ones as s3fs splits them (a HEAD,
# then concurrent ranged GETs), which is faster for big files.
_ONE_GET_BYTES = 50 << 20


def fetch_file(fs: fsspec.AbstractFileSystem, path: str, size: int) -> bytes:
    """The bytes of a data file whose size the log records (``add.size``)."""
    return bytes(fs.cat_file(path, **(whole_file_options(fs) if size <= _ONE_GET_BYTES else {})))
