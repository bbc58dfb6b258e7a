"""Sharing a table with Delta Spark: its maintenance (OPTIMIZE, checkpoints, log cleanup, VACUUM, RESTORE)
and its writes on our table leave our machinery intact; our writers go on after it, the slot
store catching up to versions it never granted; ``verify`` reports its commits as
``unguarded``, naming the engine; and our writers never overwrite its commits."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from eventlog import Table, VersionNotFoundError
from eventlog.log.audit import read_audit
from tests.conftest import SCHEMA, rows
from tests.deltaspark.peer import delta_arrow, delta_history, same_rows

# Several Delta Spark jobs a test, on a shared 2-core machine.
pytestmark = pytest.mark.timeout(600)


def _delta_append(spark: Any, path: str, ids: list[int]) -> None:
    frame = spark.createDataFrame(rows(ids).to_pandas()).select("id", "date", "x", "y")
    frame.write.format("delta").mode("append").save(path)


def _delta_engine(path: str, version: int) -> str:
    data = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    assert read_audit(data.encode()) is None  # Delta Spark does not chain
    assert '"engineInfo":"Apache-Spark/' in data
    return data


def _same(spark: Any, path: str) -> list[dict[str, Any]]:
    ours, theirs = same_rows(Table.open(path).to_arrow(), delta_arrow(spark, path))
    assert ours == theirs
    return ours


def test_delta_spark_maintenance_leaves_our_machinery_intact(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA, partition_by=["date"], properties={"delta.enableDeletionVectors": "true"})
    for i in range(1, 5):
        t.append(rows([i, 10 + i]))
    t.delete("id = 11")
    ours_last = t.version
    spark.sql(f"OPTIMIZE delta.`{path}`")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 12")  # a DML of theirs (with a deletion vector)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    _delta_append(spark, path, [20])  # a commit that checkpoints
    assert any(n.endswith(".checkpoint.parquet") for n in os.listdir(Path(path) / "_delta_log"))
    spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {ours_last}")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")  # VACUUM
    theirs_last = delta_history(spark, path)[0][0]
    assert theirs_last > ours_last
    expected = _same(spark, path)
    assert sorted(r["id"] for r in expected) == sorted([1, 2, 3, 4, 12, 13, 14])

    # Their VACUUM left our area alone; our writer goes on above their versions.
    assert (Path(path) / "_eventlog" / "slots").is_dir()
    writer = Table.open(path)
    assert writer.slots.latest(writer.key) == ours_last  # the slot store never granted theirs
    result = writer.append(rows([30]))
    assert result.version == theirs_last + 1
    assert writer.slots.latest(writer.key) == theirs_last + 1  # caught up
    assert sorted(r["id"] for r in _same(spark, path)) == sorted([1, 2, 3, 4, 12, 13, 14, 30])
    assert delta_history(spark, path)[0] == (theirs_last + 1, "WRITE")

    # verify: their commits are unguarded, naming Delta Spark; ours still check out.
    report = Table.handle(path).verify()
    assert (report.ok, report.problem, report.first_bad_version) == (False, "unguarded", ours_last + 1)
    allowed = Table.handle(path).verify(allow_unguarded=True)
    assert allowed.ok, allowed.detail
    assert [v for v, _ in allowed.unguarded] == list(range(ours_last + 1, theirs_last + 1))
    assert all(
        engine.startswith("Apache-Spark/") and "Delta-Lake/4.4" in engine for _, engine in allowed.unguarded
    )
    assert allowed.anchors_checked == ours_last + 2  # our versions, the last one included
    _delta_engine(path, ours_last + 1)


def test_our_writer_never_overwrites_a_delta_spark_commit(spark: Any, tmp_path: Path) -> None:
    """Delta Spark publishes version N between our claim of N and our publish: our publish
    is a put-if-absent (a hard link), so N stays theirs and ours lands at N + 1."""
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA)
    t.append(rows([1]))
    writer = Table.open(path)
    publish = writer.publish_claimed
    raced: list[int] = []

    def delta_spark_wins_the_race(version: int, staged: str, data: bytes, txn_id: str) -> bool:
        if not raced:
            raced.append(version)
            _delta_append(spark, path, [100])  # Delta Spark writes <version>.json now
        return publish(version, staged, data, txn_id)

    writer.publish_claimed = delta_spark_wins_the_race  # type: ignore[method-assign]
    result = writer.append(rows([2]))
    (contested,) = raced
    assert result.version == contested + 1 and result.attempts == 2
    theirs = _delta_engine(path, contested)
    assert '"add":' in theirs and result.txn_id not in theirs
    assert delta_history(spark, path)[:2] == [(contested + 1, "WRITE"), (contested, "WRITE")]
    assert sorted(r["id"] for r in _same(spark, path)) == [1, 2, 100]
    report = Table.handle(path).verify(allow_unguarded=True)
    assert report.ok and report.unguarded[0][0] == contested
    # Our lost claim of that version is accounted for: its transaction committed later.
    assert writer.slots.get(writer.key, contested).claim.txn_id == result.txn_id  # type: ignore[union-attr]


def test_delta_spark_log_cleanup_on_our_table(spark: Any, tmp_path: Path) -> None:
    """Delta Spark's metadata cleanup (after its checkpoint, commits older than
    ``delta.logRetentionDuration``, counted in whole days) removes our commits; we read from
    its checkpoint, our writers go on above it, and ``verify`` still tells its commits apart
    although no chained commit of ours is left before them."""
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA)
    for i in range(1, 5):
        t.append(rows([i]))
    ours_last = t.version
    log_dir = Path(path) / "_delta_log"
    ten_days_ago = time.time() - 10 * 86400
    for f in log_dir.iterdir():
        os.utime(f, (ten_days_ago, ten_days_ago))
    # Delta's shortest log retention is the deleted-file retention, 7 days.
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
        "('delta.checkpointInterval' = '1', 'delta.logRetentionDuration' = 'interval 7 days')"
    )
    cleaned = ours_last + 1  # their ALTER TABLE checkpointed, then cleaned up everything before it
    assert sorted(n for n in os.listdir(log_dir) if n.endswith(".json")) == [f"{cleaned:020d}.json"]

    reader = Table.open(path)
    assert reader.version == cleaned
    assert sorted(reader.to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]
    with pytest.raises(VersionNotFoundError):
        reader.snapshot(version=ours_last)

    report = Table.handle(path).verify()
    assert (report.ok, report.problem, report.first_bad_version) == (False, "unguarded", cleaned)
    result = Table.open(path).append(rows([5]))
    assert result.version == cleaned + 1
    allowed = Table.handle(path).verify(allow_unguarded=True)
    assert allowed.ok, allowed.detail
    assert (allowed.checked_from, allowed.chained_from) == (cleaned, cleaned + 1)
    assert [v for v, _ in allowed.unguarded] == [cleaned]
    assert sorted(r["id"] for r in _same(spark, path)) == [1, 2, 3, 4, 5]
    assert delta_history(spark, path)[:2] == [(cleaned + 1, "WRITE"), (cleaned, "SET TBLPROPERTIES")]
