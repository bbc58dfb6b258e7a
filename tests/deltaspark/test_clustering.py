"""Liquid clustering with Delta Spark: we append, delete and update on its clustered tables
(the ``delta.clustering`` domain kept as it was), and it reads the result and still clusters
it with OPTIMIZE; our Spark OPTIMIZE (:mod:`spark_adapter.ops.optimize_clustered`) clusters
its tables, and it reads and re-clusters ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.errors import ClusteringError
from eventlog.ops.optimize_clustered import ZCUBE_ID_TAG, ZCUBE_ZORDER_BY_TAG
from spark_adapter.table import EventlogTable
from tests.deltaspark.peer import delta_arrow, delta_detail, same_rows

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


def _zcubes(path: str, columns: list[str]) -> set[str]:
    """Every live file is liquid-clustered by ``columns`` (Delta's ZCube tags); the ZCube ids."""
    with Table.open(path) as t:
        files = t.refresh().add_files
    assert files and {f.clustering_provider for f in files} == {"liquid"}
    assert {(f.tags or {}).get(ZCUBE_ZORDER_BY_TAG) for f in files} == {orjson.dumps(columns).decode()}
    return {(f.tags or {})[ZCUBE_ID_TAG] for f in files}


def test_delta_spark_reads_and_reclusters_what_our_spark_optimize_clustered(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("k", pa.int64())])
    with Table.create(path, schema, cluster_by=["k"]) as t:
        for start in (0, 100, 200):  # three unclustered files, keys all over the range
            t.append(
                pa.table(
                    {"id": range(start, start + 50), "k": [(i * 37) % 101 for i in range(50)]}, schema=schema
                )
            )
    result = EventlogTable.forPath(spark, path).optimize().executeCompaction()
    assert (result.version, result.metrics["numRemovedFiles"]) == (4, "3")
    ours_zcube = _zcubes(path, ["k"])
    with Table.open(path) as t:
        ours = t.to_arrow()
    mine, theirs = same_rows(ours, delta_arrow(spark, path))
    assert mine == theirs and len(mine) == 150
    assert list(_sql(spark, "DESCRIBE DETAIL {t}", path)[0].clusteringColumns) == ["k"]
    _sql(spark, "INSERT INTO {t} VALUES (1000, 5), (1001, 95)", path)
    _sql(spark, "OPTIMIZE {t}", path)  # Delta Spark's clustering takes our ZCube in (same columns)
    assert _zcubes(path, ["k"]).isdisjoint(ours_zcube)  # Delta tags as we do: '["k"]'
    with Table.open(path) as t:
        assert t.version == 6
        assert t.history(1)[0]["operation"] == "OPTIMIZE"
        ids = sorted(t.to_arrow().column("id").to_pylist())
    assert ids == sorted([*ours.column("id").to_pylist(), 1000, 1001])
    assert delta_arrow(spark, path).num_rows == 152


def test_our_spark_optimize_clusters_delta_sparks_clustered_table(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _sql(spark, "CREATE TABLE {t} (id BIGINT, v STRING) USING delta CLUSTER BY (id)", path)
    for values in ("(30, 'c'), (1, 'a')", "(20, 'b'), (4, 'd')", "(10, 'e')"):
        _sql(spark, f"INSERT INTO {{t}} VALUES {values}", path)
    before = delta_arrow(spark, path).sort_by("id").to_pylist()
    ours = EventlogTable.forPath(spark, path)
    assert ours.clusteringColumns() == ["id"]
    with pytest.raises(ClusteringError) as refused:
        ours.optimize().executeZOrderBy("v")
    assert refused.value.reason == "zorder"
    with Table.open(path) as t:
        version, files = t.version, len(t.refresh().add_files)
    assert files >= 3  # one or more per INSERT, none clustered yet
    result = ours.optimize().executeCompaction()
    assert (result.version, result.metrics["numRemovedFiles"]) == (version + 1, str(files))
    assert len(_zcubes(path, ["id"])) == 1
    assert delta_arrow(spark, path).sort_by("id").to_pylist() == before
    detail = _sql(spark, "DESCRIBE DETAIL {t}", path)[0]
    assert list(detail.clusteringColumns) == ["id"]
    history = _sql(spark, "DESCRIBE HISTORY {t}", path)[0]
    assert (history.version, history.operation) == (version + 1, "OPTIMIZE")
    _sql(spark, "INSERT INTO {t} VALUES (5, 'f')", path)
    _sql(spark, "OPTIMIZE {t}", path)  # and Delta Spark keeps clustering it
    assert [r["id"] for r in delta_arrow(spark, path).sort_by("id").to_pylist()] == [1, 4, 5, 10, 20, 30]
    _zcubes(path, ["id"])
