"""Reading live rows: data files with their deletion vectors applied.

Files without a deletion vector are read in one pass (filters pushed into Parquet). A
file with a DV is read whole, because a DV addresses *physical* row positions; its
deleted rows are dropped before any filter runs. :func:`read_file_positions` also returns
each live row's physical position, which DML needs to write deletion vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import FrozenBitMap64

from eventlog.actions import AddFile
from eventlog.datafiles import read_data_files
from eventlog.deletion_vectors import deleted_mask, read_deletion_vector


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
        rows = read_data_files(fs, root, [add], schema, partition_columns)
        rows = rows.filter(deleted_mask(file_deletes(fs, root, add), rows.num_rows, uri=add.path))
        if filter is not None:
            rows = rows.filter(filter)
        if columns is not None:
            rows = rows.select([n for n in schema.names if n in set(columns)])
        parts.append(rows)
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


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
