"""OPTIMIZE on a clustered table (liquid clustering): the files not yet clustered, with the
clustered ones still below the target size, are rewritten in Z-order over the clustering
columns (:func:`eventlog.ops.optimize.zorder_permutation`) and tagged as Delta Spark's
clustering OPTIMIZE tags them (:func:`clustered_adds`): ``clusteringProvider: "liquid"`` and
the ZCube tags ``ZCUBE_ID`` (one per OPTIMIZE: its files are one ZCube) and
``ZCUBE_ZORDER_BY`` (the clustering columns, a JSON list).

Incremental, after Delta's basic rules: only files with no ``clusteringProvider`` or
``"liquid"`` are candidates (another implementation's files are left alone); an OPTIMIZE
with no unclustered file to take in rewrites nothing; clustered files of at least the
target size (Delta's stable ZCubes) stay as they are. :func:`optimize_table` picks this or
the plain bin-packing OPTIMIZE by whether the table has clustering columns.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.files import column_mapping as cm
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files
from eventlog.ops.common import table_target_size
from eventlog.ops.optimize import optimize, partition_predicate, read_files, rewrite_bins, scan_files
from eventlog.snapshot.clustering import CLUSTERING_PROVIDER, check_no_zorder, clustering_columns
from eventlog.txn.plan import Plan, PlanBuilder

__all__ = [
    "ZCUBE_ID_TAG",
    "ZCUBE_ZORDER_BY_TAG",
    "begin_clustering",
    "clustered_adds",
    "clustering_candidates",
    "optimize_clustered",
    "optimize_table",
]

ZCUBE_ID_TAG = "ZCUBE_ID"  # Delta's AddFile.Tags.ZCUBE_ID: the clustering run (ZCube) a file is from
ZCUBE_ZORDER_BY_TAG = "ZCUBE_ZORDER_BY"  # Delta's AddFile.Tags.ZCUBE_ZORDER_BY: its columns, as JSON


def optimize_table(
    plan: PlanBuilder,
    *,
    zorder_by: Sequence[str] | None = None,
    partition_filter: str | None = None,
    target_size: int | None = None,
) -> Plan:
    """OPTIMIZE: clustering on a clustered table with clustering columns, else bin packing
    (optionally Z-ordered). ZORDER BY on a clustered table is refused (ClusteringError), as
    Delta refuses it."""
    snap = plan.snapshot
    columns = clustering_columns(snap.protocol, snap.domains, plan.schema) if snap is not None else []
    if not columns:
        return optimize(plan, zorder_by=zorder_by, partition_filter=partition_filter, target_size=target_size)
    check_no_zorder(columns, list(zorder_by or []))
    return optimize_clustered(plan, columns, partition_filter=partition_filter, target_size=target_size)


def clustering_candidates(files: pa.Table, target: int) -> np.ndarray:
    """Row numbers of the add rows (ADD_SCHEMA) a clustering OPTIMIZE rewrites: none when no
    file is unclustered, else the unclustered ones and the liquid-clustered ones below
    ``target`` bytes."""
    provider = files.column("clusteringProvider")
    unclustered = pc.is_null(provider).to_numpy(zero_copy_only=False)
    if not unclustered.any():
        return np.zeros(0, dtype=np.int64)
    liquid = pc.fill_null(pc.equal(provider, CLUSTERING_PROVIDER), False).to_numpy(zero_copy_only=False)
    small = (pc.fill_null(files.column("size"), 0).to_numpy() < target).astype(bool)
    order = pc.sort_indices(files.column("path")).to_numpy()
    chosen = unclustered | (liquid & small)
    return np.asarray(order[chosen[order]], dtype=np.int64)


def clustered_adds(adds: Iterable[AddFile], columns: Sequence[str]) -> tuple[AddFile, ...]:
    """``adds``, written by one clustering OPTIMIZE, tagged as Delta's ClusteringStrategy tags
    a ZCube's files: ``clusteringProvider`` ``"liquid"``, one new ``ZCUBE_ID`` shared by all,
    ``ZCUBE_ZORDER_BY`` the clustering columns (Delta skips liquid files whose
    ``ZCUBE_ZORDER_BY`` differs from the table's clustering columns)."""
    zcube = {ZCUBE_ID_TAG: str(uuid.uuid4()), ZCUBE_ZORDER_BY_TAG: orjson.dumps(list(columns)).decode()}
    return tuple(
        dataclasses.replace(a, clustering_provider=CLUSTERING_PROVIDER, tags={**(a.tags or {}), **zcube})
        for a in adds
    )


def begin_clustering(
    plan: PlanBuilder, columns: Sequence[str], partition_filter: str | None
) -> ex.Expr | None:
    """Validate a clustering OPTIMIZE's filter and name the operation; the parsed filter.
    Shared with the Spark adapter, so both record the same operation."""
    if partition_filter is not None:
        ex.check_sql_text(partition_filter, "partition_filter")
    plan.set_operation(
        "OPTIMIZE",
        {
            "predicate": [partition_filter] if partition_filter else [],
            "clusterBy": list(columns),
            "zOrderBy": [],
        },
        changes_data=False,
    )
    return partition_predicate(plan, partition_filter, "OPTIMIZE")


def optimize_clustered(
    plan: PlanBuilder, columns: Sequence[str], *, partition_filter: str | None, target_size: int | None
) -> Plan:
    """Cluster the table's candidate files (:func:`clustering_candidates`) by ``columns``."""
    pred = begin_clustering(plan, columns, partition_filter)
    scanned = scan_files(plan, pred)
    if scanned is None:
        plan.add_metrics(numRemovedFiles=0, numAddedFiles=0)
        return plan.build()
    part_pred, files = scanned
    rows = clustering_candidates(files, target_size or table_target_size(plan))
    keys = cm.partition_keys(plan.schema, plan.metadata.partition_columns)
    bins = [add_files(files.take(pa.array(rows)))] if len(rows) else []
    built = rewrite_bins(plan, bins, list(columns), pred, part_pred, read_files(files, keys))
    # The rewritten files are clustered: tag them, as Delta's clustering OPTIMIZE does.
    return dataclasses.replace(built, adds=clustered_adds(built.adds, columns))
