"""Streaming reads of a snapshot: :func:`scan_snapshot` is a ``pyarrow.RecordBatchReader``
over the live rows, read one data file at a time and, within a file, one batch at a time.

It plans as :func:`eventlog.snapshot.read.read_snapshot_rows` does (the columns checked,
the SQL filter parsed, files pruned by partition values and skipped by statistics), then
reads nothing until the reader is iterated. Each file is read by
:meth:`eventlog.files.scan.FileScan.live_batches`: only the row groups whose statistics
admit the filter, decoded ``batch_size`` rows at a time, each batch with its deletion
vector rows dropped (by physical position), the filter applied, partition columns filled
in, and column mapping's physical names turned back into the table's. Memory grows with
the batch size and the row-group size, not with the file or the table (a file on a
non-local filesystem is fetched whole first, as every read of it is). A background thread
reads and decodes up to :data:`READ_AHEAD` batches ahead of the consumer (:func:`read_ahead`).

"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import fsspec
import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import DataFileNotFoundError, InvalidInputError
from eventlog.files import column_mapping as cm
from eventlog.files.reader import data_file_path
from eventlog.files.scan import FileScan
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files
from eventlog.snapshot.projection import Snapshot
from eventlog.snapshot.read import checked_columns

__all__ = ["DEFAULT_BATCH_ROWS", "read_ahead", "scan_snapshot"]

DEFAULT_BATCH_ROWS = 131_072
"""Rows per batch when the caller gives no ``batch_size`` (pyarrow's dataset default)."""

READ_AHEAD = 2
"""Batches a scan's background thread reads and decodes ahead of its consumer."""


def scan_snapshot(
    fs: fsspec.AbstractFileSystem,
    root: str,
    snapshot: Snapshot,
    *,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
    batch_size: int | None = None,
) -> pa.RecordBatchReader:
    """The live rows of ``snapshot`` where ``filter`` holds, with ``columns`` (default all,
    in schema order), as a reader that reads one data file at a time (module docstring)."""
    schema, parts = snapshot.schema, snapshot.partition_columns
    columns = checked_columns(schema, columns)
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    pred = ex.parse_predicate(filter, schema, context="filter") if filter is not None else None
    files: Sequence[AddFile]
    if pred is None:
        files = snapshot.add_files
    else:
        files = add_files(snapshot.select_files(pred)[1])
    files = sorted(files, key=lambda a: a.path)
    wanted = set(columns) if columns is not None else None
    names = [n for n in schema.names if wanted is None or n in wanted]  # schema order, as to_arrow
    out = cm.strip(pa.schema([schema.field(n) for n in names]))

    size = batch_size or DEFAULT_BATCH_ROWS

    def batches() -> Iterator[pa.RecordBatch]:
        for add in files:
            try:
                file = FileScan(fs, root, add, schema, parts)
                for rows in file.live_batches(columns, pred, sql=filter, batch_size=size):
                    # Logical names already; the output schema drops column mapping's metadata.
                    same = rows.schema.equals(out, check_metadata=True)
                    yield from (rows if same else rows.cast(out)).to_batches()
            except FileNotFoundError as exc:
                if isinstance(exc, DataFileNotFoundError):
                    raise
                raise DataFileNotFoundError(
                    root, data_file_path(fs, root, add.path), snapshot.version
                ) from exc

    return pa.RecordBatchReader.from_batches(out, read_ahead(batches(), READ_AHEAD))


T = TypeVar("T")
_ITEM, _END, _ERROR = 0, 1, 2  # what read_ahead's queue holds: an item, the end, an error


def read_ahead(source: Iterator[T], depth: int) -> Iterator[T]:
    """The items of ``source``, produced by a background thread up to ``depth`` ahead of the
    consumer: the next batch is read and decoded (pyarrow releases the GIL) while the caller
    works on the last one. Errors of ``source`` are raised here, in order; the thread stops
    when this generator is closed or garbage-collected."""
    q: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[int, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in source:
                if not put((_ITEM, item)):
                    return
            put((_END, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((_ERROR, exc))

    thread = threading.Thread(target=work, name="eventlog-scan-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == _END:
                return
            if kind == _ERROR:
                raise item
            yield item
    finally:
        stop.set()
