"""REORG TABLE ... APPLY (PURGE): rewrite the files that carry deletion vectors, so the rows
those vectors delete are physically gone.

As Delta's ``DeltaReorgTableCommand`` runs it (an OPTIMIZE with a file filter): the files
with deleted rows are grouped per partition and packed greedily, in path order, into bins
of up to the target file size; every bin is rewritten, a bin of one file included. Each
bin becomes new files without deletion vectors; the old files are removed with theirs.
Every action has ``dataChange = false`` and the commit is recorded as ``REORG`` with
``{"predicate": [...], "applyPurge": true}``, so it has OPTIMIZE's isolation semantics
(:func:`eventlog.ops.optimize.rewrite_bins`): it survives concurrent appends, and on
row-level-concurrency tables concurrent deletes and updates of its files too.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.files import column_mapping as cm
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files
from eventlog.ops.common import table_target_size
from eventlog.ops.optimize import partition_codes, partition_predicate, read_files, rewrite_bins, scan_files
from eventlog.txn.plan import Plan, PlanBuilder

__all__ = ["REORG", "reorg_purge"]

REORG = "REORG"  # Delta's DeltaOperations.REORG_OPERATION_NAME


def begin_reorg(plan: PlanBuilder, where: str | None) -> ex.Expr | None:
    """Validate a REORG PURGE's filter and name the operation; the parsed filter or None."""
    if where is not None:
        ex.check_sql_text(where, "where")
    plan.set_operation(REORG, {"predicate": [where] if where else [], "applyPurge": True}, changes_data=False)
    return partition_predicate(plan, where, REORG)


def reorg_purge(plan: PlanBuilder, *, where: str | None = None, target_size: int | None = None) -> Plan:
    """Rewrite every live file with deleted rows (in the partitions ``where`` selects).

    The plan reads the rewritten files (a concurrent remove of one conflicts, unless
    row-level resolution reconciles it) and the filter's partitions.
    """
    pred = begin_reorg(plan, where)
    scanned = scan_files(plan, pred)
    if scanned is None:  # no snapshot yet: nothing to purge
        plan.add_metrics(numRemovedFiles=0, numAddedFiles=0, numDeletionVectorsRemoved=0)
        return plan.build()
    part_pred, files = scanned
    files = files.filter(pc.is_valid(files.column("deletionVector")))
    keys = cm.partition_keys(plan.schema, plan.metadata.partition_columns)
    bins = purge_bins(files, keys, target_size or table_target_size(plan))
    plan.add_metrics(numDeletionVectorsRemoved=files.num_rows)
    return rewrite_bins(plan, bins, (), pred, part_pred, read_files(files, keys))


def purge_bins(files: pa.Table, partition_columns: list[str], target: int) -> list[list[AddFile]]:
    """Delta's REORG bins over ``files`` (add rows): per partition (in order of their first
    file by path), files in path order join the open bin until it would exceed ``target``
    bytes; every bin is kept, one file or more."""
    if files.num_rows == 0:
        return []
    order = pc.sort_indices(files.column("path")).to_numpy()
    codes = partition_codes(files, partition_columns)[order]
    sizes = pc.fill_null(files.column("size"), 0).to_numpy()[order]
    values = add_files(files.take(pa.array(order)))
    partitions: dict[int, list[list[AddFile]]] = {}
    totals: dict[int, int] = {}
    for code, size, add in zip(codes.tolist(), sizes.tolist(), values, strict=True):
        bins = partitions.setdefault(code, [[]])
        if bins[-1] and totals[code] + size > target:
            bins.append([])
            totals[code] = 0
        bins[-1].append(add)
        totals[code] = totals.get(code, 0) + size
    return [b for bins in partitions.values() for b in bins]
