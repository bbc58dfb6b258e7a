"""DROP FEATURE against Delta Spark, both ways: Delta Spark reads the tables our
``Table.drop_feature`` downgraded (DESCRIBE DETAIL shows the feature gone) and we read
and write a table Delta Spark dropped a feature from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from tests.conftest import SCHEMA, rows
from tests.deltaspark.peer import delta_arrow, delta_detail, delta_history, same_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _agree(spark: Any, path: str) -> None:
    got, want = same_rows(Table.open(path).to_arrow(), delta_arrow(spark, path))
    assert got == want


@pytest.mark.parametrize(
    ("feature", "properties"),
    [
        ("deletionVectors", {"delta.enableDeletionVectors": "true"}),
        ("v2Checkpoint", {"delta.checkpointPolicy": "v2"}),
        ("inCommitTimestamp", {"delta.enableInCommitTimestamps": "true"}),
        ("rowTracking", {"delta.enableRowTracking": "true"}),
    ],
)
def test_delta_spark_reads_our_downgraded_table(
    spark: Any, tmp_path: Path, feature: str, properties: dict[str, str]
) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties=properties)
    t.append(rows([1, 2, 3]))
    t.delete("id = 2")
    t.checkpoint()
    t.drop_feature(feature)
    detail = delta_detail(spark, t.uri)
    assert feature not in detail["tableFeatures"]
    assert delta_history(spark, t.uri)[0][1] == "DROP FEATURE"
    _agree(spark, t.uri)
    spark.sql(f"INSERT INTO delta.`{t.uri}` SELECT * FROM delta.`{t.uri}` WHERE id = 1")
    _agree(spark, t.uri)


def test_we_read_a_table_delta_spark_dropped_deletion_vectors_from(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "d")
    table = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {table} (id BIGINT) USING delta TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    spark.sql(f"INSERT INTO {table} VALUES (1), (2), (3)")
    spark.sql(f"DELETE FROM {table} WHERE id = 2")
    spark.sql(f"ALTER TABLE {table} DROP FEATURE deletionVectors")
    t = Table.open(path)
    features = set(t.snapshot().protocol.writer_features or ())
    assert "deletionVectors" not in features and "checkpointProtection" in features
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 3]
    t.append(pa.table({"id": [4]}))
    _agree(spark, path)


def test_we_write_a_table_delta_spark_dropped_row_tracking_from(spark: Any, tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties={"delta.enableRowTracking": "true"})
    t.append(rows([1, 2, 3]))
    t.update("id = 2", {"x": "20"})
    spark.sql(f"ALTER TABLE delta.`{t.uri}` DROP FEATURE rowTracking")
    snap = t.refresh()
    assert "rowTracking" not in (snap.protocol.writer_features or ())
    assert all(a.base_row_id is None for a in snap.add_files)
    assert not {k for k in snap.metadata.configuration if "rowTracking" in k}
    t.append(rows([4]))
    assert all(a.base_row_id is None for a in t.refresh().add_files)
    _agree(spark, t.uri)
