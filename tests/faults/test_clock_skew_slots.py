"""Clock skew (issue 28): how old a slot claim is, and DROP FEATURE's history cutoff, on
clocks 3 h ahead or behind (libfaketime, :func:`tests.faults.skew_writer.skewed_env`).

* A claim whose staged commit is gone is repaired (an empty REPAIR commit) only once its
  writer is gone: for slot stores that cannot tell (local files, S3), once the claim is
  older than ``REPAIR_GRACE_SECONDS``. The age is read on the store's clock (the slot file's
  modification time, S3's ``LastModified``), never from the ``claimed_at`` the claimer
  wrote: a claimer behind (or a repairer ahead) must not repair a fresh claim, a claimer
  ahead (or a repairer behind) must not keep a dead claim for hours.
* DROP FEATURE ... TRUNCATE HISTORY run on a clock 3 h ahead cuts no history that is
  within its retention by the storage's clock.

Each test ends with the checks of issue 28 with a fresh handle: gapless versions, every
acknowledged commit once, the contents, ``verify``, a new write.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import FeatureDropError, Table
from eventlog.log import recovery
from eventlog.log.storage import LogStore
from lockstore import InMemorySlotStore, SlotClaim, default_owner
from tests.faults.skew_writer import SCHEMA
from tests.faults.test_clock_skew_group_commit import (
    AHEAD,
    BEHIND,
    emit,
    finish,
    read_report,
    start_child,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

GRACE = 3.0  # REPAIR_GRACE_SECONDS in the repairing process (300 s in production)
SLACK = 1.5  # S3 stamps whole seconds


def _open(spec: dict[str, Any]) -> Table:
    return Table.open(spec["uri"], slots=spec.get("slots"), storage_options=spec.get("storage_options"))


def child(spec: dict[str, Any]) -> None:
    """One process: ``claim`` (claims the next version for a staged file that does not
    exist, as a writer that died before its staged commit was durable), ``repair`` (reports
    ``ready``, waits for ``gate``, runs ``repair_slots`` at once and again ``wait`` seconds
    later, with ``REPAIR_GRACE_SECONDS`` = ``grace``) or ``drop`` (DROP FEATURE ``feature``
    TRUNCATE HISTORY)."""
    op = spec["op"]
    with _open(spec) as table:
        if op == "claim":
            emit(_claim(table))
        elif op == "repair":
            recovery.REPAIR_GRACE_SECONDS = float(spec["grace"])
            emit({"ready": True})
            wait_for(spec["gate"], 60)
            started = time.monotonic()
            for step in ("fresh", "past the grace"):
                if step != "fresh":
                    time.sleep(max(0.0, started + float(spec["wait"]) - time.monotonic()))
                age = table.slots.claim_age(table.key, 1)
                actions = table.repair_slots()
                emit({"step": step, "age": age, "actions": [a["action"] for a in actions]})
        elif op == "drop":
            try:
                result = table.drop_feature(spec["feature"], truncate_history=True)
            except FeatureDropError as exc:
                emit({"error": type(exc).__name__, "feature": exc.feature, "reason": exc.reason})
            else:
                emit({"version": result.version})
        else:
            raise SystemExit(f"unknown op {op!r}")


def _claim(table: Table) -> dict[str, Any]:
    """Claim the next version of ``table`` for a staged file that does not exist."""
    version = table.version + 1
    claim = SlotClaim(str(uuid.uuid4()), f"gone-{uuid.uuid4().hex}.json", default_owner())
    return {"claimed": table.slots.claim(table.key, version, claim), "version": version}


def _claim_on(offset: str | None, where: dict[str, Any]) -> dict[str, Any]:
    """:func:`_claim` on clock ``offset`` (None: in this process)."""
    if offset is None:
        with _open(where) as table:
            return _claim(table)
    proc = start_child(__name__, {**where, "op": "claim"}, offset)
    try:
        report = read_report(proc, offset, 60)
        assert proc.wait(timeout=30) == 0
    finally:
        finish([proc])
    return report


def _healthy(uri: str, expected: list[int], **where: Any) -> Table:
    """Gapless versions, the expected rows, verify and a new write (fresh handles)."""
    log = LogStore(uri, storage_options=where.get("storage_options"))
    versions = LogStore.commit_versions(log.list_log())
    assert versions == list(range(len(versions))), "versions are not gapless"
    table = Table.open(uri, **where)
    assert table.version == versions[-1]
    assert sorted(table.to_arrow().column("id").to_pylist()) == sorted(expected)
    report = table.verify()
    assert report.ok, (report.problem, report.detail)
    with Table.open(uri, **where) as fresh:
        before = fresh.version
        assert fresh.append(pa.table({"id": [-1]}, schema=SCHEMA)).version == before + 1
    return table


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A new table (``uri``) and how to open it: local slots, or S3 slots and storage."""
    if request.param == "local":
        yield {"uri": str(tmp_path / "table")}
        return
    bucket = request.getfixturevalue("s3_bucket")
    options = request.getfixturevalue("s3_storage_options")
    yield {"uri": f"s3://{bucket}/table", "slots": f"s3://{bucket}/slots", "storage_options": options}


# --------------------------------------------------------------------------- slot claims


@pytest.mark.parametrize(
    ("where", "claimer", "repairer"),
    [("local", BEHIND, AHEAD), ("local", AHEAD, BEHIND), ("s3", None, AHEAD)],
    ids=["local-claimer-behind-repairer-ahead", "local-claimer-ahead-repairer-behind", "s3-repairer-ahead"],
    indirect=["where"],
)
def test_a_claims_age_is_read_on_the_stores_clock(
    where: dict[str, Any], tmp_path: Path, claimer: str | None, repairer: str
) -> None:
    """A claim without its staged commit: not repaired while younger than the grace by the
    store's clock (the claimer may be alive), repaired once older."""
    uri = where["uri"]
    opened = {k: v for k, v in where.items() if k != "uri"}
    Table.create(uri, SCHEMA, **opened).close()
    gate = str(tmp_path / "claimed")
    repair = start_child(
        __name__, {**where, "op": "repair", "grace": GRACE, "wait": GRACE + SLACK, "gate": gate}, repairer
    )
    try:
        assert read_report(repair, repairer, 60)["ready"] is True
        claimed = _claim_on(claimer, where)
        assert (claimed["claimed"], claimed["version"]) == (True, 1)
        Path(gate).touch()
        fresh = read_report(repair, repairer, 30)
        assert fresh["age"] < GRACE and fresh["actions"] == ["skip: writer may be alive"], fresh
        late = read_report(repair, repairer, 30)
        assert late["age"] >= GRACE and late["actions"] == ["repair-commit"], late
        assert repair.wait(timeout=30) == 0
    finally:
        Path(gate).touch()
        finish([repair])
    table = _healthy(uri, [], **opened)
    history = {h["version"]: h for h in table.history()}
    assert history[1]["operation"] == "REPAIR"
    assert history[1]["operationParameters"]["reason"] == recovery.NEVER_COMPLETED


def test_claim_age_is_the_stores(where: dict[str, Any]) -> None:
    """The port's claim_age on the local-file and S3 stores: seconds since the claim by the
    store's clock, None for a version never claimed; the in-memory store cannot tell."""
    uri = where["uri"]
    opened = {k: v for k, v in where.items() if k != "uri"}
    with Table.create(uri, SCHEMA, **opened) as table:
        store, key = table.slots, table.key
        assert store.claim_age(key, 1) is None
        claimed = time.monotonic()
        assert table.append(pa.table({"id": [1]}, schema=SCHEMA)).version == 1
        time.sleep(2.2)
        age = store.claim_age(key, 1)
        # Within a second of the elapsed time (S3 stamps whole seconds).
        assert age is not None and 2.2 - 1.0 <= age <= time.monotonic() - claimed + 1.0
    assert InMemorySlotStore().claim_age("t", 0) is None
    _healthy(uri, [1], **opened)


# --------------------------------------------------------------------------- DROP FEATURE


def test_drop_feature_truncate_history_on_a_clock_ahead_keeps_the_retained_history(tmp_path: Path) -> None:
    """History written minutes ago is within a retention of 1 hour by the storage's clock;
    a process 3 h ahead must not cut it (and so cannot drop the feature yet)."""
    uri = str(tmp_path / "table")
    props = {
        "delta.enableDeletionVectors": "true",
        "delta.dropFeatureTruncateHistory.retentionDuration": "interval 1 hours",
    }
    Table.create(uri, SCHEMA, properties=props).close()
    with Table.open(uri) as table:
        table.append(pa.table({"id": [1, 2, 3]}, schema=SCHEMA))
        table.delete("id = 2")  # a deletion vector: a trace of the feature in the history
        with pytest.raises(FeatureDropError) as err:
            table.drop_feature("deletionVectors", truncate_history=True)  # traces removed now
        assert err.value.reason == "wait for retention"
    log = LogStore(uri)
    kept = LogStore.commit_versions(log.list_log())
    drop = start_child(__name__, {"op": "drop", "uri": uri, "feature": "deletionVectors"}, AHEAD)
    try:
        report = read_report(drop, AHEAD, 60)
        assert drop.wait(timeout=30) == 0
    finally:
        finish([drop])
    assert report.get("error") == "FeatureDropError", f"the feature was dropped: {report}"
    assert (report["error"], report["feature"], report["reason"]) == (
        "FeatureDropError",
        "deletionVectors",
        "historical versions exist",
    )
    assert LogStore.commit_versions(log.list_log())[0] == kept[0] == 0, "history within the retention was cut"
    table = _healthy(uri, [1, 3])
    assert "deletionVectors" in (table.snapshot().protocol.reader_features or ())
    assert sorted(table.to_arrow(version=1).column("id").to_pylist()) == [1, 2, 3]  # time travel
