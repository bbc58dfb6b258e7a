"""Data files of a table: write Parquet files (with their add actions and stats) and read them.

Layout follows Delta/Spark: ``<col>=<value>/.../part-<5 digits>-<uuid>.c000.snappy.parquet``
with partition directory names escaped like Hive (``escapePathName``), partition columns
*not* stored in the files, and ``add.path`` the relative path percent-encoded as a URI path
(readers unquote it). Timestamps are written as INT64 microseconds; statistics follow Delta's
JSON form (see :func:`file_stats`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from decimal import Decimal
from typing import Any
from urllib.parse import quote, unquote, urlparse

import fsspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from eventlog.errors import InvalidInputError, UnknownColumnError
from eventlog.files.partition_values import escape_path_name
from eventlog.files.schema import decode_partition_value, encode_partition_value
from eventlog.files.stats import _has_minmax
from eventlog.log.actions import AddFile

__all__ = [
    "DEFAULT_TARGET_FILE_SIZE",
    "DataFileReader",
    "delete_files",
    "file_stats",
    "read_data_files",
    "write_data_files",
]

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
STRING_PREFIX_LENGTH = 32  # Delta's dataSkippingStringPrefixLength
_MAX_ROW_GROUP_BYTES = 64 * 1024 * 1024
_MAX_ROW_GROUP_ROWS = 1024 * 1024
_GROUP_SLICE_ROWS = 1024 * 1024
_EPOCH = dt.datetime(1970, 1, 1)
_FETCH_BATCH_BYTES = 256 * 1024 * 1024  # compressed bytes fetched per batch (non-local fs)
_FETCH_THREADS = 16
_EPOCH_DATE = dt.date(1970, 1, 1)

_WRITE_OPTIONS: dict[str, Any] = dict(
    compression="snappy",
    coerce_timestamps="us",
    use_deprecated_int96_timestamps=False,
    write_statistics=True,
)


def _partition_dir(partition_columns: Sequence[str], values: Mapping[str, str | None]) -> str:
    parts = []
    for col in partition_columns:
        v = values.get(col)
        parts.append(
            f"{escape_path_name(col)}={HIVE_DEFAULT_PARTITION if v is None else escape_path_name(v)}"
        )
    return "/".join(parts)


# --------------------------------------------------------------------------- writing


def write_data_files(
    fs: fsspec.AbstractFileSystem,
    root: str,
    data: pa.Table,
    *,
    partition_columns: Sequence[str],
    data_change: bool = True,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    max_rows_per_file: int | None = None,
) -> list[AddFile]:
    """Write ``data`` (already conformed, partition columns included) as Parquet files.

    Rows are grouped by partition values; a file is closed once it reaches
    ``target_file_size`` bytes (checked after each row group) or ``max_rows_per_file`` rows.
    Returns one :class:`AddFile` per file. On failure the files written so far are deleted.
    """
    pcols = list(partition_columns)
    for c in pcols:
        if c not in data.column_names:
            raise UnknownColumnError(c, data.column_names, "partition columns")
        t = data.schema.field(c).type
        if pa.types.is_nested(t) or pa.types.is_null(t):
            raise InvalidInputError(
                f"partition column {c!r} has type {t}, which cannot be a partition column"
            )
    if len(set(pcols)) != len(pcols):
        raise InvalidInputError(f"duplicate partition columns {pcols}")
    if pcols and len(pcols) == data.num_columns:
        raise InvalidInputError("cannot use all columns as partition columns: no data columns would remain")
    if max_rows_per_file is not None and max_rows_per_file < 1:
        raise InvalidInputError(f"max_rows_per_file must be positive, got {max_rows_per_file}")
    if target_file_size < 1:
        raise InvalidInputError(f"target_file_size must be positive, got {target_file_size}")
    if data.num_rows == 0:
        return []

    # Zero-copy: the files hold every column but the partition columns.
    file_data = data.drop_columns(pcols) if pcols else data
    file_data = file_data.replace_schema_metadata(None)
    row_bytes = max(1, file_data.nbytes // max(1, data.num_rows))
    rows_per_group = max(
        1, min(_MAX_ROW_GROUP_ROWS, min(target_file_size, _MAX_ROW_GROUP_BYTES) // row_bytes)
    )
    if max_rows_per_file is not None:
        rows_per_group = min(rows_per_group, max_rows_per_file)
    writer = _Writer(fs, root.rstrip("/"), file_data, data_change, target_file_size, max_rows_per_file)
    try:
        if not pcols:
            writer.write_group({}, "", None, rows_per_group)
        else:
            for values, indices in _partition_groups(data, pcols):
                pdir = _partition_dir(pcols, values)
                writer.write_group(
                    values, pdir, None if len(indices) == data.num_rows else indices, rows_per_group
                )
    except BaseException:
        delete_files(fs, root, writer.started)
        raise
    return writer.adds


def _partition_groups(
    data: pa.Table, pcols: list[str]
) -> list[tuple[dict[str, str | None], pa.ChunkedArray]]:
    """(encoded partition values, row indices) per distinct partition, rows in input order.

    Works on slices of ``_GROUP_SLICE_ROWS`` rows with plain compute kernels (dictionary
    codes + stable sort) so scratch memory stays small and on the calling thread; only the
    row indices (4 bytes a row) outlive the slice.
    """
    n = data.num_rows
    id_type = pa.uint32() if n < 2**32 else pa.uint64()
    types = [data.schema.field(c).type for c in pcols]
    groups: dict[tuple[str | None, ...], list[pa.Array]] = {}
    for start in range(0, n, _GROUP_SLICE_ROWS):
        part = data.select(pcols).slice(start, _GROUP_SLICE_ROWS).combine_chunks()
        codes: pa.Array | None = None
        for col in part.columns:
            enc = pc.dictionary_encode(col.chunk(0), null_encoding="encode")
            idx = enc.indices.cast(pa.int64())
            if codes is None:
                codes = idx
            else:  # re-densify so the combined code never overflows
                combined = pc.add(pc.multiply(codes, len(enc.dictionary)), idx)
                codes = pc.dictionary_encode(combined).indices.cast(pa.int64())
        assert codes is not None
        order = pc.sort_indices(codes)  # stable: rows of a group stay in input order
        runs = pc.run_end_encode(codes.take(order))
        ends = runs.run_ends.to_pylist()
        starts = [0, *ends[:-1]]
        first_rows = order.take(pa.array(starts, pa.int64()))
        keys = part.take(first_rows).to_pylist()
        row_ids = pc.add(order.cast(id_type), pa.scalar(start, id_type))
        for key, lo, hi in zip(keys, starts, ends, strict=True):
            # Keyed by the encoded values: those define the partition (and NaN == NaN there).
            enc_key = tuple(encode_partition_value(key[c], t) for c, t in zip(pcols, types, strict=True))
            groups.setdefault(enc_key, []).append(row_ids.slice(lo, hi - lo))
    return [
        (dict(zip(pcols, k, strict=True)), pa.chunked_array(chunks, id_type)) for k, chunks in groups.items()
    ]


class _Writer:
    """Writes the files of one ``write_data_files`` call and collects their add actions."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        file_data: pa.Table,
        data_change: bool,
        target_file_size: int,
        max_rows: int | None,
    ) -> None:
        self.fs = fs
        self.root = root
        self.file_data = file_data
        self.schema = file_data.schema
        self.data_change = data_change
        self.target = target_file_size
        self.max_rows = max_rows
        self.adds: list[AddFile] = []
        self.started: list[str] = []  # add.path of every file opened, for cleanup on failure
        self.made_dirs: set[str] = set()
        self.dictionary: list[str] | bool | None = None  # decided on the first file

    def _open_sink(self, path: str) -> Any:
        """A writable file: pyarrow's native file on local disks (no Python-level write
        calls per page), an fsspec file elsewhere."""
        if isinstance(self.fs, LocalFileSystem):
            return pa.OSFile(path, "wb")
        return self.fs.open(path, "wb")

    def write_group(
        self, values: dict[str, str | None], pdir: str, indices: pa.ChunkedArray | None, rows_per_group: int
    ) -> None:
        total = self.file_data.num_rows if indices is None else len(indices)
        directory = f"{self.root}/{pdir}" if pdir else self.root
        if directory not in self.made_dirs:
            self.fs.makedirs(directory, exist_ok=True)
            self.made_dirs.add(directory)
        pos = 0
        while pos < total:
            name = f"part-{len(self.started):05d}-{uuid.uuid4()}.c000.snappy.parquet"
            rel = f"{pdir}/{name}" if pdir else name
            self.started.append(quote(rel, safe="/="))
            stats = _StatsAccumulator(self.schema)
            pending: Future[None] | None = None
            rows = 0
            if self.dictionary is None:
                self.dictionary = dictionary_columns(self.file_data)
            with self._open_sink(f"{directory}/{name}") as sink:
                with pq.ParquetWriter(
                    sink, self.schema, use_dictionary=self.dictionary, **_WRITE_OPTIONS
                ) as writer:
                    while pos < total:
                        n = min(rows_per_group, total - pos)
                        if self.max_rows is not None:
                            n = min(n, self.max_rows - rows)
                        # Only one row group is materialised at a time: slices are zero-copy,
                        # and a take copies just the rows of this row group.
                        if indices is None:
                            chunk = self.file_data.slice(pos, n)
                        else:
                            chunk = self.file_data.take(indices.slice(pos, n))
                        # Statistics of this row group are computed on another thread while
                        # Parquet encodes it (both release the GIL); one update at a time
                        # keeps the accumulator single-threaded.
                        if pending is not None:
                            pending.result()
                            pending = None
                        if chunk.num_rows >= _PARALLEL_STATS_ROWS:
                            pending = _STATS_POOL.submit(stats.update, chunk)
                        else:  # a thread hand-off costs more than small statistics
                            stats.update(chunk)
                        writer.write_table(chunk, row_group_size=n)
                        pos += n
                        rows += n
                        if self.max_rows is not None and rows >= self.max_rows:
                            break
                        if sink.tell() >= self.target:
                            break
                size = int(sink.tell())
            if pending is not None:
                pending.result()
            self.adds.append(
                AddFile(
                    path=self.started[-1],
                    partition_values=dict(values),
                    size=size,
                    modification_time=int(time.time() * 1000),
                    data_change=self.data_change,
                    stats=stats.to_json(),
                )
            )


def dictionary_columns(data: pa.Table) -> list[str] | bool:
    """The columns worth dictionary-encoding, judged on a sample of ``data``.

    Dictionary encoding of a column whose values are mostly distinct (ids, measurements,
    timestamps) is tried and then abandoned by the encoder, which costs about a third of
    the write time for nothing. Flat columns with few distinct values in the first
    ``_DICTIONARY_SAMPLE_ROWS`` rows keep it; small inputs and nested schemas keep the
    encoder's default (dictionary everywhere).
    """
    sample = data.slice(0, _DICTIONARY_SAMPLE_ROWS)
    if sample.num_rows < _DICTIONARY_MIN_ROWS or any(pa.types.is_nested(t) for t in data.schema.types):
        return True
    chosen = []
    for name, column in zip(sample.column_names, sample.columns, strict=True):
        present = len(column) - column.null_count
        if present == 0 or pc.count_distinct(column).as_py() <= present * _DICTIONARY_MAX_DISTINCT:
            chosen.append(name)
    return chosen


_DICTIONARY_SAMPLE_ROWS = 16_384
_DICTIONARY_MIN_ROWS = 1_000
_DICTIONARY_MAX_DISTINCT = 0.5  # share of distinct values above which dictionaries do not pay


# --------------------------------------------------------------------------- statistics

_STATS_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventlog-stats")
_PARALLEL_STATS_ROWS = 65_536


def _leaf_columns(table: pa.Table) -> Iterable[tuple[tuple[str, ...], pa.ChunkedArray]]:
    """Non-struct leaves; struct children carry their parents' nulls (Spark counts those)."""

    def walk(
        path: tuple[str, ...], col: pa.ChunkedArray
    ) -> Iterable[tuple[tuple[str, ...], pa.ChunkedArray]]:
        if pa.types.is_struct(col.type):
            for i, child in enumerate(col.flatten()):
                yield from walk((*path, col.type.field(i).name), child)
        else:
            yield path, col

    for name, col in zip(table.column_names, table.columns, strict=True):
        yield from walk((name,), col)


def _minmax_kind(t: pa.DataType) -> str | None:
    types = pa.types
    if types.is_integer(t) or types.is_boolean(t):
        return "plain"
    if types.is_floating(t):
        return "float"
    if types.is_decimal(t):
        return "decimal"
    if types.is_string(t) or types.is_large_string(t):
        return "string"
    if types.is_date32(t):
        return "date"
    if types.is_timestamp(t):
        return "ts" if t.tz is not None else "ntz"
    return None  # binary, lists, maps: nullCount only


class _StatsAccumulator:
    """Delta stats of a file, accumulated row group by row group (vectorised per group)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.num_records = 0
        self.null_counts: dict[tuple[str, ...], int] = {}
        self.mins: dict[tuple[str, ...], Any] = {}
        self.maxs: dict[tuple[str, ...], Any] = {}
        self.kinds: dict[tuple[str, ...], str | None] = {}
        self.has_nan: set[tuple[str, ...]] = set()
        for path, col in _leaf_columns(schema.empty_table()):
            self.null_counts[path] = 0
            self.kinds[path] = _minmax_kind(col.type)

    def update(self, table: pa.Table | pa.RecordBatch) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        self.num_records += table.num_rows
        for path, col in _leaf_columns(table):
            nulls = col.null_count
            self.null_counts[path] += nulls
            kind = self.kinds[path]
            if kind is None or nulls == len(col):
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"], mm["max"]
            if kind == "date":
                lo_v, hi_v = lo.value, hi.value  # days since the epoch
            elif kind in ("ts", "ntz"):  # microseconds since the epoch, whatever the unit
                per_us = _UNITS_PER_US[col.type.unit]
                lo_v, hi_v = _to_micros(lo.value, per_us, False), _to_micros(hi.value, per_us, True)
            else:
                lo_v, hi_v = lo.as_py(), hi.as_py()
            if kind == "float" and pc.any(pc.is_nan(col)).as_py():
                # Spark orders NaN above every number: the max is unknown, the min still holds.
                self.has_nan.add(path)
            if lo_v is not None and (path not in self.mins or lo_v < self.mins[path]):
                self.mins[path] = lo_v
            if hi_v is not None and (path not in self.maxs or hi_v > self.maxs[path]):
                self.maxs[path] = hi_v

    def to_json(self) -> str:
        min_values: dict[str, Any] = {}
        max_values: dict[str, Any] = {}
        null_count: dict[str, Any] = {}
        for path, nulls in self.null_counts.items():
            _put(null_count, path, nulls)
            kind = self.kinds[path]
            if kind is None:
                continue
            if path in self.mins:
                lo = _json_value(self.mins[path], kind, upper=False)
                if lo is not None:
                    _put(min_values, path, lo)
            if path in self.maxs and path not in self.has_nan:
                hi = _json_value(self.maxs[path], kind, upper=True)
                if hi is not None:
                    _put(max_values, path, hi)
        doc = {
            "numRecords": self.num_records,
            "minValues": min_values,
            "maxValues": max_values,
            "nullCount": null_count,
        }
        return orjson.dumps(doc).decode()


_UNITS_PER_US = {"s": 1e-6, "ms": 1e-3, "us": 1, "ns": 1000}


def _to_micros(v: int | None, per_us: float, upper: bool) -> int | None:
    if v is None or per_us == 1:
        return v
    if per_us < 1:
        return v * round(1 / per_us)
    return -(-v // int(per_us)) if upper else v // int(per_us)


def _put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc.setdefault(part, {})
    doc[path[-1]] = value


def _json_value(v: Any, kind: str, *, upper: bool) -> Any:
    """A min (``upper=False``) or max in Delta's JSON form, or None to omit it."""
    if kind == "plain":
        return v
    if kind == "float":
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if kind == "decimal":
        assert isinstance(v, Decimal)
        return orjson.Fragment(format(v, "f").encode())  # exact digits as a JSON number
    if kind == "string":
        assert isinstance(v, str)
        if len(v) <= STRING_PREFIX_LENGTH:
            return v
        # A prefix is still a lower bound; a truncated max would not be an upper bound.
        return None if upper else v[:STRING_PREFIX_LENGTH]
    try:
        if kind == "date":
            return (_EPOCH_DATE + dt.timedelta(days=v)).isoformat()
        # Delta keeps millisecond precision: floor the min, ceil the max so skipping stays safe.
        ms = -(-v // 1000) if upper else v // 1000
        t = _EPOCH + dt.timedelta(milliseconds=ms)
    except OverflowError:  # outside Python's datetime range: no bound rather than a wrong one
        return None
    text = f"{t.year:04d}-{t:%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}"
    return text + "Z" if kind == "ts" else text


def file_stats(batch_or_table: pa.Table | pa.RecordBatch) -> str:
    """Delta stats JSON (numRecords, minValues, maxValues, nullCount) of data about to be written.

    Dates are ``YYYY-MM-DD``; timestamps ISO with milliseconds (``Z`` suffix when tz-aware),
    the min truncated and the max rounded up to the millisecond; decimals are exact JSON
    numbers; strings keep a 32-character prefix as min and drop a longer max; binary, array
    and map columns get a null count only; struct columns nest.
    """
    acc = _StatsAccumulator(batch_or_table.schema)
    acc.update(batch_or_table)
    return acc.to_json()


# --------------------------------------------------------------------------- reading

_PARQUET_FORMAT = ds.ParquetFileFormat(
    # Spark writes INT96 timestamps by default; read them as microseconds like the table type.
    read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"),
)


def _file_path(fs: fsspec.AbstractFileSystem, root: str, path: str) -> str:
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
) -> pa.Table:
    """Read ``files`` as one table with exactly ``schema`` (or ``columns``, in schema order).

    Partition columns come from each file's partition values; columns absent from older files
    are null; ``filter`` (over column names, partition columns included) is applied with
    Parquet row-group and partition pruning.
    """
    out_schema = _out_schema(schema, partition_columns, columns)
    if not files:
        return out_schema.empty_table()
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
    paths = [_file_path(fs, root, add.path) for add in files]
    full_schema = pa.schema(list(schema))
    if isinstance(fs, LocalFileSystem):
        # Native C++ I/O: parallel, column-pruned, as fast as pyarrow.parquet.read_table.
        dataset = ds.FileSystemDataset.from_paths(
            paths,
            schema=full_schema,
            format=_PARQUET_FORMAT,
            filesystem=pafs.LocalFileSystem(),
            partitions=expressions if partition_columns else None,
        )
        table = dataset.to_table(columns=out_schema.names, filter=filter)
    else:
        table = _read_via_fsspec(fs, files, paths, expressions, full_schema, out_schema.names, filter)
    return _exact_types(table, out_schema)


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
            blobs = list(pool.map(fs.cat_file, paths[start:end]))
        fragments = [
            _PARQUET_FORMAT.make_fragment(pa.BufferReader(pa.py_buffer(blob)), partition_expression=expr)
            for blob, expr in zip(blobs, expressions[start:end], strict=True)
        ]
        dataset = ds.FileSystemDataset(fragments, schema=schema, format=_PARQUET_FORMAT)
        tables.append(dataset.to_table(columns=columns, filter=filter))
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
        self.add = add
        self.schema = pa.schema(list(schema))
        self.partition_columns = tuple(partition_columns)
        key = tuple((c, add.partition_values.get(c)) for c in partition_columns)
        expr = _partition_expression(key, {c: schema.field(c).type for c in partition_columns})
        path = _file_path(fs, root, add.path)
        if isinstance(fs, LocalFileSystem):
            self._fragment = _PARQUET_FORMAT.make_fragment(
                path, filesystem=pafs.LocalFileSystem(), partition_expression=expr
            )
        else:
            source = pa.BufferReader(pa.py_buffer(fs.cat_file(path)))
            self._fragment = _PARQUET_FORMAT.make_fragment(source, partition_expression=expr)
        self.metadata: pq.FileMetaData = self._fragment.metadata
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
        out_schema = _out_schema(self.schema, self.partition_columns, columns)
        fragment = self._fragment
        if row_groups is not None and list(row_groups) != list(range(self.num_row_groups)):
            fragment = fragment.subset(row_group_ids=list(row_groups))
        dataset = ds.FileSystemDataset([fragment], schema=self.schema, format=_PARQUET_FORMAT)
        return _exact_types(dataset.to_table(columns=out_schema.names), out_schema)

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
    try:
        return pa.array(values, t)
    except (ValueError, TypeError, OverflowError, pa.ArrowException):
        pass
    out = []
    for v in values:
        try:
            out.append(None if v is None else pa.scalar(v, t).as_py())
        except (ValueError, TypeError, OverflowError, pa.ArrowException):
            out.append(None)
    return pa.array(out, t)


# --------------------------------------------------------------------------- cleanup


def delete_files(fs: fsspec.AbstractFileSystem, root: str, relative_paths: Iterable[str]) -> None:
    """Best-effort delete of data files given by their ``add.path`` (missing files are fine)."""
    for rel in relative_paths:
        path = _file_path(fs, root, rel)
        try:
            with contextlib.suppress(FileNotFoundError):  # already gone: the goal
                fs.rm_file(path)
        except Exception as exc:  # cleanup must never mask the error that triggered it
            log.warning("could not delete staged data file %s: %s", path, exc)
