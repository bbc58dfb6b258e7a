"""A snapshot as a lazy ``pyarrow.dataset.Dataset``: :func:`snapshot_dataset`.

The dataset lists the snapshot's live files with the table schema; each file's fragment
carries a *partition expression* (its partition values, ``date == 2024-01-01``) from which
pyarrow materializes the partition columns and prunes files against a filter, as delta-rs's
``DeltaTable.to_pyarrow_dataset`` does. To each file's expression we also add what its
statistics guarantee for integer and date columns (``min <= c <= max``), but only where the
file holds no null in that column (a null row would break the guarantee) and has no
deletion vector: those bounds are exact, unlike the truncated bounds of strings and
timestamps, so pyarrow may skip a file by them soundly.

Nothing is read when the dataset is made; DuckDB, Polars and pyarrow then read only the
columns and files a query needs. A plain dataset cannot drop the rows a deletion vector
deletes, nor rename column mapping's physical columns to the table's names: such snapshots
are refused with :class:`~eventlog.errors.DatasetUnsupportedError` (``Table.scan`` reads
them).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from fsspec.implementations.local import LocalFileSystem

from eventlog.errors import DatasetUnsupportedError
from eventlog.files import column_mapping as cm
from eventlog.files.reader import data_file_path
from eventlog.files.schema import decode_partition_value
from eventlog.log.actions import AddFile
from eventlog.snapshot.projection import Snapshot

__all__ = ["snapshot_dataset"]

_FORMAT = ds.ParquetFileFormat(
    # Spark writes INT96 timestamps by default; read them as microseconds like the table type.
    read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"),
)


def snapshot_dataset(fs: fsspec.AbstractFileSystem, root: str, snapshot: Snapshot) -> ds.FileSystemDataset:
    """The live rows of ``snapshot`` (a table at ``root`` on ``fs``) as a lazy dataset with
    the table schema and its partition columns (module docstring). A local table is read
    by Arrow's own filesystem, any other through ``fs`` (``pyarrow.fs.FSSpecHandler``)."""
    schema = snapshot.schema
    files = sorted(snapshot.add_files, key=lambda a: a.path)
    if cm.is_mapped(schema):
        raise DatasetUnsupportedError(uri=root, version=snapshot.version, reason="column mapping", count=0)
    with_dv = sum(1 for a in files if a.deletion_vector is not None)
    if with_dv:
        raise DatasetUnsupportedError(
            uri=root, version=snapshot.version, reason="deletion vectors", count=with_dv
        )
    table_schema = pa.schema(list(schema))
    filesystem: pafs.FileSystem
    if isinstance(fs, LocalFileSystem):
        filesystem = pafs.LocalFileSystem()
    else:
        filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    paths = [data_file_path(fs, root, a.path) for a in files]
    guarantees = [_guarantee(a, table_schema, snapshot.partition_columns) for a in files]
    return ds.FileSystemDataset.from_paths(
        paths, schema=table_schema, format=_FORMAT, filesystem=filesystem, partitions=guarantees
    )


def _guarantee(add: AddFile, schema: pa.Schema, partition_columns: Sequence[str]) -> pc.Expression:
    """What holds for every row of ``add``: its partition values, and the bounds its
    statistics give for integer and date columns without nulls."""
    terms: list[pc.Expression] = []
    for c in partition_columns:
        t = schema.field(c).type
        value = decode_partition_value(add.partition_values.get(c), t)
        terms.append(pc.field(c).is_null() if value is None else pc.field(c) == pa.scalar(value, t))
    stats = add.parsed_stats()
    if stats:
        terms += _stat_bounds(stats, schema, set(partition_columns))
    if not terms:
        return pc.scalar(True)
    expr = terms[0]
    for term in terms[1:]:
        expr = expr & term
    return expr


def _stat_bounds(stats: dict[str, Any], schema: pa.Schema, partitions: set[str]) -> list[pc.Expression]:
    """``min <= c <= max`` for each top-level integer or date column whose null count is
    recorded as 0 (so every row has a value within the bounds)."""
    mins, maxes, nulls = (
        stats.get("minValues") or {},
        stats.get("maxValues") or {},
        stats.get("nullCount") or {},
    )
    terms = []
    for f in schema:
        if f.name in partitions or not (pa.types.is_integer(f.type) or pa.types.is_date32(f.type)):
            continue
        if nulls.get(f.name) != 0 or f.name not in mins or f.name not in maxes:
            continue
        low, high = _bound(mins[f.name], f.type), _bound(maxes[f.name], f.type)
        if low is None or high is None:
            continue
        terms.append((pc.field(f.name) >= low) & (pc.field(f.name) <= high))
    return terms


def _bound(value: Any, t: pa.DataType) -> pa.Scalar | None:
    """A statistic of a column of type ``t`` as a scalar of that type (None if it is not one:
    a bound from before a type change, say, is left out rather than guessed)."""
    try:
        if pa.types.is_date32(t):
            if not isinstance(value, str):
                return None
            return pa.scalar(dt.date.fromisoformat(value), t)
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return pa.scalar(value, t)
    except (ValueError, TypeError, OverflowError, pa.ArrowException):
        return None
