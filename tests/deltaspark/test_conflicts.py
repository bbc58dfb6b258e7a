"""Every conflict decided as Delta Spark decides it (issue 22, section 2).

Each scenario of tests/deltaspark/conflict_scenarios.py runs on our engine and on Delta Spark
(tests/deltaspark/conflict_driver.py): both transactions read version v, the first commits,
then the second commits. The outcomes ("commit" or the exception class) must be equal, unless
the scenario is an intended difference (``INTENDED``, with the outcomes it records) or a known
bug (``BUGS``: a strict xfail).

The scenarios run once per module, three at a time (Delta Spark's side mostly waits on the JVM),
and the comparison is written to .cache/deltaspark-report/conflicts.json when every scenario
ran; ``python -m scripts.deltaspark_conflicts`` renders it as the README's table.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.deltaspark.conflict_driver import DeltaOutcome, DeltaPeer, Workspace, group_key, run_ours
from tests.deltaspark.conflict_scenarios import BUGS, BY_ID, INTENDED, SCENARIOS, Scenario
from tests.deltaspark.conftest import ROOT, delta_jars

# The first test waits for every scenario (the module's fixture): a few minutes on 2 cores.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPORT = ROOT / ".cache" / "deltaspark-report" / "conflicts.json"
WORKERS = 3

# Session settings for speed only (tiny tables; none changes how a conflict is decided), set
# while this module runs and restored after it.
FAST_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
    "spark.databricks.delta.stateReconstructionValidation.enabled": "false",
    # Commits through the transaction API carry no SQL metrics; Delta's DELETE and MERGE would
    # look them up for the commitInfo and fail.
    "spark.databricks.delta.history.metricsEnabled": "false",
}


# Scenarios run again each on a table of its own, to check that running a group of scenarios
# on one table (DeltaPeer.run_group: seconds committed and taken back one after another) decides
# each as it would alone. Each follows, in its group, a second that committed.
ALONE = [
    "UPDATE after INSERT | Serializable | partitioned-same | nodv",
    "OPTIMIZE after INSERT | Serializable | partitioned-same | nodv",
    "MERGE after INSERT | WriteSerializable | unpartitioned-same | dv",
    "DELETE after UPDATE | Serializable | partitioned-disjoint | dv",
    "INSERT txn(app-a, 2) after INSERT txn(app-a, 1) | WriteSerializable | unpartitioned | nodv",
]


def _selected(session: pytest.Session) -> list[Scenario]:
    ids: set[str] = set()
    for item in session.items:
        if item.module is None or item.module.__name__ != __name__:
            continue
        params = getattr(item, "callspec", None)
        if params is not None and "scenario_id" in params.params:
            ids.add(params.params["scenario_id"])
        elif item.name == test_a_scenario_alone_decides_as_in_its_group.__name__:
            ids.update(ALONE)
    return [s for s in SCENARIOS if s.id in ids]


@contextmanager
def fast_conf(spark: Any) -> Iterator[None]:
    saved = {k: spark.conf.get(k, None) for k in FAST_CONF}
    for k, v in FAST_CONF.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@pytest.fixture(scope="module")
def outcomes(
    spark: Any, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[str, DeltaOutcome]]]:
    """(our outcome, Delta Spark's) of each selected scenario, run once for the module."""
    scenarios = _selected(request.session)
    ws = Workspace(tmp_path_factory.mktemp("conflicts"))
    peer = DeltaPeer(spark)
    groups: dict[tuple[Any, ...], list[Scenario]] = defaultdict(list)
    for s in scenarios:
        groups[group_key(s)].append(s)

    def run(group: list[Scenario]) -> dict[str, tuple[str, DeltaOutcome]]:
        ours = {s.id: run_ours(ws, s) for s in group}
        theirs = peer.run_group(ws, group)
        return {s.id: (ours[s.id], theirs[s.id]) for s in group}

    started = time.monotonic()
    results: dict[str, tuple[str, DeltaOutcome]] = {}
    with fast_conf(spark), ThreadPoolExecutor(WORKERS) as pool:
        for done in pool.map(run, groups.values()):
            results.update(done)
    if len(scenarios) == len(SCENARIOS):
        write_report(results, time.monotonic() - started, spark)
    yield results


def verdict(scenario_id: str, ours: str, delta: str) -> tuple[str, str]:
    """How a scenario's outcomes compare: agree, intended (with its reason), bug, or differs."""
    if scenario_id in INTENDED:
        expected = INTENDED[scenario_id]
        if (ours, delta) == (expected.ours, expected.delta):
            return "intended", expected.reason
        return "differs", f"INTENDED expects ours={expected.ours}, Delta Spark={expected.delta}"
    if scenario_id in BUGS:
        return ("bug", BUGS[scenario_id]) if ours != delta else ("differs", "fixed: remove it from BUGS")
    return ("agree", "") if ours == delta else ("differs", "not listed in INTENDED or BUGS")


def _detail(outcome: DeltaOutcome) -> str:
    """Delta Spark's exception message, first line, without the scenario's temporary path."""
    first = outcome.detail.split("\n", 1)[0]
    return re.sub(r"(file:)?/\S*/delta-\d+", "<table>", first)[:300]


def write_report(results: dict[str, tuple[str, DeltaOutcome]], seconds: float, spark: Any) -> None:
    rows = []
    for s in SCENARIOS:
        ours, theirs = results[s.id]
        kind, reason = verdict(s.id, ours, theirs.outcome)
        rows.append(
            {
                "id": s.id,
                "family": s.family,
                "second": s.second.label,
                "first": s.first.label,
                "isolation": s.isolation,
                "layout": s.layout,
                "target": s.target,
                "dvs": s.dvs,
                "ours": ours,
                "delta_spark": theirs.outcome,
                "delta_spark_message": _detail(theirs),
                "verdict": kind,
                "reason": reason,
            }
        )
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row["verdict"]] += 1
    names = [Path(j).name for j in delta_jars()]
    version = next(
        (n.removesuffix(".jar").rsplit("-", 1)[1] for n in names if n.startswith("delta-spark_")), "?"
    )
    report = {
        "delta_spark": version,
        "pyspark": spark.version,
        "scenarios": len(rows),
        "counts": dict(sorted(counts.items())),
        "seconds": round(seconds, 1),
        "rows": rows,
    }
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")


def _param(s: Scenario) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=BUGS[s.id])] if s.id in BUGS else []
    return pytest.param(s.id, id=s.test_id, marks=marks)


def test_the_lists_name_known_scenarios() -> None:
    unknown = [k for k in [*INTENDED, *BUGS, *ALONE] if k not in BY_ID]
    assert not unknown, f"INTENDED/BUGS/ALONE name scenarios that do not exist: {unknown}"
    assert not set(INTENDED) & set(BUGS)


def test_a_scenario_alone_decides_as_in_its_group(
    spark: Any, outcomes: dict[str, tuple[str, DeltaOutcome]], tmp_path: Path
) -> None:
    ws, peer = Workspace(tmp_path), DeltaPeer(spark)
    with fast_conf(spark):
        alone = {i: peer.run_group(ws, [BY_ID[i]])[i].outcome for i in ALONE}
    assert alone == {i: outcomes[i][1].outcome for i in ALONE}


@pytest.mark.parametrize("scenario_id", [_param(s) for s in SCENARIOS])
def test_conflict_outcome_as_delta_spark(
    scenario_id: str, outcomes: dict[str, tuple[str, DeltaOutcome]]
) -> None:
    ours, theirs = outcomes[scenario_id]
    assert not theirs.outcome.startswith("first failed"), theirs.detail
    kind, reason = verdict(scenario_id, ours, theirs.outcome)
    if scenario_id in BUGS:
        assert ours == theirs.outcome, f"ours={ours}, Delta Spark={theirs.outcome}: {reason}"
        return
    assert kind in ("agree", "intended"), (
        f"ours={ours}, Delta Spark={theirs.outcome} ({_detail(theirs)}): {reason}"
    )
