"""Shared fixtures: fresh table locations on local disk and on fsspec's memory filesystem."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import Table

# tests/deltaspark runs Delta Spark as a peer: it needs the pyspark release Delta Spark is built
# for (jvm/deltaspark/constraints.txt) and its jars, which only .venv-delta has
# (scripts/bootstrap_delta.sh). scripts/test.sh runs it there after the main run; any other
# pyspark leaves it uncollected.
DELTA_PYSPARK = next(
    line.split("==")[1].strip()
    for line in (Path(__file__).parent.parent / "jvm/deltaspark/constraints.txt").read_text().splitlines()
    if line.startswith("pyspark==")
)
collect_ignore = [] if metadata.version("pyspark") == DELTA_PYSPARK else ["deltaspark"]


@pytest.fixture
def local_uri(tmp_path: object) -> str:
    return str(tmp_path) + "/table"  # type: ignore[operator]


@pytest.fixture
def memory_uri() -> Iterator[str]:
    uri = f"memory://tests/{uuid.uuid4().hex}"
    yield uri
    import fsspec

    fs = fsspec.filesystem("memory")
    if fs.exists(uri):
        fs.rm(uri, recursive=True)


@pytest.fixture(params=["local", "memory"])
def any_uri(request: pytest.FixtureRequest, tmp_path: object) -> str:
    if request.param == "local":
        return str(tmp_path) + "/table"  # type: ignore[operator]
    return f"memory://tests/{uuid.uuid4().hex}"


SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("date", pa.string()),
        pa.field("x", pa.int64()),
        pa.field("y", pa.float64()),
    ]
)


def rows(ids: list[int], date: str = "2024-01-01", x: int | None = None) -> pa.Table:
    """Rows with the standard test schema; x defaults to the id."""
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "date": pa.array([date] * len(ids), pa.string()),
            "x": pa.array([x if x is not None else i for i in ids], pa.int64()),
            "y": pa.array([float(i) for i in ids], pa.float64()),
        }
    )


def sorted_ids(table: Table, **kw: object) -> list[int]:
    return sorted(table.to_arrow(**kw).column("id").to_pylist())  # type: ignore[arg-type]


from tests.support.fixtures import *  # noqa: E402,F403 - ZooKeeper fixtures (zk_hosts, zk_chroot, zk_ensemble)
from tests.support.spark import spark  # noqa: E402,F401 - the one SparkSession per test run
from tests.support.spark_connect import connect_spark  # noqa: E402,F401 - the one Spark Connect session per test run
