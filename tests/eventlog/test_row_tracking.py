"""Row tracking (``delta.enableRowTracking``): fresh row ids at commit, the high-water-mark
domain, stable ids and commit versions through every rewrite, and reads of them."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog import RowTrackingNotEnabledError, Table
from eventlog.files import row_tracking as rt
from eventlog.log.storage import LogStore
from tests.conftest import SCHEMA, rows

ON = {"delta.enableRowTracking": "true"}


def _actions(uri: str, version: int) -> list[dict[str, Any]]:
    text = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line]


def _mark(table: Table) -> int:
    return rt.high_water_mark(table.refresh().domains)


def _ids(table: Table, **kw: Any) -> dict[int, tuple[int, int]]:
    """{id column: (row id, row commit version)} of the live rows."""
    t = table.to_arrow(row_ids=True, **kw)
    ids = t.column("_row_id").to_pylist()
    assert len(set(ids)) == len(ids), "row ids must be unique"
    return dict(
        zip(
            t.column("id").to_pylist(),
            zip(ids, t.column("_row_commit_version").to_pylist(), strict=True),
            strict=True,
        )
    )


def test_create_enables_the_feature_and_commits_assign_fresh_ids(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    snap = t.snapshot()
    assert {"rowTracking", "domainMetadata"} <= set(snap.protocol.writer_features or ())
    hidden = rt.materialized_columns(snap.metadata.configuration)
    assert hidden is not None
    assert hidden[0].startswith("_row-id-col-") and hidden[1].startswith("_row-commit-version-col-")
    assert _mark(t) == rt.NO_HIGH_WATER_MARK
    t.append(rows([1, 2, 3]))
    t.append(rows([4, 5]))
    (add,) = [a["add"] for a in _actions(local_uri, 2) if "add" in a]
    assert (add["baseRowId"], add["defaultRowCommitVersion"]) == (3, 2)
    domain = next(a["domainMetadata"] for a in _actions(local_uri, 2) if "domainMetadata" in a)
    assert (domain["domain"], json.loads(domain["configuration"])) == (rt.DOMAIN, {"rowIdHighWaterMark": 4})
    assert _ids(t) == {1: (0, 1), 2: (1, 1), 3: (2, 1), 4: (3, 2), 5: (4, 2)}
    assert _mark(t) == 4


def test_ids_across_partitions_and_files_never_overlap(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"], properties=ON)
    t.append(pa.concat_tables([rows([1, 2], "a"), rows([3], "b"), rows([4, 5, 6], "c")]))
    t.append(pa.concat_tables([rows([7], "a"), rows([8, 9], "b")]))
    got = _ids(t)
    assert sorted(i for i, _ in got.values()) == list(range(9))
    assert _mark(t) == 8


DML: list[tuple[str, Callable[[Table], object]]] = [
    ("delete", lambda t: t.delete("id = 2")),
    ("update", lambda t: t.update("id = 4", {"x": "400"})),
    (
        "merge",
        lambda t: (
            t.merge(rows([4, 5, 9]), "target.id = source.id")
            .when_matched_update("target.id = 4", {"x": "source.x + 1000"})
            .when_matched_delete()
            .when_not_matched_insert_all()
            .execute()
        ),
    ),
    ("optimize", lambda t: t.optimize()),
    ("zorder", lambda t: t.optimize(zorder_by=["x"])),
    ("reorg", lambda t: (t.delete("id = 3"), t.reorg_purge())),
]


PROPS: list[dict[str, str]] = [
    {},
    {"delta.enableDeletionVectors": "true"},
    {"delta.columnMapping.mode": "name"},
]
CASES = [
    (props, partitioned, name, op)
    for props in PROPS
    for partitioned in (False, True)
    for name, op in DML
    if name != "reorg" or "delta.enableDeletionVectors" in props  # REORG PURGE rewrites DV files
]


@pytest.mark.parametrize(
    ("props", "partitioned", "name", "op"),
    CASES,
    ids=[f"{n}-{'/'.join(p) or 'plain'}-{'partitioned' if part else 'flat'}" for p, part, n, _ in CASES],
)
def test_rows_keep_their_ids_through_rewrites(
    local_uri: str, props: dict[str, str], partitioned: bool, name: str, op: Callable[[Table], object]
) -> None:
    t = Table.create(
        local_uri, SCHEMA, partition_by=["date"] if partitioned else None, properties={**ON, **props}
    )
    t.append(rows([1, 2, 3]))
    t.append(rows([4, 5, 6]))
    before = _ids(t)
    mark = _mark(t)
    op(t)
    version = t.version
    after = _ids(t)
    for key, (row_id, cv) in after.items():
        if key not in before:  # inserted: a fresh id, above the mark before the write
            assert row_id > mark and cv == version
            continue
        assert row_id == before[key][0], f"row {key} lost its id"
        changed = t.to_arrow(filter=f"id = {key}").column("x")[0].as_py() != key
        assert cv == (version if changed else before[key][1])
    gone = set(before) - set(after)
    assert gone == {"delete": {2}, "merge": {5}, "reorg": {3}}.get(name, set())
    assert _mark(t) >= max(i for i, _ in after.values())
    # Statistics describe only the table's columns; change data has no hidden columns.
    hidden = set(rt.materialized_columns(t.snapshot().metadata.configuration) or ())
    for add in t.snapshot().add_files:
        assert not hidden & set(json.loads(add.stats or "{}").get("minValues", {}))
    assert Table.open(local_uri).verify().ok


def test_update_keeps_ids_and_takes_the_commit_version(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1, 2, 3]))
    t.update("id >= 2", {"x": "0"})
    t.update("id = 3", {"x": "1"})
    assert _ids(t) == {1: (0, 1), 2: (1, 2), 3: (2, 3)}
    t.optimize()  # a copy keeps each row's commit version
    assert _ids(t) == {1: (0, 1), 2: (1, 2), 3: (2, 3)}


def test_change_data_files_hold_no_hidden_columns(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties={**ON, "delta.enableChangeDataFeed": "true"})
    t.append(rows([1, 2, 3]))
    t.update("id = 2", {"x": "20"})
    hidden = set(rt.materialized_columns(t.snapshot().metadata.configuration) or ())
    cdc = list((Path(local_uri) / "_change_data").rglob("*.parquet"))
    assert cdc and all(not hidden & set(pq.read_schema(p).names) for p in cdc)
    data = [Path(local_uri) / a.path for a in t.snapshot().add_files if a.default_row_commit_version == 2]
    assert data and all(hidden <= set(pq.read_schema(p).names) for p in data)
    assert sorted(t.changes(2).column("_change_type").to_pylist()) == ["update_postimage", "update_preimage"]


def test_enabling_later_backfills_every_file_in_one_commit(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(pa.concat_tables([rows([1, 2], "a"), rows([3], "b")]))
    t.append(rows([4], "a"))
    with pytest.raises(RowTrackingNotEnabledError) as info:
        t.to_arrow(row_ids=True)
    assert (info.value.version, info.value.supported) == (2, False)
    result = t.set_properties(ON)
    assert result.metrics["numBackfilledFiles"] == "3"
    adds = [a["add"] for a in _actions(local_uri, 3) if "add" in a]
    assert len(adds) == 3 and all(not a["dataChange"] and a["defaultRowCommitVersion"] == 3 for a in adds)
    spans = sorted((a["baseRowId"], json.loads(a["stats"])["numRecords"]) for a in adds)
    assert [b for b, _ in spans] == [0, spans[0][1], spans[0][1] + spans[1][1]]  # they tile 0..3
    assert sorted(i for i, _ in _ids(t).values()) == [0, 1, 2, 3]
    assert t.to_arrow().num_rows == 4 and Table.open(local_uri).verify().ok
    # Turning it off keeps assigning (the feature stays supported) but refuses stable reads.
    t.set_properties({"delta.enableRowTracking": "false"})
    t.append(rows([5], "a"))
    (add,) = [a["add"] for a in _actions(local_uri, 5) if "add" in a]
    assert add["baseRowId"] == 4
    with pytest.raises(RowTrackingNotEnabledError) as info:
        t.to_arrow(row_ids=True)
    assert (info.value.version, info.value.supported) == (5, True)


def test_suspended_tables_assign_nothing(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.set_properties({"delta.enableRowTracking": "false", "delta.rowTrackingSuspended": "true"})
    t.append(rows([1]))
    (add,) = [a["add"] for a in _actions(local_uri, 2) if "add" in a]
    assert "baseRowId" not in add and "defaultRowCommitVersion" not in add


def test_a_commit_rebased_over_a_winner_takes_ids_above_its_mark(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1, 2]))
    loser = t.transaction()
    loser.append(rows([10, 11, 12]))
    Table.open(local_uri).append(rows([3, 4]))  # wins version 2 with ids 2, 3
    assert loser.commit().version == 3
    (add,) = [a["add"] for a in _actions(local_uri, 3) if "add" in a]
    assert (add["baseRowId"], add["defaultRowCommitVersion"]) == (4, 3)
    assert _mark(t) == 6
    assert sorted(i for i, _ in _ids(t).values()) == list(range(7))


def test_time_travel_checkpoints_and_restore_keep_ids(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties=ON)
    t.append(rows([1, 2, 3]))
    at_1 = _ids(t)
    t.update("id = 1", {"x": "100"})
    t.delete("id = 3")
    t.checkpoint()
    reopened = Table.open(local_uri)
    assert _ids(reopened, version=1) == at_1
    assert _ids(reopened) == {1: (0, 2), 2: (1, 1)}
    reopened.restore(1)
    assert _ids(Table.open(local_uri)) == at_1


def test_group_commit_on_a_row_tracking_table_keeps_ids_unique(local_uri: str) -> None:
    Table.create(local_uri, SCHEMA, properties=ON).close()
    t = Table.open(local_uri, group_commit=True)
    for i in range(4):
        t.append(rows([i]))
    assert sorted(i for i, _ in _ids(t).values()) == [0, 1, 2, 3]


def _worker(uri: str, worker: int, ops: int, start: Any, out: Any) -> None:
    table = Table.open(uri)
    start.wait(timeout=60)
    acks = []
    for i in range(ops):
        key = worker * 1000 + i
        acks.append(table.append(rows([key, key + 500])).version)
        acks.append(table.update(f"id = {key}", {"x": str(-key)}).version)
    table.close()
    out.put(acks)


def test_three_processes_append_and_update_with_unique_stable_ids(local_uri: str) -> None:
    ops = 5
    Table.create(local_uri, SCHEMA, properties={**ON, "delta.enableDeletionVectors": "true"}).close()
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(3)
    procs = [ctx.Process(target=_worker, args=(local_uri, w, ops, start, out)) for w in (1, 2, 3)]
    for p in procs:
        p.start()
    acked = sorted(v for _ in procs for v in out.get(timeout=300))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert acked == list(range(1, 2 * 3 * ops + 1))  # every ack once, gapless
    assert LogStore.commit_versions(LogStore(local_uri).list_log()) == list(range(2 * 3 * ops + 1))
    t = Table.open(local_uri)
    got = _ids(t)
    assert len(got) == 2 * 3 * ops
    # Each append takes 2 fresh ids and each update's new file 1 (its row keeps its old id).
    assert _mark(t) == 3 * 3 * ops - 1
    assert max(i for i, _ in got.values()) <= _mark(t)
    x = dict(zip(*t.to_arrow(columns=["id", "x"]).to_pydict().values(), strict=True))
    for key in (k for k in got if k % 1000 < 500):
        # Updated: same id as when appended (its sibling's, minus one), and a later version.
        assert x[key] == -key and x[key + 500] == key + 500
        assert got[key][0] + 1 == got[key + 500][0]
        assert got[key][1] > got[key + 500][1]
    report = t.verify()
    assert (report.ok, report.problem) == (True, None)


def test_drop_feature_suspends_drops_the_ids_then_downgrades(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties={**ON, "delta.enableDeletionVectors": "true"})
    t.append(rows([1, 2]))
    t.update("id = 1", {"x": "10"})
    contents = sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])
    start = t.version
    result = t.drop_feature("rowTracking")
    snap = t.refresh()
    assert "rowTracking" not in (snap.protocol.writer_features or ())
    assert "domainMetadata" in (snap.protocol.writer_features or ())  # Delta leaves it
    assert not {k for k in snap.metadata.configuration if "rowTracking" in k}
    assert rt.DOMAIN not in snap.domains
    assert all(a.base_row_id is None and a.default_row_commit_version is None for a in snap.add_files)
    ops = [h["operation"] for h in reversed(t.history()) if h["version"] > start]
    assert ops == ["SET TBLPROPERTIES", "ROW TRACKING UNBACKFILL", "DROP FEATURE"]
    assert result.version == t.version
    t.append(rows([3]))  # no ids once dropped
    assert all(a.base_row_id is None for a in t.refresh().add_files)
    assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])[:2] == contents
    with pytest.raises(RowTrackingNotEnabledError):
        t.to_arrow(row_ids=True)
    assert Table.open(local_uri).verify().ok
