"""Delta Spark reads the tables we write: the same rows, the same DESCRIBE HISTORY versions and
operations, and the same rows at every version (``versionAsOf``) as our reader."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException

from eventlog import Table
from eventlog.errors import VersionNotFoundError
from tests.conftest import SCHEMA, rows
from tests.deltaspark.peer import delta_arrow, delta_history, same_rows, schema_shape

# A Delta Spark time-travel read costs about 2 s (it rebuilds that version's snapshot); the
# first test also starts the session.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def assert_delta_spark_agrees(spark: Any, table: Table, versions: Sequence[int] | None = None) -> None:
    """Rows and schema at the latest version and at each of ``versions`` (default: all), and
    DESCRIBE HISTORY, as our reader and our history give them."""
    path = table.uri
    latest = table.version
    for version in versions if versions is not None else range(latest + 1):
        ours = table.to_arrow(version=version)
        theirs = delta_arrow(spark, path, version)
        assert schema_shape(theirs.schema) == schema_shape(ours.schema), f"schema at version {version}"
        got, want = same_rows(ours, theirs)
        assert want == got, f"rows at version {version}"
    ours_latest = table.to_arrow()
    got, want = same_rows(ours_latest, delta_arrow(spark, path))
    assert want == got
    our_history = [(h["version"], h["operation"]) for h in table.history()]
    assert delta_history(spark, path) == our_history


def deletion_vectors_in_log(path: str) -> int:
    """How many ``add`` actions of the JSON commits carry a deletion vector."""
    count = 0
    for name in sorted(os.listdir(f"{path}/_delta_log")):
        if name.endswith(".json") and not name.startswith("."):
            for line in Path(f"{path}/_delta_log/{name}").read_text().splitlines():
                add = json.loads(line).get("add")
                count += bool(add and add.get("deletionVector"))
    return count


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
@pytest.mark.parametrize("dv", [False, True], ids=["no-dv", "dv"])
def test_delta_spark_reads_every_operation_of_ours(
    spark: Any, tmp_path: Path, dv: bool, partitioned: bool
) -> None:
    """Every version time-travelled when DVs and partitioning go together (both or neither);
    the mixed cases, to keep the run short, at the DML and RESTORE versions (3, 4, 5, 10, 12)."""
    props = {"delta.checkpointInterval": "5"}
    if dv:
        props["delta.enableDeletionVectors"] = "true"
    uri = str(tmp_path / "t")
    t = Table.create(
        uri, SCHEMA, partition_by=["date"] if partitioned else None, properties=props, data=rows([1, 2, 3])
    )
    t.append(rows([4, 5], date="2024-01-02"))
    t.overwrite(rows([6], date="2024-01-02"), replace_where="date = '2024-01-02'")
    t.delete("id = 2")
    t.update("id = 3", set={"x": "x + 10"})  # version 4
    merge_source = rows([1, 7], x=70)
    merge = t.merge(merge_source, on="t.id = s.id", source_alias="s", target_alias="t")
    merge.when_matched_update_all().when_not_matched_insert_all().execute()  # 5: checkpoint
    t.optimize(zorder_by=["x"])
    t.set_properties({"delta.appendOnly": "false"})
    t.add_columns([pa.field("note", pa.string())])
    extended = rows([8]).append_column("note", pa.array(["n"], pa.string()))
    t.append(extended)  # 9
    t.restore(6)  # 10: checkpoint
    t.checkpoint()
    t.overwrite(rows([9, 10], date="2024-01-03"))
    t.delete("id = 9")
    assert t.version == 12
    assert [h["operation"] for h in reversed(t.history())] == [
        "CREATE TABLE AS SELECT", "WRITE", "WRITE", "DELETE", "UPDATE", "MERGE", "OPTIMIZE",
        "SET TBLPROPERTIES", "ADD COLUMNS", "WRITE", "RESTORE", "WRITE", "DELETE",
    ]  # fmt: skip
    assert sorted(n for n in os.listdir(f"{uri}/_delta_log") if n.endswith(".checkpoint.parquet")) == [
        f"{5:020d}.checkpoint.parquet",
        f"{10:020d}.checkpoint.parquet",
    ]
    if dv:
        assert deletion_vectors_in_log(uri) > 0
    assert_delta_spark_agrees(spark, t, versions=None if dv == partitioned else [3, 4, 5, 10, 12])


def test_delta_spark_reads_our_types_and_timestamp_ntz(spark: Any, tmp_path: Path) -> None:
    utc = dt.UTC
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("b", pa.bool_()),
            ("i8", pa.int8()),
            ("i16", pa.int16()),
            ("i32", pa.int32()),
            ("f", pa.float32()),
            ("d", pa.float64()),
            ("dec", pa.decimal128(10, 2)),
            ("s", pa.string()),
            ("bin", pa.binary()),
            ("day", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("ntz", pa.timestamp("us")),
            ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
            ("arr", pa.list_(pa.int64())),
            ("m", pa.map_(pa.string(), pa.int32())),
            ("pday", pa.date32()),
            ("pntz", pa.timestamp("us")),
        ]
    )
    data = pa.table(
        {
            "id": [1, 2, 3],
            "b": [True, None, False],
            "i8": [1, None, -128],
            "i16": [2, None, 32767],
            "i32": [3, None, -(2**31)],
            "f": [1.5, None, float("inf")],
            "d": [2.5, None, -0.0],
            "dec": [decimal.Decimal("12.34"), None, decimal.Decimal("-99999999.99")],
            "s": ["x", None, "ünï 'q'"],
            "bin": [b"\x01\x02", None, b""],
            "day": [dt.date(2024, 1, 2), None, dt.date(1, 1, 1)],
            "ts": [
                dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=utc),
                None,
                dt.datetime(1970, 1, 1, tzinfo=utc),
            ],
            "ntz": [dt.datetime(2024, 1, 2, 3, 4, 5), None, dt.datetime(1999, 12, 31, 23, 59, 59, 999999)],
            "st": [{"a": 1, "b": "q"}, None, {"a": None, "b": None}],
            "arr": [[1, 2, None], None, []],
            "m": [[("k", 1)], None, []],
            "pday": [dt.date(2024, 1, 1), dt.date(2024, 1, 1), None],
            "pntz": [
                dt.datetime(2024, 1, 1, 1, 2, 3, 500000),
                None,
                dt.datetime(2024, 1, 1, 1, 2, 3, 500000),
            ],
        },
        schema=schema,
    )
    t = Table.create(str(tmp_path / "t"), schema, partition_by=["pday", "pntz"])
    t.append(data)
    t.delete("id = 3")
    assert "timestampNtz" in (t.snapshot().protocol.reader_features or ())
    assert_delta_spark_agrees(spark, t)


def _cleaned_table(tmp_path: Path) -> Table:
    """Versions 0..6 with commits 0..4 deleted by our log cleanup at the checkpoint of 5; the
    handle that ran the cleanup."""
    uri = str(tmp_path / "t")
    t = Table.create(
        uri,
        SCHEMA,
        properties={
            "delta.logRetentionDuration": "interval 1 days",
            "eventlog.auditRetentionDuration": "interval 1 days",
        },
    )
    for i in range(1, 5):
        t.append(rows([i]))
    old = time.time() - 3 * 86400
    for name in os.listdir(f"{uri}/_delta_log"):
        os.utime(f"{uri}/_delta_log/{name}", (old, old))
    t.append(rows([5]))  # version 5: fresh
    assert t.checkpoint() == 5
    t.update("id = 5", set={"x": "50"})
    commits = sorted(int(n[:20]) for n in os.listdir(f"{uri}/_delta_log") if n.endswith(".json"))
    assert commits == [5, 6]
    return t


def test_delta_spark_reads_after_our_log_cleanup(spark: Any, tmp_path: Path) -> None:
    """Commits below our checkpoint deleted by our log cleanup: Delta Spark starts its history
    and its time travel where we do, and refuses the versions we refuse."""
    t = Table.open(_cleaned_table(tmp_path).uri)
    assert [h["version"] for h in t.history()] == [6, 5]
    assert_delta_spark_agrees(spark, t, versions=range(5, 7))
    with pytest.raises(VersionNotFoundError):
        t.to_arrow(version=4)
    with pytest.raises(AnalysisException, match=r"DELTA_VERSION_NOT_FOUND|Cannot time travel"):
        delta_arrow(spark, t.uri, 4)


def test_history_of_the_handle_that_cleaned_the_log_matches_delta_spark(spark: Any, tmp_path: Path) -> None:
    t = _cleaned_table(tmp_path)
    assert [(h["version"], h["operation"]) for h in t.history()] == delta_history(spark, t.uri)


def test_timestamp_time_travel_resolves_the_version_delta_spark_resolves(spark: Any, tmp_path: Path) -> None:
    """The last commit's file dated 2 s after its commitInfo.timestamp (a store that dates an
    object when its upload ends); a timestamp 1 s after commitInfo.timestamp."""
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA)
    t.append(rows([1]))
    t.append(rows([2]))
    committed_ms = t.history()[0]["timestamp"]
    dated = (committed_ms + 2000) / 1000
    os.utime(f"{uri}/_delta_log/{2:020d}.json", (dated, dated))
    when = dt.datetime.fromtimestamp((committed_ms + 1000) / 1000, dt.UTC)
    theirs = (
        spark.read.format("delta").option("timestampAsOf", when.strftime("%Y-%m-%d %H:%M:%S.%f")).load(uri)
    )
    assert sorted(r.id for r in theirs.collect()) == [1]  # Delta Spark: version 1
    assert t.version_at(when) == 1


_SKIP_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("i32", pa.int32()),
        ("f", pa.float64()),
        ("dec", pa.decimal128(10, 2)),
        ("s", pa.string()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")),
        ("b", pa.bool_()),
    ]
)


def _skip_rows(ids: list[int]) -> pa.Table:
    """Rows whose values grow with the id, microseconds apart in the timestamps."""
    return pa.table(
        {
            "id": ids,
            "i32": [i * 10 for i in ids],
            "f": [i + 0.5 for i in ids],
            "dec": [decimal.Decimal(f"{i}.{i:02d}") for i in ids],
            "s": ["ünï" if i == 5 else f"s{i:02d}" for i in ids],
            "day": [dt.date(2024, 1, i) for i in ids],
            "ts": [dt.datetime(2024, 1, 2, 3, 4, 5, 678900 + i, tzinfo=dt.UTC) for i in ids],
            "ntz": [dt.datetime(2024, 1, 2, 3, 4, 5, 678900 + i) for i in ids],
            "b": [i % 2 == 0 for i in ids],
        },
        schema=_SKIP_SCHEMA,
    )


@pytest.fixture(scope="module")
def skipping_table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    """Three files (ids 1-2, 3-4, 5-6) whose statistics we wrote."""
    t = Table.create(str(tmp_path_factory.mktemp("skipping") / "t"), _SKIP_SCHEMA)
    for ids in ([1, 2], [3, 4], [5, 6]):
        t.append(_skip_rows(ids))
    return t


@pytest.mark.parametrize(
    "predicate",
    [
        "i32 > 25",
        "s = 'ünï'",
        "s > 's03'",
        "s < 's02'",
        "s LIKE 's0%'",
        "dec > 3.03",
        "dec = 4.04",
        "day = DATE'2024-01-03'",
        "day > '2024-01-04'",
        "ts > TIMESTAMP'2024-01-02 03:04:05.678904'",
        "ts = TIMESTAMP'2024-01-02 03:04:05.678903'",
        "ts <= TIMESTAMP'2024-01-02 03:04:05.678901'",
        "ntz > TIMESTAMP_NTZ'2024-01-02 03:04:05.678904'",
        "ntz = TIMESTAMP'2024-01-02 03:04:05.678903'",  # Spark casts: compared as instants in UTC
        "f >= 4.5",
        "b = true",
        "id IN (1, 6)",
        "s IS NULL",
    ],
)
def test_delta_spark_skips_files_by_our_statistics_as_we_do(
    spark: Any, skipping_table: Table, predicate: str
) -> None:
    """Delta Spark prunes files by the statistics we wrote: its filtered read equals its read
    with data skipping off, and our filtered read."""
    uri = skipping_table.uri
    ours = sorted(skipping_table.to_arrow(filter=predicate).column("id").to_pylist())
    key = "spark.databricks.delta.stats.skipping"
    try:
        spark.conf.set(key, "true")
        skipped = sorted(
            r.id for r in spark.read.format("delta").load(uri).where(predicate).select("id").collect()
        )
        spark.conf.set(key, "false")
        full = sorted(
            r.id for r in spark.read.format("delta").load(uri).where(predicate).select("id").collect()
        )
    finally:
        spark.conf.unset(key)
    assert skipped == full
    assert ours == full
