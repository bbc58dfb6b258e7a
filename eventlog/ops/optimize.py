"""OPTIMIZE: bin-packing compaction, optionally Z-ordered. Its actions have
``dataChange = false``; on deletion-vector tables it records where each compacted row went,
so concurrent row deletes survive it."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import FrozenBitMap64

from eventlog import expr as ex
from eventlog.errors import (
    InvalidInputError,
    UnknownColumnError,
)
from eventlog.files import column_mapping as cm
from eventlog.files.datafiles import write_data_files
from eventlog.files.pruning import prune_table
from eventlog.files.scan import FileScan, read_file_positions
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files
from eventlog.ops.common import file_rows, table_target_size, write_rows
from eventlog.ops.rows import read_rows
from eventlog.snapshot.clustering import check_no_zorder, clustering_columns
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
    snap = plan.snapshot
    if snap is not None:
        check_no_zorder(clustering_columns(snap.protocol, snap.domains, schema), zorder)
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
    return zorder, partition_predicate(plan, partition_filter, "OPTIMIZE")


def partition_predicate(plan: PlanBuilder, partition_filter: str | None, operation: str) -> ex.Expr | None:
    """The parsed ``partition_filter`` of an OPTIMIZE or REORG (None without one); it may
    only read partition columns, as in Delta."""
    if partition_filter is None:
        return None
    parts = plan.metadata.partition_columns
    pred = plan.parse_predicate(partition_filter, "partition_filter")
    outside = [c.name for c in ex.referenced_columns(pred) if c.name not in parts]
    if outside:
        raise InvalidInputError(f"{operation}'s filter may only use partition columns, not {outside}")
    return pred


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
    scanned = scan_files(plan, pred)
    if scanned is None:  # no snapshot yet: nothing to compact
        plan.add_metrics(numRemovedFiles=0, numAddedFiles=0)
        return plan.build()
    part_pred, files = scanned
    keys = cm.partition_keys(plan.schema, parts)  # column mapping: keyed by physical names
    bins = bin_rows(files, keys, target, rewrite_all=bool(zorder))
    # Delta's OPTIMIZE reads every file its filter selects.
    return rewrite_bins(plan, _bin_files(files, bins), zorder, pred, part_pred, read_files(files, keys))


def rewrite_bins(
    plan: PlanBuilder,
    bins: Sequence[Sequence[AddFile]],
    zorder: Sequence[str],
    pred: ex.Expr | None,
    part_pred: ex.Expr | None,
    read: Mapping[str, Mapping[str, str | None]],
) -> Plan:
    """Rewrite each bin of files as new files (``dataChange = false``), record ``read`` and
    the filter as the scan's reads, and build the plan: the part OPTIMIZE and REORG share."""
    removed = added = 0
    # On row-level-concurrency tables (deletion vectors enabled, partitioned or not) a
    # plain compaction records where each source's rows went, so concurrent DV deletes on
    # its inputs can be carried over instead of failing it; a Z-order permutes rows and
    # keeps the file-level rules ("can conflict only when ZORDER BY is used").
    mapped = not zorder and plan.deletion_vectors_enabled
    for bin_ in bins:
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
    built = plan.build()
    # The scan's reads, as PlanBuilder.scan records them: concurrent removes of any file
    # read fail this commit.
    return dataclasses.replace(
        built,
        partition_predicates=(*built.partition_predicates, part_pred if part_pred is not None else ex.TRUE),
        predicates=(*built.predicates, pred if pred is not None else ex.TRUE),
        read_files={**built.read_files, **read},
    )


def scan_files(plan: PlanBuilder, pred: ex.Expr | None) -> tuple[ex.Expr | None, pa.Table] | None:
    """(the partition-only part of ``pred`` or None, the live add rows it selects), as
    :meth:`PlanBuilder.scan` selects them but as columns; None without a snapshot."""
    snap = plan.snapshot
    if snap is None:
        return None
    parts = plan.metadata.partition_columns
    if pred is None or (plan.schema.equals(snap.schema) and parts == snap.partition_columns):
        return snap.select_files(pred)
    return prune_table(snap.live_files, pred, plan.schema, parts)


def _bin_files(files: pa.Table, bins: Sequence[np.ndarray]) -> list[list[AddFile]]:
    """The files of each bin as values: the only add rows that become objects."""
    if not bins:
        return []
    values = add_files(files.take(pa.array(np.concatenate(bins))))
    ends = np.cumsum([len(b) for b in bins])
    return [values[int(e) - len(b) : int(e)] for b, e in zip(bins, ends, strict=True)]


def read_files(files: pa.Table, partition_columns: Sequence[str]) -> dict[str, Mapping[str, str | None]]:
    """Each file read and its partition values (one mapping shared by a partition's files)."""
    if files.num_rows == 0:
        return {}
    codes = partition_codes(files, partition_columns)
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    values = files.column("partitionValues").take(pa.array(first)).to_pylist()
    shared = [dict(v or ()) for v in values]
    return dict(zip(files.column("path").to_pylist(), [shared[i] for i in inverse.tolist()], strict=True))


def _compact_mapped(plan: PlanBuilder, sources: Sequence[AddFile]) -> None:
    """Compact ``sources`` into exactly one file whose tags say where each source's rows went."""
    fs, root = plan.table.log.fs, plan.table.log.root
    partition_columns = plan.metadata.partition_columns
    parts: list[pa.Table] = []
    records: list[tuple[AddFile, FrozenBitMap64, int, int]] = []
    offset = 0
    hidden = plan.row_id_columns
    for f in sources:
        rows, positions, current, physical = read_file_positions(fs, root, f, plan.schema, partition_columns)
        if hidden is not None:  # row tracking: the rows keep their stable ids
            rows = FileScan(fs, root, f, plan.schema, partition_columns).tracked(rows, positions, hidden)
        records.append((f, current, physical, offset))
        parts.append(rows)
        offset += rows.num_rows
    data, hidden_names = file_rows(plan, pa.concat_tables(parts))
    # A bin holds one partition's files: one output file, in that partition.
    (add,) = write_data_files(
        fs,
        root,
        data,
        partition_columns=partition_columns,
        data_change=False,
        target_file_size=2**62,
        hidden=hidden_names,
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
    prefix = [0, *itertools.accumulate(f.size for f in small)]
    return [small[start:end] for start, end in _pack(prefix, 0, len(small), target)]


def bin_rows(
    files: pa.Table, partition_columns: Sequence[str], target: int, *, rewrite_all: bool
) -> list[np.ndarray]:
    """:func:`plan_bins` over every partition of ``files`` (add rows,
    :data:`~eventlog.log.filetable.ADD_SCHEMA`) on columns: the row numbers of each bin.

    As OPTIMIZE walks them: files in path order, partitions in order of their first file,
    each partition's small files by size (ties in path order) packed greedily, bins of one
    file dropped; when rewriting all, one bin per partition with its files in path order.
    """
    n = files.num_rows
    if n == 0:
        return []
    order = pc.sort_indices(files.column("path")).to_numpy()  # position -> row
    # Partitions numbered by first appearance in path order.
    _, first, inverse = np.unique(
        partition_codes(files, partition_columns)[order], return_index=True, return_inverse=True
    )
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    group = rank[inverse]
    positions = np.arange(n)
    if rewrite_all:
        pos = np.lexsort((positions, group))
        return [order[chunk] for chunk in np.split(pos, np.flatnonzero(np.diff(group[pos])) + 1)]
    sizes = pc.fill_null(files.column("size"), 0).to_numpy()[order].astype(np.int64)
    small = np.flatnonzero(sizes < target)
    pos = small[np.lexsort((small, sizes[small], group[small]))]
    cuts = np.flatnonzero(np.diff(group[pos])) + 1
    bins: list[np.ndarray] = []
    prefix = [0, *np.cumsum(sizes[pos]).tolist()]
    for begin, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(pos)], strict=True):
        bins += [order[pos[a:b]] for a, b in _pack(prefix, begin, end, target)]
    return bins


def _pack(prefix: Sequence[int], begin: int, end: int, target: int) -> list[tuple[int, int]]:
    """Greedy bins ``[a, b)`` over items ``begin..end-1`` (sorted by size, each below
    ``target``; ``prefix[i]``: the total size of the items before ``i``): an item joins the
    open bin while the bin's total stays within ``target``. Bins of one item are left out."""
    out = []
    a = begin
    while a < end:
        # The bin from ``a`` ends before the first item whose running total exceeds target.
        b = max(bisect.bisect_right(prefix, prefix[a] + target, a, end + 1) - 1, a + 1)
        if b - a > 1:
            out.append((a, b))
        a = b
    return out


def partition_codes(files: pa.Table, partition_columns: Sequence[str]) -> np.ndarray:
    """One integer per add row of ``files``, equal for rows of the same partition (told
    apart by the raw values of the partition columns, a missing key counting as null)."""
    codes = np.zeros(files.num_rows, dtype=np.int64)
    if files.num_rows == 0 or not partition_columns:
        return codes
    values = files.column("partitionValues")
    for name in partition_columns:
        # "last": a map holds each key once, and Arrow's "first" lookup is many times slower.
        raw = pc.map_lookup(values, pa.scalar(name), "last")
        raw = raw.combine_chunks() if isinstance(raw, pa.ChunkedArray) else raw
        encoded = raw.dictionary_encode(null_encoding="encode")
        column = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        # Densify after each column, so the combined codes never overflow.
        _, codes = np.unique(codes * (len(encoded.dictionary) + 1) + column, return_inverse=True)
    return codes.astype(np.int64)


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
