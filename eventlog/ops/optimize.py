"""OPTIMIZE: bin-packing compaction, optionally Z-ordered. Its actions have
``dataChange = false``; on deletion-vector tables it records where each compacted row went,
so concurrent row deletes survive it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import FrozenBitMap64

from eventlog import expr as ex
from eventlog.errors import (
    InvalidInputError,
    UnknownColumnError,
)
from eventlog.files.datafiles import write_data_files
from eventlog.files.scan import read_file_positions
from eventlog.log.actions import AddFile
from eventlog.ops.common import table_target_size, write_rows
from eventlog.ops.rows import read_rows
from eventlog.txn.plan import Plan, PlanBuilder
from eventlog.txn.rowlevel import CompactionSource, compaction_tag

# --------------------------------------------------------------------------- optimize


def begin_optimize(
    plan: PlanBuilder, zorder_by: Sequence[str] | None, partition_filter: str | None
) -> tuple[list[str], ex.Expr | None]:
    """Validate an OPTIMIZE's arguments and name the operation; (Z-order columns, filter).

    Shared by every engine that runs OPTIMIZE (here and the Spark adapter), so they reject
    the same input and record the same operation.
    """
    zorder = list(zorder_by or [])
    schema = plan.schema
    parts = plan.metadata.partition_columns
    for col in zorder:
        if col not in schema.names:
            raise UnknownColumnError(col, list(schema.names), "zorder_by")
        if col in parts:
            raise InvalidInputError(f"cannot Z-order by partition column {col!r}")
    if partition_filter is not None:
        ex.check_sql_text(partition_filter, "partition_filter")
    plan.set_operation(
        "OPTIMIZE", {"predicate": [partition_filter] if partition_filter else [], "zOrderBy": zorder},
        changes_data=False,
    )  # fmt: skip
    pred = None
    if partition_filter is not None:
        pred = plan.parse_predicate(partition_filter, "partition_filter")
        outside = [c.name for c in ex.referenced_columns(pred) if c.name not in parts]
        if outside:
            raise InvalidInputError(f"OPTIMIZE's filter may only use partition columns, not {outside}")
    return zorder, pred


def optimize(
    plan: PlanBuilder,
    *,
    zorder_by: Sequence[str] | None = None,
    partition_filter: str | None = None,
    target_size: int | None = None,
) -> Plan:
    """Compact small files per partition (bin packing), optionally Z-ordered.

    All actions carry ``dataChange = false``, so the commit runs at snapshot isolation:
    it survives concurrent appends but not a concurrent delete of a file it read.
    """
    zorder, pred = begin_optimize(plan, zorder_by, partition_filter)
    parts = plan.metadata.partition_columns
    target = target_size or table_target_size(plan)
    files = plan.scan(pred)
    groups: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
    for f in files:
        groups.setdefault(tuple(sorted(f.partition_values.items())), []).append(f)
    removed = added = 0
    # On row-level-concurrency tables a plain compaction records where each source's rows
    # went, so concurrent DV deletes on its inputs can be carried over instead of failing
    # it; a Z-order permutes rows and keeps the file-level rules ("can conflict only when
    # ZORDER BY is used").
    mapped = not zorder and plan.deletion_vectors_enabled and not parts
    for group in groups.values():
        for bin_ in plan_bins(group, target, rewrite_all=bool(zorder)):
            plan.remove_files(bin_, data_change=False)
            removed += len(bin_)
            if mapped:
                _compact_mapped(plan, bin_)
                added += 1
                continue
            rows = read_rows(plan, bin_)
            if zorder:
                rows = rows.take(zorder_permutation(rows, zorder))
            added += len(write_rows(plan, rows, data_change=False))
    plan.add_metrics(numRemovedFiles=removed, numAddedFiles=added)
    return plan.build()


def _compact_mapped(plan: PlanBuilder, sources: Sequence[AddFile]) -> None:
    """Compact ``sources`` into exactly one file whose tags say where each source's rows went."""
    fs, root = plan.table.log.fs, plan.table.log.root
    parts: list[pa.Table] = []
    records: list[tuple[AddFile, FrozenBitMap64, int, int]] = []
    offset = 0
    for f in sources:
        rows, _, current, physical = read_file_positions(
            fs, root, f, plan.schema, plan.metadata.partition_columns
        )
        records.append((f, current, physical, offset))
        parts.append(rows)
        offset += rows.num_rows
    (add,) = write_data_files(
        fs, root, pa.concat_tables(parts), partition_columns=(), data_change=False, target_file_size=2**62
    )
    compaction = [
        CompactionSource(f.path, f.key[1], current, physical, add.path, start)
        for f, current, physical, start in records
    ]
    plan.add_files([dataclasses.replace(add, tags={**(add.tags or {}), **compaction_tag(compaction)})])
    plan.record_compaction(compaction)


def plan_bins(files: Sequence[AddFile], target: int, *, rewrite_all: bool) -> list[list[AddFile]]:
    """OPTIMIZE's bins for one partition: small files packed up to ``target`` bytes
    (bins of one file are left alone), or every file when rewriting all (Z-order)."""
    if rewrite_all:
        return [list(files)] if files else []
    small = sorted((f for f in files if f.size < target), key=lambda f: f.size)
    bins: list[list[AddFile]] = []
    current: list[AddFile] = []
    size = 0
    for f in small:
        if current and size + f.size > target:
            bins.append(current)
            current, size = [], 0
        current.append(f)
        size += f.size
    if current:
        bins.append(current)
    return [b for b in bins if len(b) > 1]


def zorder_permutation(rows: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Row order along a Z-order curve: interleave the bits of each column's dense rank."""
    k = len(columns)
    bits = max(1, 63 // k)
    z = np.zeros(rows.num_rows, dtype=np.uint64)
    for i, col in enumerate(columns):
        try:
            rank = pc.rank(rows[col], sort_keys="ascending", tiebreaker="dense")
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InvalidInputError(f"cannot Z-order by column {col!r} of type {rows[col].type}") from exc
        r = rank.to_numpy().astype(np.uint64) - np.uint64(1)
        top = int(r.max()) if len(r) else 0
        shift = max(0, top.bit_length() - bits)
        r = r >> np.uint64(shift)
        for b in range(bits):
            z |= ((r >> np.uint64(b)) & np.uint64(1)) << np.uint64(b * k + i)
    return np.argsort(z, kind="stable")
