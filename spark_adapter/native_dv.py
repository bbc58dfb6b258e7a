"""Deletion vectors inside Spark: the rows of files with a DV that their DV keeps.

The driver decodes each file's deletion vector into bits (one per physical row, 64 to a
word, files laid end to end) and hands Spark one ``array<bigint>`` literal per scan; a
filter tests ``_metadata.row_index`` against it. A balanced tree of comparisons on
``_metadata.file_size`` finds a row's file, so the files of one scan must differ in size
(:func:`dv_scans` splits them), and a size no file of the scan has fails the query
instead of guessing.

The literal is built in the JVM as an ``UnsafeArrayData`` (the words in one primitive
buffer): a per-row lookup is a plain memory read. ``F.lit``-built arrays constant-fold to
a ``GenericArrayData`` of boxed longs, whose lookups cost 4x the whole rest of the filter
(``bench/bench_native_dv.py`` measures both); they remain the fallback where the session
has no JVM gateway (Spark Connect).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np
from pyspark import SparkContext
from pyspark.sql import Column
from pyspark.sql import functions as F

from eventlog.errors import InvalidInputError
from eventlog.files.deletion_vectors import read_deletion_vector
from eventlog.files.reader import physical_row_count
from eventlog.log.actions import AddFile

__all__ = ["MAX_DV_ROWS_PER_SCAN", "dv_filter", "dv_scans", "dv_words"]

log = logging.getLogger("spark_adapter.native_dv")

MAX_DV_ROWS_PER_SCAN = 1 << 26
"""Rows (of files with a deletion vector) one scan's bit array covers: 8 MB of plan."""

_ROW_INDEX = "_metadata.row_index"
_FILE_SIZE = "_metadata.file_size"
_ARRAY_TYPE_JSON = '{"type":"array","elementType":"long","containsNull":false}'


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


def dv_words(
    fs: fsspec.AbstractFileSystem, root: str, files: Sequence[AddFile]
) -> tuple[np.ndarray, dict[int, int]]:
    """The deleted-row bits of ``files`` (bit ``r % 64`` of word ``start + r // 64`` is set
    when row ``r`` is deleted) and each file's first word, by file size."""
    words: list[np.ndarray] = []
    starts: dict[int, int] = {}
    offset = 0
    for f in files:
        n = physical_row_count(fs, root, f)
        assert f.deletion_vector is not None
        deleted = np.frombuffer(
            read_deletion_vector(fs, root, f.deletion_vector).to_array(), dtype=np.uint64
        ).astype(np.int64)
        if deleted.size and int(deleted[-1]) >= n:
            raise InvalidInputError(f"{f.path}: deletion vector deletes row {int(deleted[-1])} of {n}")
        bits = np.zeros(((n + 63) // 64) * 64, dtype=np.bool_)
        bits[deleted] = True
        packed = np.packbits(bits, bitorder="little").view("<i8")
        starts[f.size] = offset
        offset += packed.size
        words.append(packed)
    return (np.concatenate(words) if words else np.zeros(0, dtype="<i8")), starts


def dv_filter(fs: fsspec.AbstractFileSystem, root: str, files: Sequence[AddFile]) -> Column:
    """True for the rows of ``files`` their deletion vectors keep.

    One bit per physical row of every file, 64 to a word, files laid end to end; a balanced
    tree of comparisons on ``_metadata.file_size`` finds a row's file's first word. A size
    no file of this scan has (the log's ``size`` differs from the file) fails the query
    instead of guessing.
    """
    words, starts = dv_words(fs, root, files)
    # Everything but the literal is one SQL text: one py4j call instead of ~100 (a CASE
    # tree built Column by Column costs 0.1-0.3 s of driver time for ten files).
    index = F.expr(f"cast({_size_tree(sorted(starts.items()))} + shiftright({_ROW_INDEX}, 6) as int)")
    shift = F.expr(f"cast({_ROW_INDEX} & 63 as int)")
    word = _words_literal(words)[index]
    return F.call_function("shiftright", word, shift).bitwiseAND(F.lit(1)) == F.lit(0)


def _words_literal(words: np.ndarray) -> Column:
    """An ``array<bigint>`` literal of ``words``: an ``UnsafeArrayData`` built in the JVM
    when there is a gateway, else (Spark Connect) a constant-folded ``F.lit`` array."""
    jvm = _gateway_jvm()
    if jvm is not None:
        try:
            return _unsafe_literal(jvm, words)
        except Exception as exc:  # py4j errors: a Spark build without these internals
            log.warning("deletion vector filter: no UnsafeArrayData literal (%s); using a slower array", exc)
    return F.split(F.lit(",".join(map(str, words.tolist()))), ",").cast("array<bigint>")


def _gateway_jvm() -> Any:
    """The py4j view of the driver JVM, or None (Spark Connect, no session)."""
    return SparkContext._jvm


def _unsafe_literal(jvm: Any, words: np.ndarray) -> Column:
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    little = jvm.java.nio.ByteOrder.nativeOrder().equals(jvm.java.nio.ByteOrder.LITTLE_ENDIAN)
    data = bytearray(words.astype("<i8" if little else ">i8").tobytes())
    offset = jvm.org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET
    array = expressions.UnsafeArrayData.fromPrimitiveArray(data, offset, int(words.size), 8)
    literal = expressions.Literal(array, jvm.org.apache.spark.sql.types.DataType.fromJson(_ARRAY_TYPE_JSON))
    return Column(jvm.org.apache.spark.sql.classic.ExpressionUtils.column(literal))


def _size_tree(items: Sequence[tuple[int, int]]) -> str:
    """SQL ``CASE`` tree mapping a file size to its first word (log2(n) comparisons per row)."""
    if len(items) == 1:
        ((key, value),) = items
        message = "'file of %d bytes has no deletion vector in this scan'"
        error = f"raise_error(format_string({message}, {_FILE_SIZE}))"
        return f"CASE WHEN {_FILE_SIZE} = {key} THEN {value} ELSE {error} END"
    mid = len(items) // 2
    low, high = _size_tree(items[:mid]), _size_tree(items[mid:])
    return f"CASE WHEN {_FILE_SIZE} < {items[mid][0]} THEN {low} ELSE {high} END"
