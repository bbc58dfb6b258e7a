"""Reading a snapshot's rows: :func:`read_snapshot_rows` checks the columns asked for,
parses a SQL filter against the snapshot's schema, prunes data files by partition values
and statistics, and reads the live rows (deletion vectors applied) that match.
"""

from __future__ import annotations

from collections.abc import Sequence

import fsspec
import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import InvalidInputError, RowTrackingNotEnabledError, UnknownColumnError
from eventlog.files import column_mapping as cm
from eventlog.files import row_tracking
from eventlog.files.scan import read_live_rows, read_matching_rows, read_rows_with_ids
from eventlog.log.filetable import add_files
from eventlog.snapshot.projection import Snapshot
from eventlog.userinput import check_string_list

__all__ = ["checked_columns", "read_snapshot_rows"]


def read_snapshot_rows(
    fs: fsspec.AbstractFileSystem,
    root: str,
    snapshot: Snapshot,
    *,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
    row_ids: bool = False,
) -> pa.Table:
    """The live rows of ``snapshot`` (a table at ``root`` on ``fs``) where the SQL predicate
    ``filter`` holds (all rows when None), with ``columns`` (default all, in schema order);
    with ``row_ids``, also each row's stable ``_row_id`` and ``_row_commit_version`` (row
    tracking must be enabled: :class:`~eventlog.errors.RowTrackingNotEnabledError`)."""
    schema, parts = snapshot.schema, snapshot.partition_columns
    columns = checked_columns(schema, columns)
    if row_ids:
        rows = _read_with_row_ids(fs, root, snapshot, filter, columns)
    elif filter is None:
        rows = read_live_rows(fs, root, snapshot.add_files, schema, parts, columns=columns)
    else:
        pred = ex.parse_predicate(filter, schema, context="filter")
        _, selected = snapshot.select_files(pred)
        files = sorted(add_files(selected), key=lambda a: a.path)
        rows = read_matching_rows(fs, root, files, schema, parts, pred, filter, columns=columns)
    # Readers see logical names only, without column mapping's ids and physical names.
    return cm.to_logical(rows, cm.strip(rows.schema)) if cm.is_mapped(schema) else rows


def checked_columns(schema: pa.Schema, columns: Sequence[str] | None) -> list[str] | None:
    """``columns`` asked of a read, each one of ``schema``'s (UnknownColumnError otherwise)."""
    if columns is None:
        return None
    columns = check_string_list(columns, "column")
    for col in columns:
        if col not in schema.names:
            raise UnknownColumnError(col, list(schema.names), "columns")
    return list(columns)


def _read_with_row_ids(
    fs: fsspec.AbstractFileSystem,
    root: str,
    snapshot: Snapshot,
    filter: str | None,
    columns: Sequence[str] | None,
) -> pa.Table:
    """Live rows file by file, with their physical positions, so that each row's stable id
    can be made (:meth:`eventlog.files.scan.FileScan.stable_row_ids`)."""
    if not row_tracking.enabled(snapshot.protocol, snapshot.metadata):
        raise RowTrackingNotEnabledError(
            version=snapshot.version, supported=row_tracking.supported(snapshot.protocol)
        )
    schema, parts = snapshot.schema, snapshot.partition_columns
    for name in (row_tracking.ROW_ID, row_tracking.ROW_COMMIT_VERSION):
        if name in schema.names:
            raise InvalidInputError(f"the table has a column named {name!r}, which row ids would hide")
    hidden = row_tracking.materialized_columns(snapshot.metadata.configuration)
    pred = ex.parse_predicate(filter, schema, context="filter") if filter is not None else None
    files = snapshot.add_files if pred is None else add_files(snapshot.select_files(pred)[1])
    out: list[pa.Table] = []
    for add in sorted(files, key=lambda a: a.path):
        rows = read_rows_with_ids(fs, root, add, schema, parts, hidden, pred)
        out.append(rows if columns is None else rows.select([*columns, *_ROW_ID_COLUMNS]))
    if out:
        return pa.concat_tables(out)
    empty = pa.schema(list(schema) if columns is None else [schema.field(c) for c in columns])
    no_ids = pa.array([], pa.int64())
    return row_tracking.attach(empty.empty_table(), _ROW_ID_COLUMNS, no_ids, no_ids)


_ROW_ID_COLUMNS = (row_tracking.ROW_ID, row_tracking.ROW_COMMIT_VERSION)
