"""Liquid clustering: ``Table.create(..., cluster_by=...)`` and ``Table.cluster_by`` write
the ``delta.clustering`` domain and the ``clustering`` + ``domainMetadata`` features as Delta
Spark does; bad clustering columns are refused with ClusteringError and nothing committed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from eventlog import ClusteringError, Table
from eventlog.files.column_mapping import physical_name
from eventlog.snapshot.protocol import features_of

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("tags", pa.list_(pa.string()))])


def _domain(t: Table) -> dict[str, object]:
    return dict(orjson.loads(t.refresh().domains["delta.clustering"].configuration))


def test_create_clustered_writes_domain_and_features(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), SCHEMA, cluster_by=["id", "v"]) as t:
        snapshot = t.refresh()
        assert snapshot.version == 0
        assert {"clustering", "domainMetadata"} <= features_of(snapshot.protocol)
        assert snapshot.protocol.min_writer_version == 7
        assert _domain(t) == {"clusteringColumns": [["id"], ["v"]], "domainName": "delta.clustering"}
        assert t.clustering_columns() == ["id", "v"]
        assert not any(k.startswith("delta.feature") for k in snapshot.metadata.configuration)
        t.append(pa.table({"id": [1], "v": ["a"], "tags": [["x"]]}, schema=SCHEMA))
        assert t.version == 1 and t.clustering_columns() == ["id", "v"]


def test_cluster_by_physical_names_under_column_mapping(tmp_path: Path) -> None:
    props = {"delta.columnMapping.mode": "name"}
    with Table.create(str(tmp_path / "t"), SCHEMA, properties=props, cluster_by=["v"]) as t:
        physical = physical_name(t.refresh().schema.field("v"))
        assert physical != "v"
        assert _domain(t)["clusteringColumns"] == [[physical]]
        assert t.clustering_columns() == ["v"]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"cluster_by": ["id"], "partition_by": ["v"]}, "partitioned"),
        ({"cluster_by": ["nope"]}, "unknown column"),
        ({"cluster_by": ["tags"]}, "type"),
        ({"cluster_by": ["id", "id"]}, "duplicate"),
    ],
)
def test_create_refuses_bad_clustering(tmp_path: Path, kwargs: dict[str, list[str]], reason: str) -> None:
    path = tmp_path / "t"
    with pytest.raises(ClusteringError) as info:
        Table.create(str(path), SCHEMA, **kwargs)  # type: ignore[arg-type]
    assert info.value.reason == reason
    assert not list((path / "_delta_log").glob("*.json")) if path.exists() else True


def test_cluster_by_later_changes_and_removes_columns(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), SCHEMA) as t:
        assert t.clustering_columns() == []
        assert "clustering" not in features_of(t.refresh().protocol)
        t.cluster_by(["v"])
        assert t.version == 1 and t.clustering_columns() == ["v"]
        assert {"clustering", "domainMetadata"} <= features_of(t.refresh().protocol)
        t.cluster_by(["id"])
        assert t.clustering_columns() == ["id"]
        t.cluster_by(None)
        assert t.version == 3 and t.clustering_columns() == []
        assert _domain(t)["clusteringColumns"] == []
        assert "clustering" in features_of(t.refresh().protocol)


def test_cluster_by_refuses_partitioned_table(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["v"]) as t:
        with pytest.raises(ClusteringError) as info:
            t.cluster_by(["id"])
        assert info.value.reason == "partitioned" and t.refresh().version == 0
