"""Reading live rows: data files with their deletion vectors applied.

Files without a deletion vector are read in one pass (filters pushed into Parquet). A
file with a DV is read with all its rows, because a DV addresses *physical* row positions;
its deleted rows are dropped before any filter runs. :func:`read_file_positions` also
returns each live row's physical position, which DML needs to write deletion vectors.

DML finds the rows it changes with a :class:`FileScan`: it reads only the columns its
predicate needs, of only the row groups whose Parquet statistics do not exclude the
predicate (:func:`eventlog.expr.skipping.may_match`, the rule that skips whole files), and
reads full rows afterwards only where they are needed (:meth:`FileScan.rows_at`,
:meth:`FileScan.live_rows_marked`). Positions are always physical: indexes into the whole
file, counting deleted rows, as deletion vectors need.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from pyroaring import FrozenBitMap64

from eventlog import expr as ex
from eventlog.errors import CorruptLogError, PredicateError
from eventlog.expr.evaluate import ARROW_ERRORS
from eventlog.files import column_mapping as cm
from eventlog.files import row_tracking
from eventlog.files.deletion_vectors import deleted_mask, read_deletion_vector
from eventlog.files.reader import DataFileReader, data_file_path, read_data_files
from eventlog.files.schema import decode_partition_value
from eventlog.log.actions import AddFile

MAX_ARROW_FILTER_NODES = 4096
"""Predicates with more nodes are evaluated after reading (:func:`read_matching_rows`)
instead of by pyarrow's dataset scanner: pyarrow 26 crashes the process while simplifying
filters of about 30,000 nodes (an OR of 10,000 comparisons)."""


def file_deletes(fs: fsspec.AbstractFileSystem, root: str, add: AddFile) -> FrozenBitMap64:
    """Rows of ``add`` its deletion vector marks deleted (empty when it has none)."""
    if add.deletion_vector is None:
        return FrozenBitMap64()
    return FrozenBitMap64(read_deletion_vector(fs, root, add.deletion_vector))


def read_live_rows(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[AddFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    *,
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,
) -> pa.Table:
    """The live rows of ``files`` (deletion vectors applied), filtered and projected."""
    plain = [f for f in files if f.deletion_vector is None]
    with_dv = [f for f in files if f.deletion_vector is not None]
    parts = []
    if plain or not with_dv:
        parts.append(
            read_data_files(fs, root, plain, schema, partition_columns, columns=columns, filter=filter)
        )
    for add in with_dv:
        # Every row (a DV addresses physical positions); all columns only if a filter needs them.
        read_columns = columns if filter is None else None
        rows = read_data_files(fs, root, [add], schema, partition_columns, columns=read_columns)
        rows = rows.filter(deleted_mask(file_deletes(fs, root, add), rows.num_rows, uri=add.path))
        if filter is not None:
            rows = rows.filter(filter)
        if columns is not None:
            rows = rows.select([n for n in schema.names if n in set(columns)])
        parts.append(rows)
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def read_matching_rows(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[AddFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    predicate: ex.Expr,
    sql: str,
    *,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Live rows of ``files`` where ``predicate`` (parsed from ``sql``) holds.

    The filter is pushed into the Parquet scan when it is small enough
    (:data:`MAX_ARROW_FILTER_NODES`); a row the filter cannot be evaluated on (a failed
    cast) is a PredicateError naming ``sql``, never a pyarrow error.
    """
    # A column-mapped table's files hold physical names, which an Arrow filter over logical
    # names cannot address: its rows are filtered after the read.
    if ex.tree_size(predicate) <= MAX_ARROW_FILTER_NODES and not cm.is_mapped(schema):
        arrow_filter = ex.to_arrow(predicate, schema=schema)
        try:
            return read_live_rows(
                fs, root, files, schema, partition_columns, columns=columns, filter=arrow_filter
            )
        except ARROW_ERRORS as exc:
            raise PredicateError(
                f"cannot evaluate filter {sql[:200]!r}: {str(exc).splitlines()[0]}", expression=sql
            ) from exc
    needed = None
    if columns is not None:
        used = [c.name for c in ex.referenced_columns(predicate)]
        needed = list(dict.fromkeys([*columns, *used]))
    rows = read_live_rows(fs, root, files, schema, partition_columns, columns=needed)
    matching = rows.filter(ex.evaluate_mask(predicate, rows))
    if columns is None:
        return matching
    wanted = set(columns)
    return matching.select([n for n in schema.names if n in wanted])  # schema order, as every read


def read_file_positions(
    fs: fsspec.AbstractFileSystem,
    root: str,
    add: AddFile,
    schema: pa.Schema,
    partition_columns: Sequence[str],
) -> tuple[pa.Table, np.ndarray, FrozenBitMap64, int]:
    """(live rows, their physical positions, the file's current DV rows, physical row count)."""
    rows = read_data_files(fs, root, [add], schema, partition_columns)
    physical = rows.num_rows
    deleted = file_deletes(fs, root, add)
    if not deleted:
        return rows, np.arange(physical, dtype=np.int64), deleted, physical
    keep = deleted_mask(deleted, physical, uri=add.path)
    positions = np.flatnonzero(keep.to_numpy(zero_copy_only=False))
    return rows.filter(keep), positions.astype(np.int64), deleted, physical


def top_level_columns(expr: ex.Expr, schema: pa.Schema, qualifier: str | None = None) -> list[str]:
    """The top-level columns of ``schema`` that ``expr`` reads (only those resolved in
    ``qualifier``, when given: the MERGE alias), in schema order."""
    names = set()
    for col in ex.referenced_columns(expr):
        if qualifier is not None and col.qualifier != qualifier:
            continue
        # A struct field "s.x" is read through its top-level column "s", as evaluation does.
        names.add(col.name if col.name in schema.names else col.name.split(".")[0])
    return [n for n in schema.names if n in names]


def _bool_array(values: np.ndarray) -> pa.BooleanArray:
    """A numpy bool array as an Arrow one, without converting element by element."""
    bits = np.packbits(values, bitorder="little")
    return pa.BooleanArray.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits.tobytes())])


class FileScan:
    """One live data file opened for DML: its footer and deletion vector read once, then
    rows read by column and row group as needed. Positions are physical row indexes."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        add: AddFile,
        schema: pa.Schema,
        partition_columns: Sequence[str],
    ) -> None:
        self.add = add
        self.schema = schema
        self.reader = DataFileReader(fs, root, add, schema, partition_columns)
        #: The file on the local filesystem (streamed by :meth:`live_batches`), else None.
        self.local_path = data_file_path(fs, root, add.path) if isinstance(fs, LocalFileSystem) else None
        self._file: pq.ParquetFile | None = None  # of local_path, opened on demand
        self.num_rows = self.reader.num_rows
        #: Rows the file's current deletion vector deletes (empty without one).
        self.deleted = file_deletes(fs, root, add)
        if self.deleted and self.deleted.max() >= self.num_rows:
            raise CorruptLogError(
                f"deletion vector deletes row {self.deleted.max()} of a {self.num_rows}-row file",
                uri=add.path,
                version=None,
            )
        self._kept: np.ndarray | None = None  # per physical row: not deleted (built on demand)

    @property
    def _partition_columns(self) -> list[str]:
        """The table's partition columns (logical names), as the reader was given them."""
        physical = dict(zip(self.reader.schema.names, self.schema.names, strict=True))
        return [physical[c] for c in self.reader.partition_columns]

    def _groups(self, skip_by: ex.Expr | None) -> list[int]:
        """Row groups that may hold a live row satisfying ``skip_by`` (every group if None)."""
        starts = self.reader.row_group_starts
        groups = [
            g
            for g in range(self.reader.num_row_groups)
            if starts[g + 1] > starts[g]
            and self.deleted.range_cardinality(starts[g], starts[g + 1]) < starts[g + 1] - starts[g]
        ]
        if skip_by is None or len(groups) <= 1:
            return groups
        stats = self.reader.row_group_stats(c.name for c in ex.referenced_columns(skip_by))
        keep = ex.may_match(skip_by, stats)
        return [g for g in groups if keep[g]]

    def _kept_rows(self) -> np.ndarray:
        """Per physical row: whether the deletion vector keeps it (built once)."""
        if self._kept is None:
            self._kept = np.ones(self.num_rows, dtype=np.bool_)
            self._kept[np.frombuffer(self.deleted.to_array(), dtype=np.uint64)] = False
        return self._kept

    def _read(
        self, columns: Sequence[str] | None, groups: Sequence[int]
    ) -> tuple[pa.Table, np.ndarray | None]:
        """(the live rows of ``groups``; which rows of the read they are, None when all)."""
        rows = self.reader.read(columns, groups)
        if not self.deleted or not groups:
            return rows, None
        kept, starts = self._kept_rows(), self.reader.row_group_starts
        keep = np.concatenate([kept[starts[g] : starts[g + 1]] for g in groups])
        if keep.all():
            return rows, None
        return rows.filter(_bool_array(keep)), np.flatnonzero(keep)

    def _physical(self, groups: Sequence[int], index: np.ndarray) -> np.ndarray:
        """Physical positions of the rows at ``index`` (ascending) of a read of ``groups``."""
        if not len(index):
            return np.empty(0, dtype=np.int64)
        starts = np.asarray(self.reader.row_group_starts, dtype=np.int64)
        g = np.asarray(groups, dtype=np.int64)
        sizes = starts[g + 1] - starts[g]
        read_start = np.cumsum(sizes) - sizes  # where each group begins in the read
        which = np.searchsorted(read_start, index, side="right") - 1
        positions: np.ndarray = starts[g][which] + (index - read_start[which])
        return positions

    def live_rows(
        self, columns: Sequence[str] | None = None, *, skip_by: ex.Expr | None = None
    ) -> tuple[pa.Table, np.ndarray]:
        """(``columns`` of the live rows, their physical positions), from only the row groups
        whose statistics do not rule out ``skip_by`` (all of them if None)."""
        groups = self._groups(skip_by)
        rows, kept = self._read(columns, groups)
        index = np.arange(rows.num_rows, dtype=np.int64) if kept is None else kept
        return rows, self._physical(groups, index)

    def matching_positions(self, predicate: ex.Expr | None) -> np.ndarray:
        """Physical positions of the live rows satisfying ``predicate`` (all if None), ascending.

        Reads only the predicate's columns, of the row groups its statistics allow.
        """
        if predicate is None:
            every = np.arange(self.num_rows, dtype=np.int64)
            return every[self._kept_rows()] if self.deleted else every
        groups = self._groups(predicate)
        rows, kept = self._read(top_level_columns(predicate, self.schema), groups)
        if not rows.num_rows:
            return np.empty(0, dtype=np.int64)
        index = np.flatnonzero(ex.evaluate_mask(predicate, rows).to_numpy(zero_copy_only=False))
        return self._physical(groups, index if kept is None else kept[index])

    def _locate(self, positions: np.ndarray) -> tuple[list[int], np.ndarray]:
        """(the row groups holding ``positions`` (physical, ascending), in file order; each
        position's index in a read of just those groups)."""
        starts = np.asarray(self.reader.row_group_starts, dtype=np.int64)
        group_of = np.searchsorted(starts, positions, side="right") - 1
        groups = np.unique(group_of)
        sizes = starts[groups + 1] - starts[groups]
        read_offset = np.cumsum(sizes) - sizes  # where each group starts in the read
        local: np.ndarray = read_offset[np.searchsorted(groups, group_of)] + positions - starts[group_of]
        return [int(g) for g in groups], local

    def rows_at(
        self,
        positions: np.ndarray,
        columns: Sequence[str] | None = None,
        *,
        hidden: tuple[str, str] | None = None,
    ) -> pa.Table:
        """``columns`` (default all) of the rows at ``positions`` (physical, ascending, distinct),
        in that order; reads only the row groups holding them. With ``hidden`` (row
        tracking's column names), their stable ids are appended as those columns."""
        groups, local = self._locate(positions)
        rows = self.reader.read(columns, groups)
        if not (len(local) == rows.num_rows and np.array_equal(local, np.arange(len(local)))):
            rows = rows.take(pa.array(local, pa.int64()))
        return self.tracked(rows, positions, hidden)

    def tracked(self, rows: pa.Table, positions: np.ndarray, hidden: tuple[str, str] | None) -> pa.Table:
        """``rows`` (at physical ``positions``) with their stable row ids and commit versions
        as the hidden columns ``hidden`` names; unchanged when None (no row tracking)."""
        if hidden is None:
            return rows
        return row_tracking.attach(rows, hidden, *self.stable_row_ids(positions, hidden))

    def stable_row_ids(
        self, positions: np.ndarray, hidden: tuple[str, str] | None
    ) -> tuple[pa.Array, pa.Array]:
        """(stable row ids, stable row commit versions) of the rows at ``positions``
        (physical, ascending): the file's materialized values (``hidden`` names the
        columns), else ``baseRowId`` + position and ``defaultRowCommitVersion``."""
        materialized = None
        if hidden is not None and len(positions):
            groups, local = self._locate(positions)
            read = self.reader.read_hidden(hidden, groups)
            if read is not None:
                materialized = read.take(pa.array(local, pa.int64()))
        return row_tracking.stable_ids(self.add, positions, materialized, hidden)

    def live_batches(
        self,
        columns: Sequence[str] | None,
        predicate: ex.Expr | None,
        *,
        sql: str | None = None,
        batch_size: int,
    ) -> Iterator[pa.Table]:
        """The live rows satisfying ``predicate`` (all if None; parsed from ``sql``), with
        ``columns`` (default all, in schema order), as tables of at most ``batch_size`` rows.

        Only the row groups whose statistics admit ``predicate`` (and that hold a live row)
        are read. A local file is decoded ``batch_size`` rows at a time, so memory holds one
        batch (and the Parquet reader's buffers of one row group), not the file; a file on
        another filesystem was fetched whole by :class:`DataFileReader` and is decoded one
        row group at a time. Each batch's deletion vector rows are dropped by their physical
        positions, then the filter applies.
        """
        out = [n for n in self.schema.names if columns is None or n in set(columns)]
        needed = out
        if predicate is not None:
            used = set(top_level_columns(predicate, self.schema))
            needed = [n for n in self.schema.names if n in used or n in set(out)]
        arrow_filter = None
        if predicate is not None and ex.tree_size(predicate) <= MAX_ARROW_FILTER_NODES:
            arrow_filter = ex.to_arrow(predicate, schema=self.schema)
        starts = self.reader.row_group_starts
        for g in self._groups(predicate):
            offset = starts[g]  # physical position of the next batch's first row
            for rows in self._group_batches(needed, g, batch_size):
                n = rows.num_rows
                if self.deleted and self.deleted.range_cardinality(offset, offset + n):
                    rows = rows.filter(_bool_array(self._kept_rows()[offset : offset + n]))
                offset += n
                if predicate is not None and rows.num_rows:
                    rows = _filtered(rows, predicate, arrow_filter, sql)
                if rows.num_rows:
                    yield rows if needed == out else rows.select(out)

    def _group_batches(self, columns: Sequence[str], group: int, batch_size: int) -> Iterator[pa.Table]:
        """``columns`` (logical names) of every row of row group ``group``, in file order,
        in tables of at most ``batch_size`` rows with exactly the table schema's types."""
        # The reader's physical schema (in the logical schema's order, id mode's renames in).
        physical = dict(zip(self.schema.names, self.reader.schema.names, strict=True))
        parts = {physical[c] for c in self._partition_columns}
        fields = {f.name: f for f in self.reader.schema}
        physical_out = pa.schema([fields[physical[c]] for c in columns])
        read = [f.name for f in physical_out if f.name not in parts]
        file = self._parquet_file()
        in_file = {f.name: f.type for f in file.schema_arrow} if file is not None else {}
        # A nested column whose type the file holds otherwise (a struct with a field added
        # later, say) takes the dataset's schema evolution: its row group is read whole.
        evolved = any(c in in_file and in_file[c] != fields[c].type and pa.types.is_nested(in_file[c])
                      for c in read)  # fmt: skip
        if file is None or evolved:
            rows = self.reader.read(columns, [group])
            for batch in rows.to_batches(max_chunksize=batch_size):
                yield pa.Table.from_batches([batch], schema=rows.schema)
            return
        logical = pa.schema([self.schema.field(c) for c in columns])
        present = [c for c in read if c in in_file]
        batches = file.iter_batches(batch_size=batch_size, row_groups=[group], columns=present)
        if not present:  # only partition columns or columns the file lacks: count the rows
            total = file.metadata.row_group(group).num_rows
            sizes = [min(batch_size, total - i) for i in range(0, total, batch_size)]
            batches = (pa.record_batch([pa.nulls(n)], names=["_"]) for n in sizes)
        for batch in batches:
            n, arrays = batch.num_rows, []
            for f in physical_out:
                if f.name in parts:
                    value = decode_partition_value(self.add.partition_values.get(f.name), f.type)
                    arrays.append(pa.repeat(pa.scalar(value, f.type), n))
                elif f.name not in in_file:  # added to the table after this file was written
                    arrays.append(pa.nulls(n, f.type))
                else:
                    col = batch.column(f.name)
                    arrays.append(col if col.type == f.type else col.cast(f.type))
            rows = pa.Table.from_arrays(arrays, schema=physical_out)
            yield cm.to_logical(rows, logical) if physical_out.names != logical.names else rows

    def _parquet_file(self) -> pq.ParquetFile | None:
        """The local file opened for batch reads (its footer from the reader), else None."""
        if self.local_path is not None and self._file is None:
            # No pre-buffering of a row group's column chunks: pages are read through a
            # 1 MB buffer as they are decoded, so memory holds a batch, not a row group.
            self._file = pq.ParquetFile(
                self.local_path,
                metadata=self.reader.metadata,
                coerce_int96_timestamp_unit="us",  # Spark's INT96 timestamps, as the reader
                pre_buffer=False,
                buffer_size=_BUFFER_BYTES,
            )
        return self._file

    def live_rows_marked(
        self, positions: np.ndarray, *, hidden: tuple[str, str] | None = None
    ) -> tuple[pa.Table, pa.BooleanArray]:
        """(every live row, all columns, with stable row ids when ``hidden`` names their
        columns; which of them are at physical ``positions``)."""
        rows, live = self.live_rows()
        marked = np.zeros(self.num_rows, dtype=np.bool_)
        marked[positions] = True
        return self.tracked(rows, live, hidden), _bool_array(marked[live])


_BUFFER_BYTES = 1 << 20
"""Read buffer of :meth:`FileScan.live_batches` over a local file's column chunks."""


def _filtered(
    rows: pa.Table, predicate: ex.Expr, arrow_filter: pc.Expression | None, sql: str | None
) -> pa.Table:
    """The rows of ``rows`` where ``predicate`` holds (by ``arrow_filter``, its Arrow form,
    when given); a failed evaluation is a PredicateError naming ``sql``, as in
    :func:`read_matching_rows`."""
    if arrow_filter is None:
        return rows.filter(ex.evaluate_mask(predicate, rows))
    try:
        return rows.filter(arrow_filter)
    except ARROW_ERRORS as exc:
        text = sql if sql is not None else str(predicate)
        raise PredicateError(
            f"cannot evaluate filter {text[:200]!r}: {str(exc).splitlines()[0]}", expression=text
        ) from exc


def read_rows_with_ids(
    fs: fsspec.AbstractFileSystem,
    root: str,
    add: AddFile,
    schema: pa.Schema,
    partition_columns: Sequence[str],
    hidden: tuple[str, str] | None,
    predicate: ex.Expr | None = None,
) -> pa.Table:
    """The live rows of ``add`` where ``predicate`` holds (all if None), every column, with
    each row's stable ``_row_id`` and ``_row_commit_version`` (row tracking; ``hidden``
    names the file's materialized columns)."""
    scan = FileScan(fs, root, add, schema, partition_columns)
    rows, positions = scan.live_rows()
    if predicate is not None:
        mask = ex.evaluate_mask(predicate, rows)
        rows, positions = rows.filter(mask), positions[mask.to_numpy(zero_copy_only=False)]
    ids, versions = scan.stable_row_ids(positions, hidden)
    return row_tracking.attach(rows, (row_tracking.ROW_ID, row_tracking.ROW_COMMIT_VERSION), ids, versions)
