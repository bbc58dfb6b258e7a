"""Batch reads: ``spark.read.format("eventlog").load(uri)``.

Planning (driver side, one Python worker): :meth:`EventlogReader.partitions` lists the
snapshot's files and packs them into input partitions (one per file, or per group of
small files up to ``maxPartitionBytes``). Tasks: :meth:`EventlogReader.read` yields the
live rows of its files (deletion vectors applied) as Arrow batches of exactly the schema
Spark expects.

:class:`PruningReader` (option ``filterPushdown=true``) also implements ``pushFilters``:
the filters it can express as eventlog predicates prune files by partition values and
skip them by min/max statistics. It *claims* (Spark does not re-apply) only filters on
non-floating-point partition columns, which partition pruning evaluates exactly; every
other filter only skips files and Spark still applies it to the rows.

Why pruning is opt-in: pyspark 4.2 caches the read plan of the last scan that pushed
filters on the relation (``PythonDataSourceV2.readInfo``) and reuses it for later scans of
the same DataFrame that push none, so after ``df.where("p = 'b'").count()`` a plain
``df.count()`` would only read the files left for ``p = 'b'``. The plain reader plans the
same files whatever the filters, which makes that reuse harmless. Newer Spark keeps
pushdown plans per scan (apache/spark ``PythonDataSourceV2.getOrCreateReadInfo``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.types import StructType

from eventlog import expr as ex
from eventlog.errors import EventlogError, InvalidInputError, UnknownColumnError
from eventlog.files import row_tracking
from eventlog.files.scan import read_live_rows, read_rows_with_ids
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files
from eventlog.log.location import TableLocation
from eventlog.snapshot import Snapshot
from eventlog.table import Table
from spark_adapter.types import spark_arrow_schema, to_spark_arrow

__all__ = [
    "EventlogReader",
    "FilesPartition",
    "PruningReader",
    "ScanSource",
    "filter_to_sql",
    "pack_files",
    "split_bytes",
]

log = logging.getLogger("spark_adapter.reader")

DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
# What opening a file costs, in bytes of reading (Spark's spark.sql.files.openCostInBytes).
_OPEN_COST_BYTES = 4 * 1024 * 1024
_BATCH_ROWS = 64 * 1024
_COMPARISONS: dict[type, str] = {
    EqualTo: "=",
    EqualNullSafe: "<=>",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}


@dataclasses.dataclass(frozen=True)
class ScanSource:
    """The table and version a scan reads (resolved once, by ``DataSource.schema``); the
    location carries the storage options, so tasks reach the files as the driver did."""

    location: TableLocation
    slots: str | None
    version: int
    schema_json: str  # the snapshot's table schema (Spark JSON)
    partition_columns: tuple[str, ...]
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    # The ``rowIds`` option: row tracking's hidden column names (each row's stable id and
    # commit version are read), or None.
    row_ids: tuple[str, str] | None = None

    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def schema(self) -> pa.Schema:
        return from_spark_schema_json(self.schema_json)


class FilesPartition(InputPartition):  # type: ignore[misc]
    """One input partition: the add actions (JSON dicts) of the files one task reads."""

    def __init__(self, files: list[dict[str, Any]]) -> None:
        super().__init__(files)

    @property
    def files(self) -> list[dict[str, Any]]:
        files: list[dict[str, Any]] = self.value
        return files


class EventlogReader(DataSourceReader):  # type: ignore[misc]
    """Plans and reads one snapshot; pickled to the tasks (without the snapshot)."""

    def __init__(self, source: ScanSource, schema: StructType, snapshot: Snapshot | None = None) -> None:
        self.source = source
        self.output = schema
        self.predicates: list[str] = []  # SQL of every filter used for pruning
        self._snapshot = snapshot

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_snapshot"] = None  # tasks need only their partition's files
        return state

    # ------------------------------------------------------------------ planning

    def plan_files(self) -> tuple[list[AddFile], int]:
        """(files that may hold matching rows, live files in the snapshot)."""
        snap = self._snapshot
        if snap is None:
            src = self.source
            with Table.open(src.uri, slots=src.slots, storage_options=src.location.storage_options) as table:
                snap = table.snapshot(src.version)
        pred = None
        if self.predicates:
            pred = ex.parse_predicate(" AND ".join(f"({p})" for p in self.predicates), snap.schema)
        _, selected = snap.select_files(pred)  # on columns; values only for the files kept
        return sorted(add_files(selected), key=lambda a: a.path), snap.num_files

    def partitions(self) -> list[InputPartition]:
        files, total = self.plan_files()
        groups = pack_files(files, split_bytes(files, self.source.max_partition_bytes))
        log.info(
            "scan of %s at version %d: %d of %d files after pruning (%s), %d input partitions",
            self.source.uri,
            self.source.version,
            len(files),
            total,
            " AND ".join(self.predicates) or "no filters",
            len(groups),
        )
        return [FilesPartition([f.to_json() for f in group]) for group in groups]

    # ------------------------------------------------------------------ tasks

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        files = [AddFile.from_json(d) for d in getattr(partition, "files", None) or []]
        if not files:
            return iter(())
        return self._read(files)

    def _read(self, files: list[AddFile]) -> Iterator[pa.RecordBatch]:
        src = self.source
        schema = src.schema
        columns = _table_columns(self.output, row_id_schema(schema) if src.row_ids is not None else schema)
        fs, root = src.location.files()
        target = spark_arrow_schema(self.output)
        for add in files:
            # One file at a time: a task's memory stays at one file's rows.
            if src.row_ids is not None:
                rows = read_rows_with_ids(fs, root, add, schema, src.partition_columns, src.row_ids)
            else:
                rows = read_live_rows(fs, root, [add], schema, src.partition_columns, columns=columns)
            rows = rows.select(columns).rename_columns(target.names)
            yield from to_spark_arrow(rows, target).to_batches(max_chunksize=_BATCH_ROWS)


class PruningReader(EventlogReader):
    """An :class:`EventlogReader` that prunes and skips files by the filters Spark pushes."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Use every filter eventlog can express for pruning; return those Spark must still apply."""
        schema = self.source.schema
        parts = {c.lower() for c in self.source.partition_columns}
        unhandled: list[Filter] = []
        for f in filters:
            sql = filter_to_sql(f)
            try:
                pred = ex.parse_predicate(sql, schema, context="pushed filter") if sql else None
            except EventlogError:
                pred = None
            if pred is None or not _safe_for_pruning(pred, f, schema, parts):
                unhandled.append(f)
                continue
            assert sql is not None
            self.predicates.append(sql)
            # Exact only when partition values alone decide it (float partitions were
            # refused above); Spark re-applies the rest to the rows.
            if not all(c.name.lower() in parts for c in ex.referenced_columns(pred)):
                unhandled.append(f)
        return unhandled


def row_id_schema(schema: pa.Schema) -> pa.Schema:
    """The table schema with the ``rowIds`` columns (``_row_id``, ``_row_commit_version``)."""
    for name in (row_tracking.ROW_ID, row_tracking.ROW_COMMIT_VERSION):
        if name in schema.names:
            raise InvalidInputError(
                f"the table has a column named {name!r}, which the rowIds option would hide"
            )
    return schema.append(pa.field(row_tracking.ROW_ID, pa.int64())).append(
        pa.field(row_tracking.ROW_COMMIT_VERSION, pa.int64())
    )


def _table_columns(output: StructType, schema: pa.Schema) -> list[str]:
    """The table columns behind Spark's output columns (a user schema may differ in case)."""
    by_lower = {n.lower(): n for n in schema.names}
    out = []
    for name in output.fieldNames():
        col = name if name in schema.names else by_lower.get(name.lower())
        if col is None:
            raise UnknownColumnError(name, list(schema.names), "read schema")
        out.append(col)
    return out


def split_bytes(files: Sequence[AddFile], max_partition_bytes: int) -> int:
    """Spark's file-source split size: ``min(maxPartitionBytes, max(openCost, total / cores))``.

    Small tables still get one task per core. The cores are this machine's (the planning
    worker cannot see ``defaultParallelism``), which is exact for ``local[*]`` sessions.
    """
    total = sum(f.size + _OPEN_COST_BYTES for f in files)
    return min(max_partition_bytes, max(_OPEN_COST_BYTES, total // (os.cpu_count() or 1)))


def pack_files(files: Sequence[AddFile], max_bytes: int) -> list[list[AddFile]]:
    """Input partitions: consecutive files packed up to ``max_bytes`` (each file counted
    with Spark's 4 MB open cost), so big files read alone and small ones share a task."""
    groups: list[list[AddFile]] = []
    current: list[AddFile] = []
    size = 0
    for f in files:
        weight = f.size + _OPEN_COST_BYTES
        if current and size + weight > max_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(f)
        size += weight
    if current:
        groups.append(current)
    return groups


# --------------------------------------------------------------------------- filters


def filter_to_sql(f: Filter) -> str | None:
    """Spark SQL text of a pushed filter, or None when it has no eventlog equivalent."""
    if isinstance(f, Not):
        inner = filter_to_sql(f.child)
        return None if inner is None else f"NOT ({inner})"
    path: tuple[str, ...] = getattr(f, "attribute", ())
    if not path:
        return None
    column = ".".join("`" + part.replace("`", "``") + "`" for part in path)
    if isinstance(f, IsNull):
        return f"{column} IS NULL"
    if isinstance(f, IsNotNull):
        return f"{column} IS NOT NULL"
    raw: Any = getattr(f, "value", None)
    op = _COMPARISONS.get(type(f))
    if op is not None:
        value = _literal(raw)
        return None if value is None else f"{column} {op} {value}"
    if isinstance(f, In):
        values = [_literal(v) for v in raw]
        if not values or any(v is None for v in values):
            return None
        return f"{column} IN ({', '.join(v for v in values if v is not None)})"
    if isinstance(f, (StringStartsWith, StringEndsWith, StringContains)) and isinstance(raw, str):
        text = raw.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        pattern = {StringStartsWith: "{}%", StringEndsWith: "%{}", StringContains: "%{}%"}[type(f)]
        return f"{column} LIKE {ex.to_sql(ex.Literal(pattern.format(text)))}"
    return None


def _literal(value: Any) -> str | None:
    if value is None:
        return "NULL"
    try:
        return ex.to_sql(ex.Literal(value))
    except (TypeError, ValueError):  # e.g. a variant or interval value
        return None


def _is_float(t: pa.DataType) -> bool:
    return bool(pa.types.is_floating(t))


def _field_type(schema: pa.Schema, name: str) -> pa.DataType | None:
    """Type of a (possibly dotted, nested) column name."""
    head, *rest = name.split(".")
    if head not in schema.names:
        return None
    t = schema.field(head).type
    for part in rest:
        if not pa.types.is_struct(t) or t.get_field_index(part) < 0:
            return None
        t = t.field(part).type
    return t


def _safe_for_pruning(pred: ex.Expr, f: Filter, schema: pa.Schema, parts: set[str]) -> bool:
    """Can pruning by ``pred`` never drop a row Spark's filter would keep?

    Spark orders NaN above every number and NaN = NaN is true; Arrow comparisons with NaN
    are false. Statistics already allow for NaN in the data (no max is written), but a NaN
    literal, or a float *partition* column (pruned by comparing values), would be judged
    with Arrow's rules, so those filters are left to Spark.
    """
    for col in ex.referenced_columns(pred):
        t = _field_type(schema, col.name)
        if t is None or (_is_float(t) and col.name.lower() in parts):
            return False
    while isinstance(f, Not):
        f = f.child
    value = getattr(f, "value", None)
    values = value if isinstance(value, (list, tuple)) else [value]
    return not any(isinstance(v, float) and math.isnan(v) for v in values)
