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

Native scans only (``s3://`` tables through S3A included: the driver reads their deletion
vectors through fsspec with the table's options); where a read falls back to the Python data
source, its tasks apply deletion vectors (:mod:`spark_adapter.native`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import numpy as np
from pyspark import SparkContext
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.utils import is_remote

from eventlog.errors import InvalidInputError
from eventlog.files.deletion_vectors import read_deletion_vector
from eventlog.files.reader import physical_row_count
from eventlog.log.actions import AddFile

__all__ = ["MAX_DV_ROWS_PER_SCAN", "distinct_sizes", "dv_filter", "dv_scans", "size_lookup", "dv_words"]

log = logging.getLogger("spark_adapter.native_dv")

MAX_DV_ROWS_PER_SCAN = 1 << 26
"""Rows (of files with a deletion vector) one scan's bit array covers: 8 MB of plan."""

_ROW_INDEX = "_metadata.row_index"
_FILE_SIZE = "_metadata.file_size"
_ARRAY_TYPE_JSON = '{"type":"array","elementType":"long","containsNull":false}'


def dv_scans(fs: fsspec.AbstractFileSystem, root: str, files: Sequence[AddFile]) -> list[list[AddFile]]:
    """Files with a DV, split into scans whose files have distinct sizes (the filter tells
    files apart by ``_metadata.file_size``) and whose bit array stays bounded."""
    with_dv = [f for f in files if f.deletion_vector is not None]
    return distinct_sizes(with_dv, lambda f: physical_row_count(fs, root, f), MAX_DV_ROWS_PER_SCAN)


def distinct_sizes(
    files: Sequence[AddFile], weight: Callable[[AddFile], int] | None = None, limit: int | None = None
) -> list[list[AddFile]]:
    """``files`` in as few groups as first-fit finds whose files all differ in size (and
    whose ``weight`` adds up to at most ``limit``): :func:`size_lookup` needs that."""
    groups: list[list[AddFile]] = []
    sizes: list[set[int]] = []
    totals: list[int] = []
    for f in files:
        w = weight(f) if weight is not None else 0
        room = [limit is None or total + w <= limit for total in totals]
        i = next((i for i, seen in enumerate(sizes) if f.size not in seen and room[i]), len(groups))
        if i == len(groups):
            groups.append([])
            sizes.append(set())
            totals.append(0)
        groups[i].append(f)
        sizes[i].add(f.size)
        totals[i] += w
    return groups


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
    start = size_lookup(sorted(starts.items()), "a file with a deletion vector in this scan")
    index = F.expr(f"cast({start} + shiftright({_ROW_INDEX}, 6) as int)")
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
    """The py4j view of the driver JVM, or None (Spark Connect, no session). In a Spark
    Connect client process (``is_remote()``: ``pyspark.sql.functions`` builds Connect
    columns) a classic JVM of the same process must not be used for the literal."""
    if is_remote():
        return None
    return SparkContext._jvm


def _unsafe_literal(jvm: Any, words: np.ndarray) -> Column:
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    little = jvm.java.nio.ByteOrder.nativeOrder().equals(jvm.java.nio.ByteOrder.LITTLE_ENDIAN)
    data = bytearray(words.astype("<i8" if little else ">i8").tobytes())
    offset = jvm.org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET
    array = expressions.UnsafeArrayData.fromPrimitiveArray(data, offset, int(words.size), 8)
    literal = expressions.Literal(array, jvm.org.apache.spark.sql.types.DataType.fromJson(_ARRAY_TYPE_JSON))
    return Column(jvm.org.apache.spark.sql.classic.ExpressionUtils.column(literal))


def size_lookup(items: Sequence[tuple[int, int]], what: str) -> str:
    """SQL ``CASE`` tree mapping ``_metadata.file_size`` to a value (log2(n) comparisons per
    row). A size not in ``items`` (the log's ``size`` differs from the file) fails the query,
    saying the file is not ``what``, instead of guessing."""
    if len(items) == 1:
        ((key, value),) = items
        message = "'file of %d bytes is not " + what.replace("'", "") + "'"
        error = f"raise_error(format_string({message}, {_FILE_SIZE}))"
        return f"CASE WHEN {_FILE_SIZE} = {key} THEN {value} ELSE {error} END"
    mid = len(items) // 2
    low, high = size_lookup(items[:mid], what), size_lookup(items[mid:], what)
    return f"CASE WHEN {_FILE_SIZE} < {items[mid][0]} THEN {low} ELSE {high} END"
