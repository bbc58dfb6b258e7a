"""Liquid clustering with Delta Spark: we append, delete and update on its clustered tables
(the ``delta.clustering`` domain kept as it was), and it reads the result and still clusters
it with OPTIMIZE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from eventlog import Table
from tests.deltaspark.peer import delta_arrow, delta_detail

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _sql(spark: Any, statement: str, path: str) -> list[Any]:
    return list(spark.sql(statement.format(t=f"delta.`{path}`")).collect())


def _clustering_domain(path: str) -> dict[str, Any]:
    with Table.open(path) as t:
        domain = t.refresh().domains["delta.clustering"]
    return dict(orjson.loads(domain.configuration))


def test_we_write_to_delta_sparks_clustered_table_and_it_optimizes_it(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _sql(spark, "CREATE TABLE {t} (id BIGINT, v STRING) USING delta CLUSTER BY (id)", path)
    _sql(spark, "INSERT INTO {t} VALUES (3, 'c'), (1, 'a')", path)
    before = _clustering_domain(path)
    assert before["clusteringColumns"] == [["id"]]
    with Table.open(path) as t:
        t.append(pa.table({"id": pa.array([5, 4], pa.int64()), "v": ["e", "d"]}))
        t.delete("id = 3")
        t.update("id = 1", {"v": "'A'"})
        version = t.version
    assert _clustering_domain(path) == before
    theirs = delta_arrow(spark, path).sort_by("id").to_pylist()
    assert theirs == [{"id": 1, "v": "A"}, {"id": 4, "v": "d"}, {"id": 5, "v": "e"}]
    assert "clustering" in delta_detail(spark, path)["tableFeatures"]
    _sql(spark, "OPTIMIZE {t}", path)
    detail = _sql(spark, "DESCRIBE DETAIL {t}", path)[0]
    assert list(detail.clusteringColumns) == ["id"]
    with Table.open(path) as t:
        assert t.refresh().version > version
        files = t.refresh().add_files
        assert files and all(f.clustering_provider == "liquid" for f in files)
        assert t.to_arrow().sort_by("id").column("id").to_pylist() == [1, 4, 5]


@pytest.mark.parametrize("mapping", ["none", "name"])
def test_delta_spark_reads_our_clustered_table_and_its_clustering_columns(
    spark: Any, tmp_path: Path, mapping: str
) -> None:
    path = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    props = {"delta.columnMapping.mode": mapping}
    with Table.create(path, schema, properties=props, cluster_by=["v"]) as t:
        t.append(pa.table({"id": [2, 1], "v": ["b", "a"]}, schema=schema))
    detail = _sql(spark, "DESCRIBE DETAIL {t}", path)[0]
    assert list(detail.clusteringColumns) == ["v"]
    assert {"clustering", "domainMetadata"} <= set(detail.tableFeatures)
    _sql(spark, "INSERT INTO {t} VALUES (3, 'c')", path)
    _sql(spark, "OPTIMIZE {t}", path)
    assert delta_arrow(spark, path).sort_by("id").column("v").to_pylist() == ["a", "b", "c"]
    with Table.open(path) as t:
        assert t.clustering_columns() == ["v"]
        assert all(f.clustering_provider == "liquid" for f in t.refresh().add_files)
        t.cluster_by(["id"])
        t.append(pa.table({"id": [4], "v": ["d"]}, schema=schema))
        assert t.optimize().metrics["numRemovedFiles"] != "0"  # our clustering OPTIMIZE
        assert all(f.clustering_provider == "liquid" for f in t.refresh().add_files)
    assert list(_sql(spark, "DESCRIBE DETAIL {t}", path)[0].clusteringColumns) == ["id"]
    assert delta_arrow(spark, path).sort_by("id").column("id").to_pylist() == [1, 2, 3, 4]
    _sql(spark, "INSERT INTO {t} VALUES (5, 'e')", path)
    _sql(spark, "OPTIMIZE {t}", path)  # and Delta Spark clusters after it
    assert delta_arrow(spark, path).num_rows == 5
