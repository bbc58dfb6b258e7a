"""File pruning: which live files may hold rows matching a predicate.

First by partition values (exact: the partition-only conjuncts evaluated on each file's
typed partition values, NULL counting as no match), then by min/max/null-count statistics
(conservative: a file is dropped only when its statistics prove no row can match).

Files come as an Arrow table of add rows (:data:`eventlog.log.filetable.ADD_SCHEMA`):
:func:`partition_table` types their partition values and :func:`file_stats` parses their
statistics column-wise, so pruning 300,000 files builds no Python value per file.
:class:`FileIndex` keeps both for one snapshot, parsed once. :func:`prune_files` keeps the
older interface over :class:`~eventlog.log.actions.AddFile` values.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.files import column_mapping as cm
from eventlog.files.generated import derived_partition_filters
from eventlog.files.partition_values import _cast_strings, decode_partition_value
from eventlog.files.stats import stats_table
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files, adds_table

__all__ = [
    "FileIndex",
    "data_schema",
    "file_stats",
    "partition_strings",
    "partition_table",
    "prune_files",
    "prune_table",
    "typed_partition_values",
]


def data_schema(schema: pa.Schema, partition_columns: Sequence[str]) -> pa.Schema:
    """The columns stored inside data files (all but the partition columns)."""
    parts = set(partition_columns)
    return pa.schema([f for f in schema if f.name not in parts])


def partition_table(files: pa.Table, partition_schema: pa.Schema) -> pa.Table:
    """Typed partition values of ``files`` (add rows), one row each (missing key or "" = null)."""
    keys = [cm.physical_name(f) for f in partition_schema]  # column mapping: physical names
    return typed_partition_values(partition_strings(files.column("partitionValues"), keys),
                                  cm.strip(partition_schema))  # fmt: skip


def typed_partition_values(raw: Sequence[pa.Array], partition_schema: pa.Schema) -> pa.Table:
    """Partition values given as strings (one array per partition column, as in
    ``partitionValues``) typed as the schema says; "" and null are null."""
    columns = []
    for values, f in zip(raw, partition_schema, strict=True):
        values = pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)
        columns.append(_cast_strings(values, f.type, functools.partial(_decode_as, f.type)))
    return pa.Table.from_arrays(columns, schema=pa.schema([f.with_nullable(True) for f in partition_schema]))


def partition_strings(values: pa.ChunkedArray | pa.MapArray, names: Sequence[str]) -> list[pa.Array]:
    """The string value of each partition column in each row of a ``partitionValues`` map
    column (null where the key is missing).

    Writers give every file the same keys in the same order, so the common case is read
    straight from the map's flat items (a slice, or a strided take); other layouts go
    through Arrow's per-row key lookup.
    """
    if isinstance(values, pa.ChunkedArray):
        chunks = [partition_strings(chunk, names) for chunk in values.chunks]
        if not chunks:
            return [pa.array([], pa.string()) for _ in names]
        return [pa.concat_arrays([c[i] for c in chunks]) for i in range(len(names))]
    maps = values
    n, k = len(maps), len(names)
    if n and k and maps.null_count == 0:
        offsets = maps.offsets.to_numpy()
        start = int(offsets[0])
        if int(offsets[-1]) - start == n * k and bool((np.diff(offsets) == k).all()):
            keys, items = maps.keys, maps.items  # the whole child arrays, from offset 0
            out = []
            for j, name in enumerate(names):
                index = None if k == 1 else pa.array(np.arange(start + j, start + n * k, k))
                key = keys.slice(start, n) if index is None else keys.take(index)
                if not pc.all(pc.equal(key, name)).as_py():
                    break
                out.append(items.slice(start, n) if index is None else items.take(index))
            else:
                return out
    # "last": a map holds each key once, and Arrow's "first" lookup is many times slower.
    return [pc.map_lookup(maps, pa.scalar(name), "last") for name in names]


def _decode_as(t: pa.DataType, value: str) -> object:
    return decode_partition_value(value, t)


def file_stats(files: pa.Table, schema: pa.Schema) -> pa.Table:
    """The statistics of ``files`` (add rows) parsed into typed columns
    (:func:`eventlog.files.stats.stats_table`'s layout), one row each."""
    return stats_table(files.column("stats"), schema, files.num_rows)


class FileIndex:
    """The live files of one snapshot, with their typed partition values and statistics
    parsed on first use and kept (a snapshot is immutable, so they never go stale).

    Statistics are parsed per column, for the columns a predicate reads: the first
    data-filtered plan of a 300,000-file table parses one column's min/max/null counts,
    not all of them.
    """

    def __init__(self, files: pa.Table, schema: pa.Schema, partition_columns: Sequence[str]) -> None:
        self.files = files
        self.schema = schema
        self.partition_columns = tuple(partition_columns)
        self.partition_schema = pa.schema([schema.field(c) for c in self.partition_columns])
        self.data_schema = data_schema(schema, self.partition_columns)
        self._stats: dict[str, list[tuple[str, pa.Array]]] = {}  # data column: its stats columns
        self._num_records: pa.Array | None = None

    @functools.cached_property
    def partitions(self) -> pa.Table:
        return partition_table(self.files, self.partition_schema)

    def stats(self, columns: Sequence[str]) -> pa.Table:
        """:func:`file_stats` of every file, for the data ``columns`` only."""
        missing = [c for c in columns if c not in self._stats]
        if missing or self._num_records is None:
            parsed = file_stats(self.files, pa.schema([self.data_schema.field(c) for c in missing]))
            self._num_records = parsed.column("numRecords").combine_chunks()
            for c in missing:
                self._stats[c] = [
                    (name, parsed.column(name).combine_chunks())
                    for name in parsed.column_names
                    if name.partition(".")[2] == c or name.partition(".")[2].startswith(f"{c}.")
                ]
        pairs = [("numRecords", self._num_records), *(p for c in columns for p in self._stats[c])]
        return pa.Table.from_arrays([a for _, a in pairs], names=[n for n, _ in pairs])

    def data_columns(self, predicate: ex.Expr) -> list[str]:
        """The top-level data columns ``predicate`` reads (whose statistics can skip files)."""
        names = set(self.data_schema.names)
        out: set[str] = set()
        for col in ex.referenced_columns(predicate):
            top = col.name if col.name in names else col.name.partition(".")[0]
            if top in names:
                out.add(top)
        return sorted(out)

    def prune(self, predicate: ex.Expr) -> tuple[ex.Expr | None, pa.Table]:
        """(the predicate's partition-only part or None, the add rows that may match)."""
        # a predicate on a generated partition column's source prunes by that column too
        derived = derived_partition_filters(predicate, self.schema, self.partition_columns)
        part_pred = ex.partition_predicate(ex.conjoin([predicate, *derived]), self.partition_columns)
        files = self.files
        mask = None
        if part_pred is not None:
            mask = ex.evaluate_mask(part_pred, self.partitions)
            files = files.filter(mask)
        columns = self.data_columns(predicate)
        if not columns or files.num_rows == 0:
            return part_pred, files
        if mask is not None and any(c not in self._stats for c in columns):
            # Few files left: parse only theirs (the whole column is for data-only filters).
            stats = file_stats(files, pa.schema([self.data_schema.field(c) for c in columns]))
        else:
            stats = self.stats(columns)
            stats = stats if mask is None else stats.filter(mask)
        return part_pred, files.filter(ex.may_match_mask(predicate, stats))


def prune_table(
    files: pa.Table, predicate: ex.Expr, schema: pa.Schema, partition_columns: Sequence[str]
) -> tuple[ex.Expr | None, pa.Table]:
    """(the predicate's partition-only part or None, the add rows of ``files`` that may match)."""
    return FileIndex(files, schema, partition_columns).prune(predicate)


def prune_files(
    files: Sequence[AddFile],
    predicate: ex.Expr,
    schema: pa.Schema,
    partition_columns: Sequence[str],
) -> tuple[ex.Expr | None, list[AddFile]]:
    """:func:`prune_table` over values: (partition-only part or None, the files that may match)."""
    if not files:
        return ex.partition_predicate(predicate, partition_columns), []
    part_pred, kept = prune_table(adds_table(files), predicate, schema, partition_columns)
    return part_pred, add_files(kept)
