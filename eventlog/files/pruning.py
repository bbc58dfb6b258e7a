"""File pruning: which live files may hold rows matching a predicate.

First by partition values (exact: the partition-only conjuncts evaluated on each file's
typed partition values, NULL counting as no match), then by min/max/null-count statistics
(conservative: a file is dropped only when its statistics prove no row can match).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from eventlog import expr as ex
from eventlog.files.schema import partition_values_table, stats_table
from eventlog.log.actions import AddFile


def data_schema(schema: pa.Schema, partition_columns: Sequence[str]) -> pa.Schema:
    """The columns stored inside data files (all but the partition columns)."""
    parts = set(partition_columns)
    return pa.schema([f for f in schema if f.name not in parts])


def prune_by_partition(
    files: Sequence[AddFile], partition_predicate: ex.Expr, partition_schema: pa.Schema
) -> list[AddFile]:
    if not files:
        return []
    values = partition_values_table([f.partition_values for f in files], partition_schema)
    mask = ex.evaluate_mask(partition_predicate, values).to_pylist()
    return [f for f, keep in zip(files, mask, strict=True) if keep]


def prune_by_stats(files: Sequence[AddFile], predicate: ex.Expr, schema: pa.Schema) -> list[AddFile]:
    if not files:
        return []
    keep = ex.may_match(predicate, stats_table([f.stats for f in files], schema, len(files)))
    return [f for f, k in zip(files, keep, strict=True) if k]


def prune_files(
    files: Sequence[AddFile],
    predicate: ex.Expr,
    schema: pa.Schema,
    partition_columns: Sequence[str],
) -> tuple[ex.Expr | None, list[AddFile]]:
    """(the predicate's partition-only part or None, the files that may match)."""
    part_pred = ex.partition_predicate(predicate, partition_columns)
    out = list(files)
    if part_pred is not None:
        part_schema = pa.schema([schema.field(c) for c in partition_columns])
        out = prune_by_partition(out, part_pred, part_schema)
    out = prune_by_stats(out, predicate, data_schema(schema, partition_columns))
    return part_pred, out
