"""Writing data files from a stream of row chunks: :class:`DataFileStream` takes rows a
chunk at a time (:meth:`~DataFileStream.write`) and writes them as the same files
:func:`~eventlog.files.datafiles.write_data_files` writes for a whole table, without ever
holding the stream.

Each partition met so far has one open file and a buffer of rows not yet written. A
partition's buffered rows become a row group once they reach the row-group size (about
64 MB, judged on the first chunk, as for a whole table), and its file is closed, and a new
one started, once it reaches the target file size. When the buffers of all partitions
together pass :data:`BUFFER_BYTES`, the largest is written out early as a smaller row
group. Row groups are Parquet-encoded on another thread while the next rows come (a
file's row groups in order, one at a time). So memory holds at most :data:`BUFFER_BYTES`
of buffered rows, a row group per open file being encoded, and the chunk being split,
whatever the stream's length.

A failure anywhere (the stream's source, a bad chunk, storage) is handled by the caller
with :meth:`~DataFileStream.abort`, which deletes every file the stream started.
"""

from __future__ import annotations

from collections.abc import Sequence

import fsspec
import pyarrow as pa

from eventlog.errors import InvalidInputError
from eventlog.files.datafiles import (
    DEFAULT_TARGET_FILE_SIZE,
    DataFileWriter,
    FileWriters,
    check_layout,
    dictionary_columns,
    partition_dir,
    partition_groups,
    physical_layout,
    rows_per_group,
)
from eventlog.log.actions import AddFile

__all__ = ["BUFFER_BYTES", "DataFileStream"]

BUFFER_BYTES = 192 * 1024 * 1024
"""Rows buffered across all partitions before the largest buffer is written out early."""


class _Partition:
    """One partition's open file and the rows buffered for its next row group."""

    def __init__(self, values: dict[str, str | None], pdir: str) -> None:
        self.values = values
        self.pdir = pdir
        self.file: DataFileWriter | None = None
        self.buffered: list[pa.Table] = []
        self.rows = 0
        self.bytes = 0

    def take(self, rows: int) -> pa.Table:
        """The first ``rows`` buffered rows (removed from the buffer)."""
        data = pa.concat_tables(self.buffered)
        head, rest = data.slice(0, rows), data.slice(rows)
        self.buffered = [rest] if rest.num_rows else []
        self.rows = rest.num_rows
        self.bytes = int(rest.nbytes) if rest.num_rows else 0
        return head  # chunked as the batches came: written as one row group, uncopied


class DataFileStream:
    """The data files of a stream of conformed row chunks (module docstring).

    ``partition_columns``, ``data_change``, ``target_file_size`` and ``hidden`` are as
    for :func:`~eventlog.files.datafiles.write_data_files`. Every chunk must have the same
    schema (the first one's)."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        *,
        partition_columns: Sequence[str],
        data_change: bool = True,
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        hidden: Sequence[str] = (),
        buffer_bytes: int | None = None,
    ) -> None:
        self._fs = fs
        self._root = root
        self._partition_columns = list(partition_columns)
        self._data_change = data_change
        self._target = target_file_size
        self._hidden = tuple(hidden)
        self._budget = BUFFER_BYTES if buffer_bytes is None else buffer_bytes
        self._files: FileWriters | None = None  # made with the first chunk's schema
        self._schema: pa.Schema | None = None
        self._group_rows = 0
        self._pcols: list[str] = []
        self._open: dict[str, _Partition] = {}
        self._buffered = 0
        self.adds: list[AddFile] = []
        self.num_rows = 0

    def write(self, data: pa.Table) -> None:
        """Take the next chunk of rows (partition columns included)."""
        if self._schema is None:
            check_layout(data.schema, self._partition_columns, self._target, None)
            self._schema = data.schema
        elif not data.schema.equals(self._schema):
            raise InvalidInputError(
                f"every chunk of a stream must have its first chunk's schema; got {data.schema}"
            )
        if not data.num_rows:
            return
        data, pcols, random_dirs = physical_layout(data, self._partition_columns)
        file_data = (data.drop_columns(pcols) if pcols else data).replace_schema_metadata(None)
        if self._files is None:
            self._pcols = pcols
            self._group_rows = rows_per_group(file_data, self._target)
            self._files = FileWriters(
                self._fs, self._root, file_data.schema, data_change=self._data_change,
                target_file_size=self._target, random_dirs=random_dirs, hidden=self._hidden,
            )  # fmt: skip
            self._files.dictionary = dictionary_columns(file_data)
            self._files.background = True
        if not pcols:
            self._buffer(self._partition({}), file_data)
        else:
            for values, indices in partition_groups(data, pcols):
                whole = len(indices) == data.num_rows
                self._buffer(self._partition(values), file_data if whole else file_data.take(indices))
        self.num_rows += data.num_rows
        while self._buffered > self._budget:
            self._flush(max(self._open.values(), key=lambda p: p.bytes))

    def _partition(self, values: dict[str, str | None]) -> _Partition:
        pdir = partition_dir(self._pcols, values)
        part = self._open.get(pdir)
        if part is None:
            part = self._open[pdir] = _Partition(values, pdir)
        return part

    def _buffer(self, part: _Partition, rows: pa.Table) -> None:
        part.buffered.append(rows)
        part.rows += rows.num_rows
        size = int(rows.nbytes)
        part.bytes += size
        self._buffered += size
        while part.rows >= self._group_rows:
            self._write_group(part, self._group_rows)

    def _flush(self, part: _Partition) -> None:
        """Write all of ``part``'s buffered rows as a row group."""
        if part.rows:
            self._write_group(part, part.rows)

    def _write_group(self, part: _Partition, rows: int) -> None:
        assert self._files is not None
        before = part.bytes
        group = part.take(rows)
        self._buffered -= before - part.bytes
        if part.file is not None and part.file.size >= self._target:  # full: the next file
            file, part.file = part.file, None
            self.adds.append(file.close())
        if part.file is None:
            part.file = self._files.open(part.values, part.pdir)
        part.file.write(group)  # encoded in the background while the next rows come

    def close(self) -> list[AddFile]:
        """Write what is buffered, close every file; the add actions of all files."""
        for part in self._open.values():
            self._flush(part)
            if part.file is not None:
                file, part.file = part.file, None
                self.adds.append(file.close())
        self._open.clear()
        return self.adds

    def abort(self) -> None:
        """Give up: close and delete every file this stream started."""
        for part in self._open.values():
            if part.file is not None:
                part.file.discard()
                part.file = None
        self._open.clear()
        if self._files is not None:
            self._files.delete_started()
