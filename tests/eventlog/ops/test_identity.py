"""Identity columns on the engine's write paths: values generated from start/step (negative
steps too), GENERATED ALWAYS refusing supplied values and BY DEFAULT keeping them, the
high-water mark and the reserved ranges recorded per commit, UPDATE and MERGE rules,
schema rules at create, and concurrent inserts through two handles that both commit."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from eventlog import IdentityColumnError, Table, identity_field, write_table
from eventlog.files.identity import identity_columns, round_to_next, with_high_water_marks
from eventlog.log.storage import LogStore


def _schema(**identity: Any) -> pa.Schema:
    return pa.schema([identity_field("id", **identity), pa.field("v", pa.string())])


def _rows(*values: str) -> pa.Table:
    return pa.table({"v": list(values)})


def _commit(path: Path, version: int) -> dict[str, Any]:
    actions = [
        json.loads(line) for line in (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    ]
    return {k: v for a in actions for k, v in a.items() if k in ("commitInfo", "metaData", "protocol")}


def _mark(table: Table) -> int | None:
    (column,) = identity_columns(table.refresh().schema)
    return column.high_water_mark


def _ids(table: Table) -> list[int]:
    return sorted(table.to_arrow().column("id").to_pylist())


def test_values_follow_start_and_step_and_each_commit_moves_the_mark(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(start=10, step=5))
    assert _mark(table) is None
    r1 = table.append(_rows("a", "b", "c"))
    r2 = table.append(_rows("d"))
    got = table.to_arrow().sort_by("id").to_pylist()
    assert got == [{"id": 10, "v": "a"}, {"id": 15, "v": "b"}, {"id": 20, "v": "c"}, {"id": 25, "v": "d"}]
    assert _mark(table) == 25
    c1, c2 = _commit(tmp_path, r1.version), _commit(tmp_path, r2.version)
    assert c1["commitInfo"]["eventlog.identity"] == {"id": [[10, 20]]}
    assert c2["commitInfo"]["eventlog.identity"] == {"id": [[25, 25]]}
    assert c2["commitInfo"]["tags"] == {"delta.identity.schemaUpdate": "true"}
    field = orjson.loads(c2["metaData"]["schemaString"])["fields"][0]
    assert field["metadata"] == {
        "delta.identity.start": 10,
        "delta.identity.step": 5,
        "delta.identity.allowExplicitInsert": False,
        "delta.identity.highWaterMark": 25,
        "eventlog.identity.ownMark": 25,  # set by us: our cached slots below it stay usable
    }
    protocol = _commit(tmp_path, 0)["protocol"]
    assert "identityColumns" in protocol["writerFeatures"]


def test_negative_step_counts_down_and_the_mark_is_the_lowest(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(start=-1, step=-3), data=_rows("a", "b"))
    table.append(_rows("c"))
    assert _ids(table) == [-7, -4, -1]
    assert _mark(table) == -7


def test_always_refuses_supplied_values_and_leaves_the_table_as_it_was(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(always=True), data=_rows("a"))
    files = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(IdentityColumnError) as info:
        table.append(pa.table({"id": pa.array([None], pa.int64()), "v": ["x"]}))
    assert (info.value.column, info.value.reason, info.value.operation) == ("id", "explicit insert", "append")
    assert table.refresh().version == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == files  # no data file left behind
    assert _ids(table) == [1]


def test_by_default_keeps_supplied_values_without_moving_the_mark(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(always=False))
    table.append(_rows("a", "b"))
    r = table.append(pa.table({"id": pa.array([100, None], pa.int64()), "v": ["x", "y"]}))
    assert _mark(table) == 2  # explicit values do not move it (Delta: SYNC IDENTITY does)
    assert "eventlog.identity" not in _commit(tmp_path, r.version)["commitInfo"]
    assert "metaData" not in _commit(tmp_path, r.version)
    table.append(_rows("c"))
    got = {(row["id"], row["v"]) for row in table.to_arrow().to_pylist()}
    assert got == {(1, "a"), (2, "b"), (100, "x"), (None, "y"), (3, "c")}


def test_update_of_an_identity_column_is_refused_and_other_columns_update(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(always=False), data=_rows("a", "b"))
    with pytest.raises(IdentityColumnError) as info:
        table.update("v = 'a'", {"id": "id + 100"})
    assert (info.value.column, info.value.reason, info.value.operation) == ("id", "update", "UPDATE")
    assert table.refresh().version == 0
    table.update("v = 'a'", {"v": "'z'"})
    assert sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist()) == [(1, "z"), (2, "b")]
    assert _mark(table) == 2


def test_merge_inserts_get_values_and_updates_keep_them(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(), data=_rows("a", "b"))
    source = pa.table({"v": ["b", "c", "d"], "w": ["B", "C", "D"], "n": [1, 2, 3]})
    (
        table.merge(source, on="t.v = s.v", source_alias="s", target_alias="t")
        .when_matched_update(set={"v": "s.w"})
        .when_not_matched_insert(values={"v": "s.v"})
        .execute()
    )
    got = sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist())
    assert got == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]
    assert _mark(table) == 4
    with pytest.raises(IdentityColumnError) as info:
        table.merge(source, on="t.v = s.v", source_alias="s", target_alias="t").when_matched_update(
            set={"id": "s.n"}
        )
    assert info.value.reason == "update"
    with pytest.raises(IdentityColumnError) as info:
        table.merge(source, on="t.v = s.v", source_alias="s", target_alias="t").when_not_matched_insert(
            values={"id": "s.n", "v": "s.v"}
        ).execute()
    assert (info.value.reason, info.value.operation) == ("explicit insert", "MERGE")
    assert table.refresh().version == 1


@pytest.mark.parametrize("always", [True, False])
def test_merge_update_all_from_a_source_with_the_identity_column_is_refused(
    tmp_path: Path, always: bool
) -> None:
    """Delta: UPDATE SET * expands to the identity column when the source has it, and an
    update of an identity column is refused in both modes (DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED)."""
    table = Table.create(str(tmp_path), _schema(always=always), data=_rows("a", "b"))
    source = pa.table({"id": [100, 200], "v": ["b", "c"]})
    with pytest.raises(IdentityColumnError) as info:
        table.merge(source, on="t.v = s.v", source_alias="s", target_alias="t").when_matched_update_all()
    assert (info.value.column, info.value.reason, info.value.operation) == ("id", "update", "MERGE")
    without_id = pa.table({"v": ["b", "c"]})  # a source without it updates the other columns
    (
        table.merge(without_id, on="t.v = s.v", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    assert sorted((r["id"], r["v"]) for r in table.to_arrow().to_pylist()) == [(1, "a"), (2, "b"), (3, "c")]
    assert _mark(table) == 3


def test_overwrite_transaction_and_write_table_fill_values(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(), data=_rows("a", "b"))
    table.overwrite(_rows("c"))
    assert _ids(table) == [3]
    txn = table.transaction()
    txn.append(_rows("d", "e"))
    txn.commit()
    assert _ids(table) == [3, 4, 5]
    write_table(str(tmp_path), _rows("f"), mode="append")
    assert _ids(table) == [3, 4, 5, 6]
    assert _mark(table) == 6


@pytest.mark.parametrize(
    "field, partition_by, reason",
    [
        (
            pa.field("id", pa.int32(), metadata={"delta.identity.start": "1", "delta.identity.step": "1"}),
            [],
            "type",
        ),
        (
            pa.field("id", pa.int64(), metadata={"delta.identity.start": "1", "delta.identity.step": "0"}),
            [],
            "step",
        ),
        (identity_field("id"), ["id"], "partition column"),
    ],
)
def test_schema_rules_at_create(
    tmp_path: Path, field: pa.Field, partition_by: list[str], reason: str
) -> None:
    schema = pa.schema([field, pa.field("v", pa.string())])
    with pytest.raises(IdentityColumnError) as info:
        Table.create(str(tmp_path), schema, partition_by=partition_by)
    assert (info.value.column, info.value.reason) == ("id", reason)
    assert not Table.exists(str(tmp_path))


def test_identity_field_refuses_step_zero() -> None:
    with pytest.raises(IdentityColumnError) as info:
        identity_field("id", step=0)
    assert info.value.reason == "step"


def test_concurrent_inserts_through_two_handles_both_commit_and_never_collide(tmp_path: Path) -> None:
    Table.create(str(tmp_path), _schema(), data=_rows("a"))
    first, second = Table.open(str(tmp_path)), Table.open(str(tmp_path))
    txn1, txn2 = first.transaction(), second.transaction()
    txn1.append(_rows("b", "c"))
    txn2.append(_rows("d", "e", "f"))
    r2 = txn2.commit()
    r1 = txn1.commit()  # rebased on txn2's mark move: no MetadataChangedException
    assert (r2.version, r1.version, r1.attempts) == (1, 2, 2)
    got = {r["v"]: r["id"] for r in first.to_arrow().to_pylist()}
    assert got == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}
    assert _mark(first) == 6  # the furthest mark: never below a value in the table
    assert first.verify().ok


def test_a_concurrent_non_identity_commit_keeps_the_winners_metadata(tmp_path: Path) -> None:
    Table.create(str(tmp_path), _schema(), data=_rows("a"))
    first, second = Table.open(str(tmp_path)), Table.open(str(tmp_path))
    txn = first.transaction()
    txn.append(_rows("b"))
    second.delete("v = 'a'")  # no metadata: the identity commit rebases on it
    second.append(_rows("c"))  # mark 2 (our txn reserved 2 before: the counter gives c 3)
    txn.commit()
    assert sorted((r["id"], r["v"]) for r in first.to_arrow().to_pylist()) == [(2, "b"), (3, "c")]
    assert _mark(first) == 3
    log = LogStore(str(tmp_path))
    assert LogStore.commit_versions(log.list_log()) == [0, 1, 2, 3]


def _append_in_child(path: str, out: Any) -> None:
    with Table.open(path) as t:
        out.put(t.append(_rows("child")).version)


def test_a_forked_child_reserves_its_own_block_and_the_parent_keeps_using_its_own(
    tmp_path: Path,
) -> None:
    table = Table.create(str(tmp_path), _schema(), data=_rows("a"))  # this process holds a block
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_append_in_child, args=(str(tmp_path), out))
    child.start()
    assert out.get(timeout=60) == 1
    child.join(timeout=60)
    table.append(_rows("parent"))
    got = {r["v"]: r["id"] for r in table.to_arrow().to_pylist()}
    assert got["a"] == 1
    assert got["child"] > 128  # the child reserved a block of its own past the parent's
    # the child's commit (ours: it records the mark as its own) moved the mark past the
    # parent's block, which the parent goes on using: only a foreign writer's mark bounds it
    assert got["parent"] == 2
    assert _mark(table) == got["child"]


def test_a_foreign_mark_bounds_cached_slots_and_is_carried_forward(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), _schema(), data=_rows("a"))  # caches slots 1..128
    snapshot = table.refresh()
    (column,) = identity_columns(snapshot.schema)
    assert (column.high_water_mark, column.own_mark, column.foreign_mark) == (1, 1, None)
    # a foreign writer (Delta Spark: no eventlog.identity record) moves the mark to 40
    foreign = with_high_water_marks(snapshot.metadata.schema_string, {"id": 40})
    txn = table.transaction()
    txn.update_metadata(dataclasses.replace(snapshot.metadata, schema_string=foreign))
    txn.set_operation("WRITE")
    txn.commit()
    table.append(_rows("b"))
    assert {r["v"]: r["id"] for r in table.to_arrow().to_pylist()}["b"] == 41  # past the foreign values
    (column,) = identity_columns(table.refresh().schema)
    assert (column.high_water_mark, column.own_mark, column.foreign_mark) == (41, 41, 40)
    table.append(_rows("c"))  # the foreign mark is carried forward with ours
    (column,) = identity_columns(table.refresh().schema)
    assert (column.high_water_mark, column.own_mark, column.foreign_mark) == (42, 42, 40)


def test_round_to_next_matches_delta() -> None:
    (up,) = identity_columns(_schema(start=10, step=3))
    (down,) = identity_columns(_schema(start=10, step=-3))
    assert [round_to_next(up, v) for v in (10, 11, 13, 14, 5, 9)] == [10, 13, 13, 16, 7, 10]
    assert [round_to_next(down, v) for v in (10, 9, 7, 6, 12)] == [10, 7, 7, 4, 10]


def test_sync_identity_moves_the_mark_to_the_rounded_data_and_generation_resumes_past_it(
    tmp_path: Path,
) -> None:
    table = Table.create(str(tmp_path), _schema(start=1, step=10, always=False), data=_rows("a"))
    table.append(pa.table({"id": pa.array([57], pa.int64()), "v": ["explicit"]}))
    assert _mark(table) == 1  # explicit values do not move it
    result = table.sync_identity("id")
    assert _mark(table) == 61  # 57 rounded to the next value of 1, 11, 21, ...
    assert table.history(1)[0]["operation"] == "CHANGE COLUMN"
    assert result.version == 2
    fresh = Table.open(str(tmp_path))  # a new process would start past the mark
    fresh.append(_rows("b"))
    assert {r["v"]: r["id"] for r in fresh.to_arrow().to_pylist()}["b"] > 61
    with pytest.raises(IdentityColumnError) as info:
        table.sync_identity("v")
    assert (info.value.column, info.value.reason) == ("v", "sync")


def test_a_legacy_writer_6_protocol_is_written(tmp_path: Path) -> None:
    Table.create(str(tmp_path), _schema()).close()
    first = tmp_path / "_delta_log" / f"{0:020d}.json"
    actions = [json.loads(line) for line in first.read_text().splitlines()]
    for action in actions:  # Delta Spark's legacy protocol for identity columns
        if "protocol" in action:
            action["protocol"] = {"minReaderVersion": 1, "minWriterVersion": 6}
        action.get("commitInfo", {}).pop("eventlog.audit", None)
    first.write_text("".join(json.dumps(a) + "\n" for a in actions))
    table = Table.open(str(tmp_path))
    table.append(_rows("a", "b"))
    assert _ids(table) == [1, 2]
    assert (table.refresh().protocol.min_reader_version, table.refresh().protocol.min_writer_version) == (
        1,
        6,
    )
