"""Liquid clustering operations: ``ALTER TABLE ... CLUSTER BY`` (:func:`cluster_by`) and the
staging of a new table's clustering (:func:`stage_new_clustering`). The rules and the
``delta.clustering`` domain's form are in :mod:`eventlog.snapshot.clustering`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson
import pyarrow as pa

from eventlog.log.actions import Protocol
from eventlog.snapshot.clustering import (
    CLUSTERING_DOMAIN,
    check_cluster_by,
    clustered_protocol,
    clustering_columns,
    clustering_domain,
)
from eventlog.txn.plan import Plan, PlanBuilder

__all__ = ["cluster_by", "stage_new_clustering"]


def stage_new_clustering(
    plan: PlanBuilder,
    protocol: Protocol,
    schema: pa.Schema,
    parts: Sequence[str],
    columns: Sequence[str] | None,
    properties: Mapping[str, str],
) -> None:
    """Stage a new table's ``protocol``, with the clustering features and domain when
    ``columns`` names clustering columns (validated: :class:`~eventlog.errors.ClusteringError`)."""
    clustered = check_cluster_by(columns, schema, parts, properties)
    plan.update_protocol(clustered_protocol(protocol) if clustered else protocol)
    if clustered:
        plan.set_domain_metadata(CLUSTERING_DOMAIN, clustering_domain(schema, clustered).configuration)


def cluster_by(plan: PlanBuilder, columns: Sequence[str] | None) -> Plan:
    """Make the table clustered by ``columns`` (``ALTER TABLE CLUSTER BY``), or by none with
    ``None``/``[]`` (``CLUSTER BY NONE``: the feature stays, the domain lists no column).
    Metadata only: files are clustered by the next OPTIMIZE."""
    assert plan.snapshot is not None
    snapshot = plan.snapshot
    schema = plan.schema
    new = check_cluster_by(columns, schema, plan.metadata.partition_columns, plan.metadata.configuration)
    old = clustering_columns(snapshot.protocol, snapshot.domains, schema)
    plan.set_operation(
        "CLUSTER BY",
        {"oldClusteringColumns": ",".join(old), "newClusteringColumns": ",".join(new)},
        changes_data=False,
    )
    upgraded = clustered_protocol(snapshot.protocol)
    if upgraded != snapshot.protocol:
        plan.update_protocol(upgraded)
    if new:
        plan.set_domain_metadata(CLUSTERING_DOMAIN, clustering_domain(schema, new).configuration)
    else:
        empty = {"clusteringColumns": [], "domainName": CLUSTERING_DOMAIN}
        plan.set_domain_metadata(CLUSTERING_DOMAIN, orjson.dumps(empty).decode())
    return plan.build()
