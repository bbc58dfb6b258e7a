"""Delta Spark as a live peer: one SparkSession per test run with Delta Spark's jars.

Runs only in .venv-delta (pyspark 4.2.0; see tests/conftest.py and scripts/bootstrap_delta.sh,
which resolves the jars with Maven and lists them in .cache/deltaspark-jars/jars.txt).
The session overrides the suite's ``spark`` fixture in this package.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.spark import local_session

ROOT = Path(__file__).resolve().parent.parent.parent
JARS_LIST = ROOT / ".cache" / "deltaspark-jars" / "jars.txt"
# What each Delta Spark table feature gives our reader today (tests/deltaspark/test_read_theirs.py),
# written at the end of the run: the source of the README's "feature, read, write" table.
FEATURE_REPORT = ROOT / ".cache" / "deltaspark-report" / "features.json"


def delta_jars() -> list[str]:
    if not JARS_LIST.is_file():
        raise pytest.UsageError(f"{JARS_LIST} is missing: run scripts/bootstrap_delta.sh")
    jars = [line.strip() for line in JARS_LIST.read_text().splitlines() if line.strip()]
    missing = [j for j in jars if not Path(j).is_file()]
    if missing or not any(Path(j).name.startswith("delta-spark_") for j in jars):
        raise pytest.UsageError(f"{JARS_LIST} names missing jars {missing}: run scripts/bootstrap_delta.sh")
    return jars


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with Delta Spark's SQL extension and catalog."""
    config = {
        "spark.jars": ",".join(delta_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": "2",
        # Delta's snapshot state is shuffled into 50 partitions by default: 2 suit tiny tables.
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.ui.showConsoleProgress": "false",
    }
    with local_session("eventlog-deltaspark-tests", **config) as session:
        yield session


class FeatureResults:
    """Outcome of our reader on each Delta Spark table feature, collected across tests."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def record(self, feature: str, **outcome: Any) -> None:
        self.rows.setdefault(feature, {"feature": feature}).update(outcome)


_RESULTS = FeatureResults()


@pytest.fixture(scope="session")
def feature_results() -> FeatureResults:
    return _RESULTS


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _RESULTS.rows:
        return
    FEATURE_REPORT.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "delta_spark": _delta_version(),
        "features": [_RESULTS.rows[k] for k in sorted(_RESULTS.rows)],
    }
    FEATURE_REPORT.write_text(json.dumps(report, indent=2) + "\n")


def _delta_version() -> str:
    names = [Path(j).name for j in delta_jars()]
    return next(
        (n.removesuffix(".jar").rsplit("-", 1)[1] for n in names if n.startswith("delta-spark_")), "?"
    )
