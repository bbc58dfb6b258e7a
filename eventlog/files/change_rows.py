"""Reading change data: the rows a change data feed read returns for a list of files.

A change data feed read (:mod:`eventlog.snapshot.changes`) decides per commit which files
say what changed (Delta's ``CDCReader``) and hands them here as :class:`ChangeFile` values:

* ``cdc``: a change data file (``_change_data/...``), its rows' ``_change_type`` stored in it;
* ``insert`` / ``delete``: an added or removed data file, every live row of it (its deletion
  vector applied) inserted or deleted;
* ``dv``: one data file removed and added again in one commit with another deletion vector:
  the rows the new vector deletes that the old one did not are deleted, and the rows the old
  one deleted that the new one does not are inserted again.

:func:`read_change_rows` reads them all at once, as the table schema plus ``_change_type``
and ``_commit_version``. The commit version (and for inferred rows the change type) rides
along as a *constant column per file*: a partition value the read materialises, so files of
a thousand commits are read by one scan, not one scan per commit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from eventlog.files.deletion_vectors import read_deletion_vector
from eventlog.files.reader import read_data_files
from eventlog.files.scan import FileScan, read_live_rows
from eventlog.log.actions import AddFile, DeletionVectorDescriptor

__all__ = [
    "CHANGE_TYPE",
    "COMMIT_TIMESTAMP",
    "COMMIT_VERSION",
    "KINDS",
    "ChangeFile",
    "change_columns",
    "read_change_rows",
]

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
KINDS = ("cdc", "insert", "delete", "dv")


def change_columns() -> list[pa.Field]:
    """The columns a change data feed read adds to the table's (Delta's ``cdcReadSchema``)."""
    return [
        pa.field(CHANGE_TYPE, pa.string()),
        pa.field(COMMIT_VERSION, pa.int64()),
        pa.field(COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC")),
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class ChangeFile:
    """One file a change data feed read takes rows from (see the module docstring).

    ``file`` is what to read: a ``cdc`` action's path, partition values and size; a removed
    file as an add with the remove's deletion vector; for ``dv``, the file with the new
    deletion vector, and ``before`` the one it had.
    """

    version: int
    kind: str
    file: AddFile
    before: DeletionVectorDescriptor | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "kind": self.kind, "file": self.file.to_json()}
        if self.before is not None:
            out["before"] = self.before.to_json()
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ChangeFile:
        before = d.get("before")
        return ChangeFile(
            version=int(d["version"]),
            kind=str(d["kind"]),
            file=AddFile.from_json(d["file"]),
            before=DeletionVectorDescriptor.from_json(before) if before else None,
        )


def _tagged(file: AddFile, version: int, change_type: str | None) -> AddFile:
    """``file`` with the change columns as partition values (read as constant columns)."""
    values = {**file.partition_values, COMMIT_VERSION: str(version)}
    if change_type is not None:
        values[CHANGE_TYPE] = change_type
    return dataclasses.replace(file, partition_values=values)


def read_change_rows(
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[ChangeFile],
    schema: pa.Schema,
    partition_columns: Sequence[str],
    *,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The changed rows of ``files``: ``columns`` of ``schema`` (default all; the table schema,
    column mapping metadata included) then ``_change_type`` and ``_commit_version``, ordered
    by commit version (a commit's rows in the order of its files). Partition columns come
    from each file's partition values, columns a file lacks are null."""
    fields = list(schema) if columns is None else [schema.field(c) for c in schema.names if c in columns]
    read_schema = pa.schema([*fields, *change_columns()[:2]], metadata=schema.metadata)
    wanted = [f.name for f in read_schema]
    full = pa.schema([*schema, *change_columns()[:2]], metadata=schema.metadata)
    cdc = [_tagged(f.file, f.version, None) for f in files if f.kind == "cdc"]
    inferred = [_tagged(f.file, f.version, f.kind) for f in files if f.kind in ("insert", "delete")]
    out: list[pa.Table] = []
    if cdc:
        out.append(read_data_files(fs, root, cdc, full, [*partition_columns, COMMIT_VERSION], columns=wanted))
    if inferred:
        tag_parts = [*partition_columns, COMMIT_VERSION, CHANGE_TYPE]
        out.append(read_live_rows(fs, root, inferred, full, tag_parts, columns=wanted))
    for f in files:
        if f.kind == "dv":
            out.extend(_dv_changes(fs, root, f, full, list(partition_columns), wanted))
    if not out:
        return read_schema.empty_table()
    rows = pa.concat_tables([t.select(wanted) for t in out])
    order = np.argsort(rows.column(COMMIT_VERSION).to_numpy(), kind="stable")
    return rows.take(pa.array(order, pa.int64()))


def _dv_changes(
    fs: fsspec.AbstractFileSystem,
    root: str,
    change: ChangeFile,
    schema: pa.Schema,
    partition_columns: list[str],
    columns: list[str],
) -> Iterable[pa.Table]:
    """The rows a deletion vector change deletes (``delete``) and brings back (``insert``)."""
    after = _deleted(fs, root, change.file.deletion_vector)
    before = _deleted(fs, root, change.before)
    for change_type, positions in (("delete", after - before), ("insert", before - after)):
        if not positions:
            continue
        plain = dataclasses.replace(change.file, deletion_vector=None)
        scan = FileScan(fs, root, _tagged(plain, change.version, change_type), schema,
                        [*partition_columns, COMMIT_VERSION, CHANGE_TYPE])  # fmt: skip
        index = np.fromiter(positions, dtype=np.int64, count=len(positions))
        yield scan.rows_at(index, columns)


def _deleted(fs: fsspec.AbstractFileSystem, root: str, dv: DeletionVectorDescriptor | None) -> BitMap64:
    if dv is None:
        return BitMap64()
    return BitMap64(read_deletion_vector(fs, root, dv))
