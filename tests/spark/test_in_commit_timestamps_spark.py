"""In-commit timestamps on Spark: ``timestampAsOf`` on our source dates versions by their
``inCommitTimestamp``, whatever the commit files' modification times say."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64())])


def _as_of(spark: Any, uri: str, ms: int) -> list[int]:
    when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    df = spark.read.format("eventlog").option("timestampAsOf", when).load(uri)
    return sorted(r.id for r in df.collect())


def test_timestamp_as_of_honours_in_commit_timestamps(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, properties={"delta.enableInCommitTimestamps": "true"})
    t.append(pa.table({"id": [1]}))
    t.append(pa.table({"id": [2]}))
    stamped = {h["version"]: h["inCommitTimestamp"] for h in t.history()}
    # File times rewritten in reverse version order (a copy, an object-store move).
    for version in range(3):
        dated = stamped[0] / 1000 - version * 3600
        os.utime(Path(uri, "_delta_log", f"{version:020d}.json"), (dated, dated))
    assert _as_of(spark, uri, stamped[1]) == [1]
    assert _as_of(spark, uri, stamped[2] - 1) == [1]
    assert _as_of(spark, uri, stamped[2]) == [1, 2]
