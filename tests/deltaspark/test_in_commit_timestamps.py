"""In-commit timestamps both ways with Delta Spark: it reads our tables and dates their
versions as we do (DESCRIBE HISTORY, ``TIMESTAMP AS OF``), and we append to its tables with
timestamps that continue its own."""

from __future__ import annotations

import datetime as dt
import itertools
import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.log import in_commit_timestamps as ict
from tests.deltaspark.peer import delta_arrow, delta_detail, same_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCHEMA = pa.schema([("id", pa.int64())])


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids}, schema=SCHEMA)


def delta_timestamps(spark: Any, path: str) -> dict[int, int]:
    """Version -> Delta Spark's DESCRIBE HISTORY timestamp, in epoch milliseconds."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").selectExpr(
        "version", "unix_millis(timestamp) AS ms"
    )
    return {int(r.version): int(r.ms) for r in history.collect()}


def delta_ids_as_of(spark: Any, path: str, ms: int) -> list[int]:
    """The ids Delta Spark reads with ``TIMESTAMP AS OF`` the instant ``ms``."""
    when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    rows = spark.sql(f"SELECT id FROM delta.`{path}` TIMESTAMP AS OF '{when}'").collect()
    return sorted(int(r.id) for r in rows)


def commit_info(path: str, version: int) -> dict[str, Any]:
    """The first action of a commit file, which in-commit timestamps require to be commitInfo."""
    first = orjson.loads(Path(path, "_delta_log", f"{version:020d}.json").read_bytes().split(b"\n")[0])
    assert list(first) == ["commitInfo"], f"commit {version} does not start with commitInfo"
    info: dict[str, Any] = first["commitInfo"]
    return info


def test_delta_spark_dates_our_versions_as_we_do(spark: Any, tmp_path: Path) -> None:
    """Versions 0-1 before the enablement (dated by their files), 2-4 from it on (by ICT)."""
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA)
    t.append(_rows([1]))
    # Distinct whole seconds (file times of either engine's precision), before the enablement.
    now = int(ict.wall_clock_ms() / 1000)
    for version, ago in ((0, 120), (1, 60)):
        os.utime(Path(path, "_delta_log", f"{version:020d}.json"), (now - ago, now - ago))
    t.set_properties({ict.ENABLE_KEY: "true"})
    t.append(_rows([2]))
    t.append(_rows([3]))
    assert "inCommitTimestamp" in delta_detail(spark, path)["tableFeatures"]
    ours = {h["version"]: h["timestamp"] for h in t.history()}
    assert delta_timestamps(spark, path) == ours
    assert [commit_info(path, v)["inCommitTimestamp"] for v in (2, 3, 4)] == [ours[2], ours[3], ours[4]]
    for version, ms in ours.items():
        for instant in (ms, ms + 1):
            if instant > ours[4]:
                continue  # Delta Spark refuses a timestamp after the latest commit
            at = t.version_at(instant)
            assert delta_ids_as_of(spark, path, instant) == sorted(
                t.to_arrow(version=at).column("id").to_pylist()
            )
        assert t.version_at(ms) == version
    got, want = same_rows(t.to_arrow(), delta_arrow(spark, path))
    assert got == want


def test_we_append_to_delta_spark_tables_with_timestamps_that_continue_its_own(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    table = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {table} (id BIGINT) USING delta TBLPROPERTIES ('{ict.ENABLE_KEY}' = 'true')")
    spark.sql(f"INSERT INTO {table} VALUES (1)")
    ours = Table.open(path)
    assert (ours.append(_rows([2])).version, ours.append(_rows([3])).version) == (2, 3)
    spark.sql(f"INSERT INTO {table} VALUES (4)")
    stamped: list[int] = [commit_info(path, v)["inCommitTimestamp"] for v in range(5)]
    assert all(a < b for a, b in itertools.pairwise(stamped))
    theirs = delta_timestamps(spark, path)
    assert [theirs[v] for v in range(5)] == stamped
    fresh = Table.open(path)
    assert {h["version"]: h["timestamp"] for h in fresh.history()} == theirs
    assert [fresh.version_at(ms) for ms in stamped] == [0, 1, 2, 3, 4]
    got, want = same_rows(fresh.to_arrow(), delta_arrow(spark, path))
    assert got == want == [{"id": i} for i in (1, 2, 3, 4)]
