"""We read the tables Delta Spark writes, one table feature at a time.

The rule, for every feature and every version of its table: our reader returns exactly Delta
Spark's rows and schema, or refuses the table with ``UnsupportedProtocolError`` naming the
feature (naming only features the table has, when it has several). Never a wrong answer.
Writes follow the same rule: our append either lands and Delta Spark reads it back, or is
refused naming the feature.

Each outcome is also recorded (``feature_results``) into .cache/deltaspark-report/features.json
at the end of the run: the source of the README's "feature, read, write" table.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException, UnsupportedOperationException

from eventlog import Table
from eventlog.errors import UnsupportedProtocolError
from eventlog.files.identity import identity_columns
from eventlog.snapshot.protocol import writer_missing
from tests.deltaspark.peer import delta_arrow, delta_detail, delta_history, same_rows, schema_shape

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


@dataclass(frozen=True)
class Recipe:
    """A table Delta Spark writes with ``feature`` (a table feature's protocol name; None for a
    log or data layout that is no feature). ``statements`` are SQL on ``{t}`` (the table);
    ``CHECKPOINT`` makes Delta Spark write a checkpoint. ``evidence``: strings that must occur
    in the log's JSON or the table's file names, proof that the recipe used the feature."""

    id: str
    feature: str | None
    statements: tuple[str, ...]
    evidence: tuple[str, ...]
    conf: dict[str, str] = field(default_factory=dict)
    # The features a refusal may name, when the table has more than ``feature``.
    refusable: tuple[str, ...] = ()

    def names_its_features(self, named: list[str]) -> bool:
        """A refusal names features of this table: ``feature``, or some of ``refusable``."""
        allowed = set(self.refusable) or ({self.feature} if self.feature else set())
        return bool(named) and set(named) <= allowed


RECIPES = [
    Recipe(
        "deletionVectors",
        "deletionVectors",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta"
            " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '2')",
            "INSERT INTO {t} SELECT id, CAST(id AS STRING) FROM range(20)",
            "DELETE FROM {t} WHERE id % 3 = 0",  # 2: checkpoint with a DV
            "UPDATE {t} SET v = 'u' WHERE id = 1",
            "DELETE FROM {t} WHERE id = 4",
        ),
        ('"deletionVector":{', ".checkpoint.parquet"),
    ),
    Recipe(
        "columnMapping-name",
        "columnMapping",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING, w INT) USING delta"
            " TBLPROPERTIES ('delta.columnMapping.mode' = 'name')",
            "INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', 2)",
            "ALTER TABLE {t} RENAME COLUMN v TO v2",
            "ALTER TABLE {t} DROP COLUMN w",
            "INSERT INTO {t} VALUES (3, 'c')",
        ),
        ("delta.columnMapping.physicalName",),
    ),
    Recipe(
        "columnMapping-id",
        "columnMapping",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta TBLPROPERTIES"
            " ('delta.columnMapping.mode' = 'id')",
            "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
            "ALTER TABLE {t} RENAME COLUMN v TO v2",
            "INSERT INTO {t} VALUES (3, 'c')",
        ),
        ("delta.columnMapping.id",),
    ),
    Recipe(
        "changeDataFeed",
        "changeDataFeed",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta TBLPROPERTIES"
            " ('delta.enableChangeDataFeed' = 'true')",
            "INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
            "UPDATE {t} SET v = 'z' WHERE id = 2",
            "DELETE FROM {t} WHERE id = 3",
        ),
        ('"cdc":', "_change_data"),
    ),
    Recipe(
        "checkConstraints",
        "checkConstraints",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta",
            "ALTER TABLE {t} ADD CONSTRAINT pos CHECK (id > 0)",
            "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
        ),
        ("delta.constraints.pos",),
    ),
    Recipe(
        "generatedColumns",
        "generatedColumns",
        (
            "CREATE TABLE {t} (id BIGINT, d BIGINT GENERATED ALWAYS AS (id * 2)) USING delta",
            "INSERT INTO {t} (id) VALUES (1), (2)",
        ),
        ("delta.generationExpression",),
    ),
    Recipe(
        "identityColumns",
        "identityColumns",
        (
            "CREATE TABLE {t} (k BIGINT GENERATED ALWAYS AS IDENTITY, v STRING) USING delta",
            "INSERT INTO {t} (v) VALUES ('a'), ('b')",
            "INSERT INTO {t} (v) VALUES ('c')",
        ),
        ("delta.identity.highWaterMark",),
    ),
    Recipe(
        "rowTracking",
        "rowTracking",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta TBLPROPERTIES"
            " ('delta.enableRowTracking' = 'true')",
            "INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
            "UPDATE {t} SET v = 'z' WHERE id = 2",
            "MERGE INTO {t} t USING (SELECT 4L AS id, 'd' AS v) s ON t.id = s.id WHEN NOT MATCHED"
            " THEN INSERT *",
        ),
        ('"baseRowId"', '"domain":"delta.rowTracking"'),
    ),
    Recipe(
        "inCommitTimestamp",
        "inCommitTimestamp",
        (
            "CREATE TABLE {t} (id BIGINT) USING delta TBLPROPERTIES"
            " ('delta.enableInCommitTimestamps' = 'true')",
            "INSERT INTO {t} VALUES (1), (2)",
            "DELETE FROM {t} WHERE id = 1",
        ),
        ('"inCommitTimestamp"',),
    ),
    Recipe(
        "clustering",
        "clustering",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta CLUSTER BY (id)",
            "INSERT INTO {t} VALUES (3, 'c'), (1, 'a')",
            "INSERT INTO {t} VALUES (2, 'b')",
            "OPTIMIZE {t}",
        ),
        ('"domain":"delta.clustering"', '"clusteringProvider":"liquid"'),
    ),
    Recipe(
        "typeWidening",
        "typeWidening",
        (
            "CREATE TABLE {t} (id INT, s SMALLINT) USING delta TBLPROPERTIES"
            " ('delta.enableTypeWidening' = 'true')",
            "INSERT INTO {t} VALUES (1, 1)",
            "ALTER TABLE {t} ALTER COLUMN s TYPE INT",
            "ALTER TABLE {t} ALTER COLUMN id TYPE BIGINT",
            "INSERT INTO {t} VALUES (3000000000, 100000)",
        ),
        ("delta.typeChanges",),
    ),
    Recipe(
        "v2Checkpoint",
        "v2Checkpoint",
        (
            "CREATE TABLE {t} (id BIGINT) USING delta TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')",
            "INSERT INTO {t} VALUES (1)",
            "INSERT INTO {t} VALUES (2)",
            "CHECKPOINT",
            "DELETE FROM {t} WHERE id = 1",
        ),
        ("_sidecars", '"checkpointMetadata"'),
    ),
    Recipe(
        "vacuumProtocolCheck",
        "vacuumProtocolCheck",
        (
            "CREATE TABLE {t} (id BIGINT) USING delta TBLPROPERTIES"
            " ('delta.feature.vacuumProtocolCheck' = 'supported')",
            "INSERT INTO {t} VALUES (1)",
        ),
        ("vacuumProtocolCheck",),
    ),
    Recipe(
        "checkpointProtection",
        "checkpointProtection",
        (
            "CREATE TABLE {t} (id BIGINT) USING delta"
            " TBLPROPERTIES ('delta.feature.checkpointProtection' = 'supported')",
            "INSERT INTO {t} VALUES (1)",
        ),
        ("checkpointProtection",),
    ),
    Recipe(
        "domainMetadata",
        "domainMetadata",
        (
            "CREATE TABLE {t} (id BIGINT) USING delta TBLPROPERTIES ('delta.feature.domainMetadata'"
            " = 'supported')",
            "INSERT INTO {t} VALUES (1)",
        ),
        ("domainMetadata",),
    ),
    Recipe(
        "variantType",
        "variantType",
        (
            "CREATE TABLE {t} (id BIGINT, j VARIANT) USING delta",
            """INSERT INTO {t} SELECT 1, parse_json('{{"a": 1, "b": [true, null]}}')""",
        ),
        ('\\"variant\\"',),
    ),
    Recipe(
        "timestampNtz",
        "timestampNtz",
        (
            "CREATE TABLE {t} (id BIGINT, ts TIMESTAMP_NTZ, p TIMESTAMP_NTZ) USING delta PARTITIONED BY (p)",
            "INSERT INTO {t} VALUES (1, TIMESTAMP_NTZ'2024-01-02 03:04:05.123456',"
            " TIMESTAMP_NTZ'2024-01-01 00:00:01'),"
            " (2, NULL, NULL)",
        ),
        ("timestamp_ntz",),
    ),
    Recipe(
        "combined-dv-rowTracking-cdf-ict",
        "deletionVectors",
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta TBLPROPERTIES ("
            "'delta.enableDeletionVectors' = 'true', 'delta.enableRowTracking' = 'true',"
            " 'delta.enableChangeDataFeed' = 'true', 'delta.enableInCommitTimestamps' = 'true')",
            "INSERT INTO {t} SELECT id, CAST(id AS STRING) FROM range(10)",
            "UPDATE {t} SET v = 'u' WHERE id < 3",
            "DELETE FROM {t} WHERE id = 5",
            "CHECKPOINT",
            "OPTIMIZE {t}",
        ),
        ('"deletionVector":{', '"baseRowId"', '"cdc":', '"inCommitTimestamp"'),
        refusable=("deletionVectors", "rowTracking", "changeDataFeed", "inCommitTimestamp", "domainMetadata"),
    ),
    # Log and data layouts that are no table feature.
    Recipe(
        "maintenanceAndSchemaChanges",
        None,
        (
            "CREATE TABLE {t} (id BIGINT, v STRING, d STRING) USING delta PARTITIONED BY (d)",
            "INSERT INTO {t} VALUES (1, 'a', 'x'), (2, 'b', 'y')",
            "INSERT INTO {t} VALUES (3, 'c', 'x')",
            "ALTER TABLE {t} ADD COLUMNS (w INT)",
            "INSERT INTO {t} VALUES (4, 'd', 'y', 40)",
            "OPTIMIZE {t} ZORDER BY (id)",
            "DELETE FROM {t} WHERE id = 1",
            "RESTORE TABLE {t} TO VERSION AS OF 4",
            "UPDATE {t} SET w = 0 WHERE w IS NULL",
            "CHECKPOINT",
            "REPLACE TABLE {t} (id BIGINT, z DOUBLE) USING delta",
            "INSERT INTO {t} VALUES (9, 0.5)",
        ),
        ('"operation":"RESTORE"', '"operation":"OPTIMIZE"', '"operation":"REPLACE TABLE"'),
    ),
    Recipe(
        "multiPartCheckpoint",
        None,
        (
            "CREATE TABLE {t} (id BIGINT, v STRING) USING delta",
            "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
            "INSERT INTO {t} VALUES (3, 'c')",
            "CHECKPOINT",
            "INSERT INTO {t} VALUES (4, 'd')",
        ),
        (".checkpoint.0000000001.0000000",),  # part 1 of N
        conf={"spark.databricks.delta.checkpoint.partSize": "1"},
    ),
    Recipe(
        "partitionValues",
        None,
        (
            "CREATE TABLE {t} (id BIGINT, p STRING, d DATE, ts TIMESTAMP) USING delta PARTITIONED BY"
            " (p, d, ts)",
            "INSERT INTO {t} VALUES (1, 'a b', DATE'2024-01-01', TIMESTAMP'2024-01-01 01:02:03.5'),"
            " (2, 'x/y=z%', NULL, NULL), (3, NULL, DATE'2024-02-29', TIMESTAMP'1970-01-01 00:00:00'),"
            " (4, 'ünï', DATE'2024-01-01', TIMESTAMP'2024-01-01 01:02:03.5'), (5, '',"
            " DATE'2024-01-01', NULL)",
            "DELETE FROM {t} WHERE p = 'a b'",
        ),
        ("__HIVE_DEFAULT_PARTITION__",),
    ),
    Recipe(
        "types",
        None,
        (
            "CREATE TABLE {t} (b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT, i64 BIGINT, f FLOAT, d DOUBLE,"
            " dec DECIMAL(10, 2), s STRING, bin BINARY, dt DATE, ts TIMESTAMP,"
            " st STRUCT<a: INT, b: STRING>, arr ARRAY<BIGINT>, m MAP<STRING, INT>) USING delta",
            "INSERT INTO {t} VALUES (true, 1, 2, 3, 4, 1.5, 2.5, 12.34, 'x', X'0102', DATE'2024-01-02',"
            " TIMESTAMP'2024-01-02 03:04:05.678901', named_struct('a', 1, 'b', 'q'), array(1, 2,"
            " NULL), map('k', 1)),"
            " (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
        ),
        (),
    ),
]

# Where the rule does not hold: (kind, recipe id) -> reason; the test must fail (strict xfail).
# Empty since the feature registry (eventlog.snapshot.features) refuses by name every feature a
# write cannot honour and names columnMapping for reader version 2.
KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {}


def _params(kind: str) -> list[Any]:
    out = []
    for recipe in RECIPES:
        reason = KNOWN_DIFFERENCES.get((kind, recipe.id))
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason else []
        out.append(pytest.param(recipe, id=recipe.id, marks=marks))
    return out


def _log_text(path: str) -> str:
    """The JSON of every commit and V2 checkpoint, and every file name of the table."""
    parts = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            parts.append(os.path.join(root, name))
            if root.endswith("_delta_log") and name.endswith(".json") and not name.startswith("."):
                parts.append(Path(root, name).read_text())
    return "\n".join(parts)


class DeltaSparkTables(dict[str, str]):
    """Recipe id -> the table Delta Spark wrote for it, written on first use."""

    def __init__(self, spark: Any, root: Path) -> None:
        super().__init__()
        self.spark = spark
        self.root = root

    def __missing__(self, recipe_id: str) -> str:
        recipe = next(r for r in RECIPES if r.id == recipe_id)
        path = str(self.root / recipe.id)
        write_with_delta_spark(self.spark, recipe, path)
        self[recipe_id] = path
        return path


@pytest.fixture(scope="session")
def delta_tables(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> DeltaSparkTables:
    return DeltaSparkTables(spark, tmp_path_factory.mktemp("delta-spark-tables"))


def write_with_delta_spark(spark: Any, recipe: Recipe, path: str) -> None:
    for key, value in recipe.conf.items():
        spark.conf.set(key, value)
    try:
        for statement in recipe.statements:
            if statement == "CHECKPOINT":
                delta_log = spark._jvm.org.apache.spark.sql.delta.DeltaLog
                delta_log.forTable(spark._jsparkSession, path).checkpoint()
            else:
                spark.sql(statement.format(t=f"delta.`{path}`"))
    finally:
        for key in recipe.conf:
            spark.conf.unset(key)
    text = _log_text(path)
    missing = [e for e in recipe.evidence if e not in text]
    assert not missing, f"Delta Spark's {recipe.id} table shows no {missing}: the recipe misses the feature"
    if recipe.feature is not None:
        assert recipe.feature in delta_detail(spark, path)["tableFeatures"]


def _latest_version(spark: Any, path: str) -> int:
    return max(v for v, _ in delta_history(spark, path))


def spark_error(err: Exception) -> str:
    """The first line of a Spark error, the JVM exception's own for an unconverted one."""
    if isinstance(err, Py4JJavaError):
        return str(err.java_exception.toString()).splitlines()[0]
    return str(err).splitlines()[0]


def _refusal(err: UnsupportedProtocolError) -> dict[str, Any]:
    return {"error": type(err).__name__, "features": list(err.features)}


@pytest.mark.parametrize("recipe", _params("read"))
def test_we_read_delta_spark_tables_exactly_or_refuse_naming_the_feature(
    spark: Any, delta_tables: dict[str, str], feature_results: Any, recipe: Recipe
) -> None:
    path = delta_tables[recipe.id]
    detail = delta_detail(spark, path)
    outcome: dict[str, Any] = {"kind": "feature" if recipe.feature else "layout", "protocol": detail}
    wrong: list[str] = []
    refused: dict[str, Any] | None = None
    try:
        table = Table.open(path)
        for version in range(_latest_version(spark, path) + 1):
            theirs = delta_arrow(spark, path, version)
            ours = table.to_arrow(version=version)
            ours_shape, their_shape = schema_shape(ours.schema), schema_shape(theirs.schema)
            if ours_shape != their_shape:
                wrong.append(f"v{version} schema: ours {ours_shape} theirs {their_shape}")
                continue
            got, want = same_rows(ours, theirs)
            if got != want:
                wrong.append(f"v{version} rows: ours {got} theirs {want}")
    except UnsupportedProtocolError as err:
        refused = _refusal(err)
    if wrong:
        outcome["read"] = "WRONG"
        outcome["read_detail"] = wrong
    elif refused is not None:
        named = recipe.names_its_features(refused["features"])
        outcome["read"] = "refused" if named else "refused, naming another feature"
        outcome["read_detail"] = refused
    else:
        outcome["read"] = "exact"
    feature_results.record(recipe.id, **outcome)

    assert not wrong, "\n".join(wrong)
    if refused is not None:
        assert recipe.feature is not None, f"a table without features refused: {refused}"
        assert named, refused


@pytest.mark.parametrize("recipe", _params("write"))
def test_our_appends_to_delta_spark_tables_land_or_are_refused_naming_the_feature(
    spark: Any, delta_tables: dict[str, str], feature_results: Any, tmp_path: Path, recipe: Recipe
) -> None:
    """Our append of a copy of one of Delta Spark's rows, on a copy of its table. It may land
    only on a protocol whose writer features we implement (``writer_missing`` empty), and then
    Delta Spark must see our commit and our row."""
    path = str(tmp_path / "copy")
    shutil.copytree(delta_tables[recipe.id], path, symlinks=True)
    before = delta_arrow(spark, path)
    latest = _latest_version(spark, path)
    try:
        table = Table.open(path)
        row = before.slice(0, 1).cast(table.schema)
        # GENERATED ALWAYS identity values are ours to generate: the copy leaves them out.
        always = [c.name for c in identity_columns(table.schema) if c.always]
        table.append(row.drop_columns(always))
    except UnsupportedProtocolError as err:
        refused = _refusal(err)
        named = recipe.names_its_features(refused["features"])
        feature_results.record(
            recipe.id,
            write="refused" if named else "refused, naming another feature",
            write_detail=refused,
        )
        assert recipe.feature is not None, f"an append to a table without features refused: {refused}"
        assert named, refused
        return
    problems = []
    if always:  # the row as we wrote it: its identity values past every one of Delta Spark's
        mine = table.to_arrow()
        row = mine.filter(pc.invert(pc.is_in(mine.column(always[0]), before.column(always[0]))))
        for name in always:
            if not min(row.column(name).to_pylist()) > max(before.column(name).to_pylist()):
                problems.append(f"our {name} values {row.column(name)} collide with Delta Spark's")
    snapshot = table.snapshot()
    unsupported = writer_missing(snapshot.protocol, snapshot.metadata)
    if unsupported:
        problems.append(f"landed on a table with writer features eventlog does not implement: {unsupported}")
    try:
        after = delta_arrow(spark, path)
        history = delta_history(spark, path)
    except (PySparkException, Py4JJavaError) as err:
        problems.append(f"Delta Spark fails on the table after our append: {spark_error(err)}")
    else:
        ours_rows, delta_rows = same_rows(table.to_arrow(), after)
        _, expected = same_rows(table.to_arrow(), pa.concat_tables([before.cast(table.schema), row]))
        if history[0] != (latest + 1, "WRITE"):
            problems.append(f"Delta Spark's history starts {history[:2]}, not our WRITE at {latest + 1}")
        if delta_rows != expected:
            problems.append(f"Delta Spark reads {delta_rows}, expected {expected}")
        if ours_rows != expected:
            problems.append(f"we read {ours_rows}, expected {expected}")
    feature_results.record(
        recipe.id,
        write="WRONG" if problems else "append lands",
        **({"write_detail": problems} if problems else {}),
    )
    assert not problems, "\n".join(problems)


def test_delta_spark_does_not_create_catalog_managed_tables_locally(
    spark: Any, tmp_path: Path, feature_results: Any
) -> None:
    """catalogManaged needs a catalog that ratifies commits; Delta Spark 4.4 refuses to create one
    at a path, so there is no such table to read here."""
    path = str(tmp_path / "cm")
    with pytest.raises(
        UnsupportedOperationException, match="DELTA_UNSUPPORTED_CATALOG_MANAGED_TABLE_CREATION"
    ):
        spark.sql(
            f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta"
            " TBLPROPERTIES ('delta.feature.catalogManaged' = 'supported')"
        )
    feature_results.record(
        "catalogManaged",
        kind="feature",
        read="not tested: Delta Spark cannot create it at a path",
        write="not tested: Delta Spark cannot create it at a path",
        read_detail="DELTA_UNSUPPORTED_CATALOG_MANAGED_TABLE_CREATION",
    )
