"""Writing data files: :func:`write_data_files` writes a table's rows as Parquet files and
returns their add actions (with Delta statistics); :func:`delete_files` removes files
written by a transaction that did not commit.

Layout follows Delta/Spark: ``<col>=<value>/.../part-<5 digits>-<uuid>.c000.snappy.parquet``
with partition directory names escaped like Hive (``escapePathName``), partition columns
*not* stored in the files, and ``add.path`` the relative path percent-encoded as a URI path
(readers unquote it: :func:`eventlog.files.reader.data_file_path`). Timestamps are written
as INT64 microseconds; statistics follow Delta's JSON form
(:func:`eventlog.files.write_stats.file_stats`).
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import string
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from eventlog.errors import InvalidInputError, UnknownColumnError, storage_step
from eventlog.files import column_mapping as cm
from eventlog.files.partition_values import escape_path_name
from eventlog.files.reader import data_file_path
from eventlog.files.schema import encode_partition_value
from eventlog.files.write_stats import StatsAccumulator
from eventlog.log.actions import AddFile
from eventlog.log.durable import sync_written

__all__ = [
    "DEFAULT_TARGET_FILE_SIZE",
    "delete_files",
    "dictionary_columns",
    "write_data_files",
]

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_MAX_ROW_GROUP_BYTES = 64 * 1024 * 1024
_NAME_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_MAX_ROW_GROUP_ROWS = 1024 * 1024
_GROUP_SLICE_ROWS = 1024 * 1024

_WRITE_OPTIONS: dict[str, Any] = dict(
    compression="snappy",
    coerce_timestamps="us",
    use_deprecated_int96_timestamps=False,
    write_statistics=True,
)

# Statistics of a large row group are computed on this thread while Parquet encodes it.
_STATS_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventlog-stats")
_PARALLEL_STATS_ROWS = 65_536

# Row groups of a stream are encoded here while the caller prepares the next (a file's
# row groups one at a time, in order; two files at once).
_ENCODE_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="eventlog-encode")


def partition_dir(partition_columns: Sequence[str], values: Mapping[str, str | None]) -> str:
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
    name_prefix: str | None = None,
    stem: str = "part",
    hidden: Sequence[str] = (),
) -> list[AddFile]:
    """Write ``data`` (already conformed, partition columns included) as Parquet files.

    Rows are grouped by partition values; a file is closed once it reaches
    ``target_file_size`` bytes (checked after each row group) or ``max_rows_per_file`` rows.
    Returns one :class:`AddFile` per file. On failure the files written so far are deleted.
    ``name_prefix`` (letters, digits, ``-``, ``_``, ``.``) names the files
    ``part-<prefix>-<5 digits>-<uuid>...`` so that a writer (a streaming batch) can
    recognise its own files later. ``stem`` replaces ``part`` (change data files are
    ``cdc-...``). Columns named in ``hidden`` (row tracking's materialized ids, not in the
    table schema) are written as they are, without statistics.
    """
    check_layout(data.schema, partition_columns, target_file_size, name_prefix)
    if max_rows_per_file is not None and max_rows_per_file < 1:
        raise InvalidInputError(f"max_rows_per_file must be positive, got {max_rows_per_file}")
    if data.num_rows == 0:
        return []
    data, pcols, random_dirs = physical_layout(data, partition_columns)
    # Zero-copy: the files hold every column but the partition columns.
    file_data = data.drop_columns(pcols) if pcols else data
    file_data = file_data.replace_schema_metadata(None)
    group_rows = rows_per_group(file_data, target_file_size)
    if max_rows_per_file is not None:
        group_rows = min(group_rows, max_rows_per_file)
    files = FileWriters(
        fs, root, file_data.schema, data_change=data_change, target_file_size=target_file_size,
        name_prefix=name_prefix, stem=stem, random_dirs=random_dirs, hidden=hidden,
    )  # fmt: skip
    files.dictionary = dictionary_columns(file_data)
    adds: list[AddFile] = []
    try:
        if not pcols:
            adds += _write_group(files, file_data, {}, "", None, group_rows, max_rows_per_file)
        else:
            for values, indices in partition_groups(data, pcols):
                pdir = partition_dir(pcols, values)
                part = None if len(indices) == data.num_rows else indices
                adds += _write_group(files, file_data, values, pdir, part, group_rows, max_rows_per_file)
    except BaseException:
        files.delete_started()
        raise
    return adds


def physical_layout(data: pa.Table, partition_columns: Sequence[str]) -> tuple[pa.Table, list[str], bool]:
    """``data`` and its partition columns as the files and partition values name them, and
    whether each file goes in a random-prefix directory.

    Column mapping: files, statistics and partition values use physical names, and the
    files of a partitioned table go in random-prefix directories (as Delta's writer does),
    since directories named after logical columns would go stale on a rename."""
    pcols = list(partition_columns)
    if not cm.is_mapped(data.schema):
        return data, pcols, False
    names = {f.name: cm.physical_name(f) for f in data.schema}
    return cm.to_physical(data, data.schema), [names[c] for c in pcols], bool(pcols)


def check_layout(
    schema: pa.Schema, partition_columns: Sequence[str], target_file_size: int, name_prefix: str | None
) -> None:
    """InvalidInputError (or UnknownColumnError) unless rows of ``schema`` can be written as
    files of a table partitioned by ``partition_columns``."""
    pcols = list(partition_columns)
    for c in pcols:
        if c not in schema.names:
            raise UnknownColumnError(c, schema.names, "partition columns")
        t = schema.field(c).type
        if pa.types.is_nested(t) or pa.types.is_null(t):
            raise InvalidInputError(
                f"partition column {c!r} has type {t}, which cannot be a partition column"
            )
    if len(set(pcols)) != len(pcols):
        raise InvalidInputError(f"duplicate partition columns {pcols}")
    if pcols and len(pcols) == len(schema):
        raise InvalidInputError("cannot use all columns as partition columns: no data columns would remain")
    if target_file_size < 1:
        raise InvalidInputError(f"target_file_size must be positive, got {target_file_size}")
    if name_prefix is not None and not _NAME_PREFIX.fullmatch(name_prefix):
        raise InvalidInputError(
            f"name_prefix must be 1-200 letters, digits, '-', '_' or '.', got {name_prefix!r}"
        )


def rows_per_group(file_data: pa.Table, target_file_size: int) -> int:
    """Rows of one row group: about 64 MB (or the target file size, if smaller) of
    ``file_data``'s rows, at most 1M rows."""
    row_bytes = max(1, int(file_data.nbytes) // max(1, file_data.num_rows))
    return max(1, int(min(_MAX_ROW_GROUP_ROWS, min(target_file_size, _MAX_ROW_GROUP_BYTES) // row_bytes)))


def partition_groups(data: pa.Table, pcols: list[str]) -> list[tuple[dict[str, str | None], pa.ChunkedArray]]:
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


# Delta's random file prefixes (DeltaSQLConf randomPrefixLength, alphanumeric characters).
_RANDOM_PREFIX_LENGTH = 2
_PREFIX_CHARS = string.ascii_letters + string.digits

_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"})


def _flat_namespace(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is an object store: keys, no directories (``makedirs`` would only
    cost a request)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool(_OBJECT_STORES & set(protocols))


class FileWriters:
    """Opens the data files of one write (:meth:`open`) and keeps what cleanup needs: the
    ``add.path`` of every file started."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        schema: pa.Schema,
        *,
        data_change: bool,
        target_file_size: int,
        name_prefix: str | None = None,
        stem: str = "part",
        random_dirs: bool = False,
        hidden: Sequence[str] = (),
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.schema = schema  # of the files: partition columns left out
        self.data_change = data_change
        self.target = target_file_size
        self.started: list[str] = []  # add.path of every file opened, for cleanup on failure
        self.made_dirs: set[str] = set()
        self.dictionary: list[str] | bool = True  # the columns to dictionary-encode
        self.name_prefix = f"{name_prefix}-" if name_prefix else ""  # of every file name
        self.stem = stem  # the first word of every file name
        self.random_dirs = random_dirs  # each file in a random-prefix directory instead of ``pdir``
        self.stats_schema = pa.schema([f for f in schema if f.name not in set(hidden)])
        self.background = False  # Parquet-encode each row group on another thread

    def open(self, values: Mapping[str, str | None], pdir: str) -> DataFileWriter:
        """A new data file of the partition ``values`` (directory ``pdir``)."""
        if self.random_dirs:
            pdir = "".join(random.choices(_PREFIX_CHARS, k=_RANDOM_PREFIX_LENGTH))
        directory = f"{self.root}/{pdir}" if pdir else self.root
        if directory not in self.made_dirs:
            if not _flat_namespace(self.fs):  # an object store has no directories to make
                with storage_step(self.root, pdir or "."):
                    self.fs.makedirs(directory, exist_ok=True)
            self.made_dirs.add(directory)
        name = f"{self.stem}-{self.name_prefix}{len(self.started):05d}-{uuid.uuid4()}.c000.snappy.parquet"
        rel = quote(f"{pdir}/{name}" if pdir else name, safe="/=")
        self.started.append(rel)
        return DataFileWriter(self, f"{directory}/{name}", rel, dict(values))

    def delete_started(self) -> None:
        """Delete every file this write started (it failed)."""
        delete_files(self.fs, self.root, self.started)


class DataFileWriter:
    """One open data file: row groups are written with :meth:`write`, statistics gathered
    as they go; :meth:`close` returns the file's add action."""

    def __init__(self, files: FileWriters, path: str, rel: str, values: dict[str, str | None]) -> None:
        self.files = files
        self.rel = rel
        self.values = values
        self.rows = 0
        self._path = path
        self._stats = StatsAccumulator(files.stats_schema)
        self._pending: Future[None] | None = None  # statistics of the last row group
        self._encoding: Future[None] | None = None  # the last row group, in the background
        with storage_step(files.root, rel):
            self._sink = self._open_sink(path)
            try:
                self._writer = pq.ParquetWriter(
                    self._sink, files.schema, use_dictionary=files.dictionary, **_WRITE_OPTIONS
                )
            except BaseException:
                self._sink.close()
                raise

    def _open_sink(self, path: str) -> Any:
        """A writable file: pyarrow's native file on local disks (no Python-level write
        calls per page), an fsspec file elsewhere."""
        if isinstance(self.files.fs, LocalFileSystem):
            return pa.OSFile(path, "wb")
        return self.files.fs.open(path, "wb")

    @property
    def size(self) -> int:
        """Bytes written so far (complete row groups; waits for one being encoded)."""
        self._wait_encoding()
        return int(self._sink.tell())

    def write(self, chunk: pa.Table) -> None:
        """Write ``chunk`` as one row group. With ``files.background``, Parquet encodes it on
        another thread while the caller goes on (the next call waits for it)."""
        self._wait_encoding()
        # Statistics of this row group are computed on another thread while Parquet encodes
        # it (both release the GIL); one update at a time keeps the accumulator
        # single-threaded.
        self._wait_stats()
        measured = chunk
        if self.files.stats_schema is not self.files.schema:
            measured = chunk.select(self.files.stats_schema.names)
        if chunk.num_rows >= _PARALLEL_STATS_ROWS:
            self._pending = _STATS_POOL.submit(self._stats.update, measured)
        else:  # a thread hand-off costs more than small statistics
            self._stats.update(measured)
        if self.files.background:
            self._encoding = _ENCODE_POOL.submit(
                self._writer.write_table, chunk, row_group_size=chunk.num_rows
            )
        else:
            with storage_step(self.files.root, self.rel):
                self._writer.write_table(chunk, row_group_size=chunk.num_rows)
        self.rows += chunk.num_rows

    def _wait_stats(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _wait_encoding(self) -> None:
        if self._encoding is not None:
            encoding, self._encoding = self._encoding, None
            with storage_step(self.files.root, self.rel):
                encoding.result()

    def close(self) -> AddFile:
        """Finish the file; its add action."""
        with storage_step(self.files.root, self.rel):
            try:
                self._wait_encoding()
                self._writer.close()
                size = int(self._sink.tell())
            finally:
                self._sink.close()
            sync_written(self.files.fs, self._path)  # durable mode: before any commit names it
        self._wait_stats()
        return AddFile(
            path=self.rel,
            partition_values=dict(self.values),
            size=size,
            modification_time=int(time.time() * 1000),
            data_change=self.files.data_change,
            stats=self._stats.to_json(),
        )

    def discard(self) -> None:
        """Close without finishing (the write failed; the file is deleted with the others)."""
        with contextlib.suppress(Exception):
            self._wait_encoding()
        with contextlib.suppress(Exception):
            self._wait_stats()
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(Exception):
            self._sink.close()


def _write_group(
    files: FileWriters,
    file_data: pa.Table,
    values: dict[str, str | None],
    pdir: str,
    indices: pa.ChunkedArray | None,
    group_rows: int,
    max_rows: int | None,
) -> list[AddFile]:
    """Write the rows ``indices`` of ``file_data`` (all when None) as files of one partition,
    each closed once it reaches the target size or ``max_rows``."""
    adds = []
    total = file_data.num_rows if indices is None else len(indices)
    pos = 0
    while pos < total:
        out = files.open(values, pdir)
        try:
            while pos < total:
                n = min(group_rows, total - pos)
                if max_rows is not None:
                    n = min(n, max_rows - out.rows)
                # Only one row group is materialised at a time: slices are zero-copy, and a
                # take copies just the rows of this row group.
                out.write(
                    file_data.slice(pos, n) if indices is None else file_data.take(indices.slice(pos, n))
                )
                pos += n
                if (max_rows is not None and out.rows >= max_rows) or out.size >= files.target:
                    break
        except BaseException:
            out.discard()
            raise
        adds.append(out.close())
    return adds


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


# --------------------------------------------------------------------------- cleanup


def delete_files(fs: fsspec.AbstractFileSystem, root: str, relative_paths: Iterable[str]) -> None:
    """Best-effort delete of data files given by their ``add.path`` (missing files are fine)."""
    for rel in relative_paths:
        path = data_file_path(fs, root, rel)
        try:
            with contextlib.suppress(FileNotFoundError):  # already gone: the goal
                fs.rm_file(path)
        except Exception as exc:  # cleanup must never mask the error that triggered it
            log.warning("could not delete staged data file %s: %s", path, exc)
