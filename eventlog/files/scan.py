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

from collections.abc import Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import FrozenBitMap64

from eventlog import expr as ex
from eventlog.errors import CorruptLogError, PredicateError
from eventlog.expr.evaluate import ARROW_ERRORS
from eventlog.files import column_mapping as cm
from eventlog.files import row_tracking
from eventlog.files.deletion_vectors import deleted_mask, read_deletion_vector
from eventlog.files.reader import DataFileReader, read_data_files
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

    def live_rows_marked(
        self, positions: np.ndarray, *, hidden: tuple[str, str] | None = None
    ) -> tuple[pa.Table, pa.BooleanArray]:
        """(every live row, all columns, with stable row ids when ``hidden`` names their
        columns; which of them are at physical ``positions``)."""
        rows, live = self.live_rows()
        marked = np.zeros(self.num_rows, dtype=np.bool_)
        marked[positions] = True
        return self.tracked(rows, live, hidden), _bool_array(marked[live])


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
