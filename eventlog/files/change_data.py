"""Change data feed on write: the rows a commit changes, as ``cdc`` actions and
``_change_data`` files (Delta's ``delta.enableChangeDataFeed``).

Delta's readers take a commit's changes from its ``cdc`` actions when it has any, and
ignore its adds and removes then; a commit without them is read from its adds (inserts)
and removes (deletes of every row of the removed file). So a writer needs change files
only for changes the adds and removes cannot tell: rows deleted from a file that lives on
(rewritten) and updated rows. :class:`ChangeRecorder` collects
every row an operation changes and decides, once for the commit:

* only inserts, whole-file removes and rows deleted by deletion vectors: no change file
  (appends, overwrites, partition deletes and DELETE on a DV table cost nothing more, as
  in Delta, whose readers take a DV delete from the difference of the file's DVs); but a
  file with a DV removed whole gets change files, for delta-rs (see ``files_removed``);
* anything else: change files holding every change of the commit, the inserts and the
  rows of the removed files included, since readers use only those. They are written in
  groups of about :data:`CHANGE_GROUP_BYTES`, some while the operation runs, so a large
  operation does not keep its changed rows until the commit.

The files hold the table's columns (physical names under column mapping) plus
``_change_type`` (``insert``, ``delete``, ``update_preimage``, ``update_postimage``),
partitioned as data files under ``_change_data/``, named ``cdc-...``; they are never live
data, and VACUUM deletes them once they are older than the retention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import fsspec
import pyarrow as pa

from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE, write_data_files
from eventlog.files.enforce import conform
from eventlog.log.actions import AddCDCFile, AddFile

__all__ = [
    "CDF_PROPERTY",
    "CHANGE_DATA_DIR",
    "CHANGE_GROUP_BYTES",
    "CHANGE_TYPE_COLUMN",
    "ChangeParts",
    "DELETE",
    "INSERT",
    "UPDATE_POSTIMAGE",
    "UPDATE_PREIMAGE",
    "ChangeRecorder",
    "cdf_enabled",
    "change_schema",
]

CDF_PROPERTY = "delta.enableChangeDataFeed"
CHANGE_DATA_DIR = "_change_data"
CHANGE_TYPE_COLUMN = "_change_type"
INSERT = "insert"
DELETE = "delete"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"
_KINDS = (INSERT, DELETE, UPDATE_PREIMAGE, UPDATE_POSTIMAGE)


def cdf_enabled(configuration: Mapping[str, str]) -> bool:
    """Whether a table with these properties records its changes."""
    return str(configuration.get(CDF_PROPERTY, "")).lower() == "true"


def change_schema(schema: pa.Schema) -> pa.Schema:
    """The columns of a table's change files: its own, then ``_change_type``."""
    return pa.schema([*schema, pa.field(CHANGE_TYPE_COLUMN, pa.string(), nullable=False)])


#: Change rows are written in groups of about this many bytes (in memory, Arrow's measure):
#: an operation that changes more rows than this writes its change files as it goes
#: (:meth:`ChangeRecorder.rows`) and at the end, so the change data never holds much more.
CHANGE_GROUP_BYTES = 64 * 1024 * 1024

ChangeParts = Sequence[tuple[str, pa.Table]]


class ChangeRecorder:
    """The rows one commit changes (see the module docstring).

    ``spill`` writes a group of change rows (kind, rows) as change files: once the commit is
    known to need change files, the rows recorded are handed to it whenever they reach
    :data:`CHANGE_GROUP_BYTES`, so a large operation does not keep them all.
    """

    def __init__(self, spill: Callable[[ChangeParts], None] | None = None) -> None:
        self._rows: list[tuple[str, pa.Table]] = []
        self._buffered = 0  # bytes of self._rows
        self._removed: list[AddFile] = []
        self._added: list[AddFile] = []
        self._later: list[tuple[str, Callable[[], pa.Table]]] = []
        self._row_level = False
        self._spill = spill

    def rows(self, kind: str, rows: pa.Table) -> None:
        """``rows`` (the table's columns, partition columns included) changed as ``kind``."""
        if kind not in _KINDS:
            raise ValueError(f"unknown change type {kind!r}")
        if rows.num_rows:
            self._rows.append((kind, rows))
            self._buffered += rows.nbytes
            self._row_level = self._row_level or kind != INSERT
            if self._row_level and self._spill is not None and self._buffered >= CHANGE_GROUP_BYTES:
                parts, self._rows, self._buffered = self._rows, [], 0
                self._spill(parts)

    def rows_later(self, kind: str, rows: Callable[[], pa.Table]) -> None:
        """Rows changed as ``kind`` that readers can also tell from the commit's file
        actions (rows deleted by a deletion vector: the difference of the file's old and new
        DVs); ``rows`` reads them only if the commit needs change files for other changes."""
        if kind not in _KINDS:
            raise ValueError(f"unknown change type {kind!r}")
        self._later.append((kind, rows))

    def files_removed(self, files: Sequence[AddFile]) -> None:
        """Whole files removed unread (their live rows are deletes, read only if needed).
        Removing a file that has a deletion vector gets change files, though Delta's readers
        would not need them: delta-rs (1.x) reads such a remove as the rows its DV deleted."""
        self._removed.extend(files)
        self._row_level = self._row_level or any(f.deletion_vector is not None for f in files)

    def files_added(self, files: Sequence[AddFile]) -> None:
        """New files written elsewhere (Spark tasks): their rows are inserts, read only if
        the commit needs change files."""
        self._added.extend(files)

    @property
    def needs_files(self) -> bool:
        """Whether the commit's changes need change files (some change is row-level)."""
        return self._row_level

    def _parts(self, read_live: Callable[[Sequence[AddFile]], pa.Table]) -> Iterator[tuple[str, pa.Table]]:
        """Every change not written yet, (kind, rows), each file read only when reached."""
        rows, self._rows, self._buffered = self._rows, [], 0
        yield from rows
        for kind, later in self._later:
            yield kind, later()
        for f in self._removed:
            yield DELETE, read_live([f])
        for f in self._added:
            yield INSERT, read_live([f])

    def write(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        schema: pa.Schema,
        partition_columns: Sequence[str],
        read_live: Callable[[Sequence[AddFile]], pa.Table],
        *,
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    ) -> list[AddCDCFile]:
        """Write the change files, if the commit needs them; the ``cdc`` actions. The rows
        are conformed to ``schema`` (the table's, with its column mapping metadata) and
        written in groups of about :data:`CHANGE_GROUP_BYTES`."""
        if not self._row_level:
            return []
        out: list[AddCDCFile] = []
        group: list[tuple[str, pa.Table]] = []
        size = 0
        for kind, rows in self._parts(read_live):
            group.append((kind, rows))
            size += rows.nbytes
            if size >= CHANGE_GROUP_BYTES:
                out += self.write_parts(fs, root, schema, partition_columns, group, target_file_size)
                group, size = [], 0
        if group:
            out += self.write_parts(fs, root, schema, partition_columns, group, target_file_size)
        return out

    @classmethod
    def write_parts(
        cls,
        fs: fsspec.AbstractFileSystem,
        root: str,
        schema: pa.Schema,
        partition_columns: Sequence[str],
        parts: ChangeParts,
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    ) -> list[AddCDCFile]:
        """Change rows, (kind, rows of the table's columns) pairs, as change files."""
        tables = []
        for kind, rows in parts:
            rows = rows.select([n for n in schema.names if n in rows.column_names])
            rows = rows.append_column(CHANGE_TYPE_COLUMN, pa.repeat(pa.scalar(kind), rows.num_rows))
            tables.append(conform(rows, change_schema(schema), context="change data"))
        if not tables:
            return []
        return cls.write_rows(fs, root, schema, partition_columns, pa.concat_tables(tables), target_file_size)

    @staticmethod
    def write_rows(
        fs: fsspec.AbstractFileSystem,
        root: str,
        schema: pa.Schema,
        partition_columns: Sequence[str],
        rows: pa.Table,
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    ) -> list[AddCDCFile]:
        """Change rows (``schema``'s columns and ``_change_type``) as change files under
        ``_change_data``; their ``cdc`` actions (paths relative to the table root)."""
        data = conform(rows, change_schema(schema), context="change data")
        adds = write_data_files(
            fs,
            f"{root.rstrip('/')}/{CHANGE_DATA_DIR}",
            data,
            partition_columns=partition_columns,
            data_change=False,
            target_file_size=target_file_size,
            stem="cdc",
        )
        return [AddCDCFile(f"{CHANGE_DATA_DIR}/{a.path}", dict(a.partition_values), a.size) for a in adds]
