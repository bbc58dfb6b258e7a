"""Reading a snapshot's rows: :func:`read_snapshot_rows` checks the columns asked for,
parses a SQL filter against the snapshot's schema, prunes data files by partition values
and statistics, and reads the live rows (deletion vectors applied) that match.
"""

from __future__ import annotations

from collections.abc import Sequence

import fsspec
import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import UnknownColumnError
from eventlog.files import column_mapping as cm
from eventlog.files.scan import read_live_rows, read_matching_rows
from eventlog.log.filetable import add_files
from eventlog.snapshot.projection import Snapshot
from eventlog.userinput import check_string_list

__all__ = ["read_snapshot_rows"]


def read_snapshot_rows(
    fs: fsspec.AbstractFileSystem,
    root: str,
    snapshot: Snapshot,
    *,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The live rows of ``snapshot`` (a table at ``root`` on ``fs``) where the SQL predicate
    ``filter`` holds (all rows when None), with ``columns`` (default all, in schema order)."""
    schema, parts = snapshot.schema, snapshot.partition_columns
    if columns is not None:
        columns = check_string_list(columns, "column")
        for col in columns:
            if col not in schema.names:
                raise UnknownColumnError(col, list(schema.names), "columns")
    if filter is None:
        rows = read_live_rows(fs, root, snapshot.add_files, schema, parts, columns=columns)
    else:
        pred = ex.parse_predicate(filter, schema, context="filter")
        _, selected = snapshot.select_files(pred)
        files = sorted(add_files(selected), key=lambda a: a.path)
        rows = read_matching_rows(fs, root, files, schema, parts, pred, filter, columns=columns)
    # Readers see logical names only, without column mapping's ids and physical names.
    return cm.to_logical(rows, cm.strip(rows.schema)) if cm.is_mapped(schema) else rows
