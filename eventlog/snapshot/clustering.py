"""Liquid clustering (Delta's ``clustering`` writer feature, PROTOCOL.md "Clustered Table").

A clustered table lists ``clustering`` (and ``domainMetadata``, which it requires) among its
writer features and keeps its clustering columns in the ``delta.clustering`` domain, as Delta
Spark writes it: ``{"clusteringColumns": [["id"], ["a", "b"]], "domainName": "delta.clustering"}``,
one list of path parts per column, physical names under column mapping. Plain writes keep
the domain as it is; only clustering OPTIMIZE (:mod:`eventlog.ops.clustering`) tags the files
it writes with ``clusteringProvider: "liquid"``. A table is never clustered and partitioned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson
import pyarrow as pa

from eventlog.errors import ClusteringError
from eventlog.files.column_mapping import physical_name
from eventlog.log.actions import DomainMetadata, Protocol
from eventlog.snapshot.protocol import features_of, with_features

__all__ = [
    "CLUSTERING_DOMAIN",
    "CLUSTERING_FEATURES",
    "CLUSTERING_PROVIDER",
    "MAX_CLUSTERING_COLUMNS",
    "check_cluster_by",
    "check_no_zorder",
    "clustering_columns",
    "clustering_domain",
    "clustered_protocol",
    "is_clustered",
]

CLUSTERING_DOMAIN = "delta.clustering"
CLUSTERING_PROVIDER = "liquid"  # Delta's ClusteredTableUtils.clusteringProvider
CLUSTERING_FEATURES = frozenset({"clustering", "domainMetadata"})
DEFAULT_INDEXED_COLUMNS = 32  # Delta's delta.dataSkippingNumIndexedCols default
MAX_CLUSTERING_COLUMNS = 4  # Delta's spark.databricks.delta.clusteredTable.numClusteringColumnsLimit


def _skipping_eligible(t: pa.DataType) -> bool:
    """Types with min/max statistics (Delta's SkippingEligibleDataType)."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    )


def _leaf_count(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return sum(_leaf_count(t.field(i).type) for i in range(t.num_fields))
    return 1


def _has_stats(schema: pa.Schema, index: int, configuration: Mapping[str, str]) -> bool:
    """Whether Delta writers keep statistics for top-level column ``index``: listed in
    ``delta.dataSkippingStatsColumns``, or among the first ``delta.dataSkippingNumIndexedCols``
    (32; -1: all) leaf columns."""
    listed = configuration.get("delta.dataSkippingStatsColumns")
    if listed is not None:
        return schema.field(index).name.lower() in {c.strip().strip("`").lower() for c in listed.split(",")}
    limit = int(configuration.get("delta.dataSkippingNumIndexedCols", DEFAULT_INDEXED_COLUMNS))
    return limit < 0 or sum(_leaf_count(schema.field(i).type) for i in range(index)) < limit


def check_cluster_by(
    columns: Sequence[str] | None,
    schema: pa.Schema,
    partition_by: Sequence[str],
    configuration: Mapping[str, str] | None = None,
) -> list[str]:
    """The clustering columns ``columns`` (top-level names), validated against ``schema``:
    :class:`~eventlog.errors.ClusteringError` for a partitioned table, an unknown, repeated
    or ineligible column, one Delta writers keep no statistics for (the table properties
    ``configuration`` say which), or more than :data:`MAX_CLUSTERING_COLUMNS`."""
    cols = list(columns or ())
    if not cols:
        return []
    if partition_by:
        raise ClusteringError(
            f"a table cannot be both clustered by {cols} and partitioned by {list(partition_by)}",
            columns=cols,
            reason="partitioned",
        )
    if len(cols) > MAX_CLUSTERING_COLUMNS:
        raise ClusteringError(
            f"{len(cols)} clustering columns: Delta allows at most {MAX_CLUSTERING_COLUMNS}",
            columns=cols,
            reason="too many",
        )
    if len(set(cols)) != len(cols):
        raise ClusteringError(f"clustering columns {cols} repeat a column", columns=cols, reason="duplicate")
    for name in cols:
        index = schema.get_field_index(name)
        if index < 0:
            raise ClusteringError(
                f"clustering column {name!r} is not a column of {schema.names}",
                columns=cols,
                reason="unknown column",
            )
        field = schema.field(index)
        if not _skipping_eligible(field.type):
            raise ClusteringError(
                f"clustering column {name!r} has type {field.type}, which has no min/max statistics",
                columns=cols,
                reason="type",
            )
        if not _has_stats(schema, index, configuration or {}):
            raise ClusteringError(
                f"clustering column {name!r} is beyond the columns with statistics "
                "(delta.dataSkippingNumIndexedCols / delta.dataSkippingStatsColumns)",
                columns=cols,
                reason="no statistics",
            )
    return cols


def clustering_domain(schema: pa.Schema, columns: Sequence[str]) -> DomainMetadata:
    """The ``delta.clustering`` domain for ``columns`` of ``schema`` (physical names)."""
    physical = [[physical_name(schema.field(name))] for name in columns]
    configuration = {"clusteringColumns": physical, "domainName": CLUSTERING_DOMAIN}
    return DomainMetadata(CLUSTERING_DOMAIN, orjson.dumps(configuration).decode())


def is_clustered(protocol: Protocol) -> bool:
    """Whether the protocol supports the ``clustering`` feature (a clustered table)."""
    return "clustering" in features_of(protocol)


def clustering_columns(
    protocol: Protocol, domains: Mapping[str, DomainMetadata], schema: pa.Schema
) -> list[str]:
    """The logical names of a clustered table's top-level clustering columns (empty when the
    table is not clustered or has none); nested ones are given as dotted paths."""
    domain = domains.get(CLUSTERING_DOMAIN)
    if not is_clustered(protocol) or domain is None or domain.removed:
        return []
    by_physical = {physical_name(f): f.name for f in schema}
    out = []
    for parts in orjson.loads(domain.configuration or "{}").get("clusteringColumns") or []:
        path = [parts] if isinstance(parts, str) else list(parts)
        first = by_physical.get(path[0], path[0])
        out.append(".".join([first, *path[1:]]))
    return out


def check_no_zorder(clustering: Sequence[str], zorder: Sequence[str]) -> None:
    """OPTIMIZE ZORDER BY on a table with clustering columns: ClusteringError, as in Delta
    (DELTA_CLUSTERING_WITH_ZORDER_BY); OPTIMIZE alone clusters it."""
    if clustering and zorder:
        raise ClusteringError(
            f"ZORDER BY {list(zorder)} on a table clustered by {list(clustering)}: OPTIMIZE clusters it",
            columns=list(clustering),
            reason="zorder",
        )


def clustered_protocol(protocol: Protocol) -> Protocol:
    """``protocol`` with the ``clustering`` and ``domainMetadata`` writer features."""
    return with_features(protocol, set(CLUSTERING_FEATURES))
