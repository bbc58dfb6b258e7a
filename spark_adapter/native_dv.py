"""Deletion vectors inside Spark: the rows of files with a DV that their DV keeps.

The driver decodes each file's deletion vector into bits (one per physical row, 64 to a
word, files laid end to end) and hands Spark one ``array<bigint>`` literal per scan; a
filter tests ``_metadata.row_index`` against it. A balanced tree of comparisons on
``_metadata.file_size`` finds a row's file, so the files of one scan must differ in size
(:func:`dv_scans` splits them), and a size no file of the scan has fails the query
instead of guessing. Measured alternatives are in ``bench/RESULTS-spark.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

import fsspec
import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

from eventlog.errors import InvalidInputError
from eventlog.files.deletion_vectors import read_deletion_vector
from eventlog.files.reader import physical_row_count
from eventlog.log.actions import AddFile

__all__ = ["MAX_DV_ROWS_PER_SCAN", "dv_filter", "dv_scans"]

MAX_DV_ROWS_PER_SCAN = 1 << 26
"""Rows (of files with a deletion vector) one scan's bit array covers: 8 MB of plan."""

_ROW_INDEX = "_metadata.row_index"
_FILE_SIZE = "_metadata.file_size"


def dv_scans(fs: fsspec.AbstractFileSystem, root: str, files: Sequence[AddFile]) -> list[list[AddFile]]:
    """Files with a DV, split into scans whose files have distinct sizes (the filter tells
    files apart by ``_metadata.file_size``) and whose bit array stays bounded."""
    chunks: list[list[AddFile]] = []
    sizes: list[set[int]] = []
    rows: list[int] = []
    for f in files:
        if f.deletion_vector is None:
            continue
        n = physical_row_count(fs, root, f)
        for i, chunk in enumerate(chunks):
            if f.size not in sizes[i] and rows[i] + n <= MAX_DV_ROWS_PER_SCAN:
                chunk.append(f)
                sizes[i].add(f.size)
                rows[i] += n
                break
        else:
            chunks.append([f])
            sizes.append({f.size})
            rows.append(n)
    return chunks


def dv_filter(fs: fsspec.AbstractFileSystem, root: str, files: Sequence[AddFile]) -> Column:
    """True for the rows of ``files`` their deletion vectors keep.

    One bit per physical row of every file, 64 to a word, files laid end to end; a balanced
    tree of comparisons on ``_metadata.file_size`` finds a row's file's first word. A size
    no file of this scan has (the log's ``size`` differs from the file) fails the query
    instead of guessing.
    """
    words: list[np.ndarray] = []
    starts: dict[int, int] = {}
    offset = 0
    for f in files:
        n = physical_row_count(fs, root, f)
        bits = np.zeros(((n + 63) // 64) * 64, dtype=np.bool_)
        assert f.deletion_vector is not None
        deleted = np.frombuffer(
            read_deletion_vector(fs, root, f.deletion_vector).to_array(), dtype=np.uint64
        ).astype(np.int64)
        if deleted.size and int(deleted[-1]) >= n:
            raise InvalidInputError(f"{f.path}: deletion vector deletes row {int(deleted[-1])} of {n}")
        bits[deleted] = True
        packed = np.packbits(bits, bitorder="little").view("<i8")
        starts[f.size] = offset
        offset += packed.size
        words.append(packed)
    array = F.split(F.lit(",".join(map(str, np.concatenate(words).tolist()))), ",").cast("array<bigint>")
    start = _size_tree(sorted(starts.items()))
    index = (start + F.expr(f"{_ROW_INDEX} div 64") + 1).cast("int")
    shift = F.expr(f"cast({_ROW_INDEX} % 64 as int)")
    return F.bit_get(F.element_at(array, index), shift) == F.lit(0)


def _size_tree(items: Sequence[tuple[int, int]]) -> Column:
    """``CASE`` tree mapping a file size to its first word (log2(n) comparisons per row)."""
    size = F.col(_FILE_SIZE)
    if len(items) == 1:
        ((key, value),) = items
        return F.when(size == F.lit(key), F.lit(value)).otherwise(
            F.raise_error(F.format_string("file of %d bytes has no deletion vector in this scan", size))
        )
    mid = len(items) // 2
    return F.when(size < F.lit(items[mid][0]), _size_tree(items[:mid])).otherwise(_size_tree(items[mid:]))
