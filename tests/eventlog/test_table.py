"""The table API end to end: writes, reads, time travel, history, errors, recovery."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from decimal import Decimal
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from eventlog import (
    CorruptLogError,
    InvalidInputError,
    IsolationLevel,
    PredicateError,
    SchemaMismatchError,
    Table,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnknownColumnError,
)
from eventlog.errors import (
    AppendOnlyViolationError,
    InvalidTablePropertyError,
    MergeCardinalityError,
    VersionNotFoundError,
)
from eventlog.log.actions import CommitInfo, encode_commit
from eventlog.log.storage import LogStore
from lockstore import EmbeddedSlotStore, SlotClaim
from tests.conftest import SCHEMA, rows, sorted_ids


def _log_files(uri: str) -> list[str]:
    return sorted(os.listdir(os.path.join(uri, "_delta_log")))


def test_create_open_and_round_trip(any_uri: str) -> None:
    t = Table.create(any_uri, SCHEMA, partition_by=["date"])
    assert t.version == 0
    with pytest.raises(TableAlreadyExistsError):
        Table.create(any_uri, SCHEMA)
    r1 = t.append(rows([1, 2], "2024-01-01"))
    r2 = t.append(rows([3], "2024-01-02"))
    assert (r1.version, r2.version) == (1, 2)
    assert r1.metrics["numOutputRows"] == "2"
    other = Table.open(any_uri)
    assert other.version == 2
    assert other.partition_columns == ("date",)
    got = other.to_arrow().sort_by("id")
    assert got.schema == SCHEMA
    assert got.column("id").to_pylist() == [1, 2, 3]
    assert got.column("date").to_pylist() == ["2024-01-01", "2024-01-01", "2024-01-02"]
    assert sorted_ids(other, filter="date = '2024-01-02'") == [3]
    assert other.to_arrow(columns=["id"]).schema.names == ["id"]


def test_open_missing_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError) as info:
        Table.open(str(tmp_path / "nope"))
    assert info.value.uri.endswith("nope")


def test_commit_format_is_delta(local_uri: str) -> None:
    t = Table.create(
        local_uri, SCHEMA, partition_by=["date"], properties={"delta.isolationLevel": "Serializable"}
    )
    t.append(rows([1], "2024-01-01"))
    lines = Path(local_uri, "_delta_log", "00000000000000000001.json").read_text().splitlines()
    actions = [json.loads(line) for line in lines]
    assert list(actions[0]) == ["commitInfo"]
    info = actions[0]["commitInfo"]
    assert info["operation"] == "WRITE" and info["isBlindAppend"] is True
    assert info["readVersion"] == 0 and info["isolationLevel"] == "Serializable"
    assert info["operationParameters"] == {"mode": "Append", "partitionBy": '["date"]'}
    add = actions[1]["add"]
    assert add["partitionValues"] == {"date": "2024-01-01"}
    assert add["dataChange"] is True and add["path"].startswith("date=2024-01-01/")
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 1 and stats["minValues"]["id"] == 1 and stats["nullCount"]["y"] == 0
    v0 = [
        json.loads(line)
        for line in Path(local_uri, "_delta_log", "00000000000000000000.json").read_text().splitlines()
    ]
    assert [next(iter(a)) for a in v0] == ["commitInfo", "protocol", "metaData"]
    assert v0[1]["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert json.loads(v0[2]["metaData"]["schemaString"])["fields"][0] == {
        "name": "id", "type": "long", "nullable": True, "metadata": {}
    }  # fmt: skip


def test_deltalake_reads_our_table_and_we_read_its_writes(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(rows([1, 2], "2024-01-01"))
    t.delete("id = 1")
    t.checkpoint()
    t.append(rows([3], "2024-01-02"))
    dtable = deltalake.DeltaTable(local_uri)
    assert dtable.version() == 3  # the checkpoint is not a version
    assert sorted(dtable.to_pyarrow_table().column("id").to_pylist()) == [2, 3]
    assert [h["operation"] for h in dtable.history()] == ["WRITE", "DELETE", "WRITE", "CREATE TABLE"]
    deltalake.write_deltalake(local_uri, rows([4], "2024-01-03"), mode="append")
    again = Table.open(local_uri)
    assert again.version == 4
    assert sorted_ids(again) == [2, 3, 4]
    t.append(rows([5], "2024-01-03"))  # our handle continues after the foreign commit
    assert t.version == 5 and sorted_ids(t) == [2, 3, 4, 5]


def test_time_travel_by_version_and_timestamp(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    time.sleep(0.01)
    mid = dt.datetime.now(dt.UTC)
    time.sleep(0.01)
    t.append(rows([2]))
    assert sorted_ids(t, version=1) == [1]
    assert sorted_ids(t, version=2) == [1, 2]
    assert t.version_at(mid) == 1
    assert sorted_ids(t, timestamp=mid.isoformat()) == [1]
    assert t.snapshot(1).version == 1
    with pytest.raises(VersionNotFoundError):
        t.snapshot(7)
    with pytest.raises(VersionNotFoundError):
        t.version_at(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    timestamps = [h["timestamp"] for h in reversed(t.history())]
    assert timestamps == sorted(timestamps)


def test_delete_update_and_metrics(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1, 2, 3, 4]))
    t.append(rows([5, 6]))
    res = t.delete("x <= 2 OR id = 6")
    assert res.metrics["numDeletedRows"] == "3" and res.metrics["numRemovedFiles"] == "2"
    assert res.metrics["numCopiedRows"] == "3"
    assert sorted_ids(t) == [3, 4, 5]
    res = t.update("id >= 4", set={"y": "y * 10", "x": "-x"})
    assert res.metrics["numUpdatedRows"] == "2"
    got = {r["id"]: (r["x"], r["y"]) for r in t.to_arrow().to_pylist()}
    assert got == {3: (3, 3.0), 4: (-4, 40.0), 5: (-5, 50.0)}
    assert t.delete("id = 999").metrics["numDeletedRows"] == "0"
    assert sorted_ids(t) == [3, 4, 5]


def test_merge_upsert_and_cardinality(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1, 2, 3]))
    src = pa.table({"id": [2, 3, 4], "date": ["d"] * 3, "x": [20, 30, 40], "y": [0.5, 0.5, 0.5]})
    res = (
        t.merge(src, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete("s.x = 30")
        .when_matched_update(set={"x": "s.x + t.x"})
        .when_not_matched_insert_all()
        .execute()
    )
    assert res.metrics["numTargetRowsDeleted"] == "1"
    assert res.metrics["numTargetRowsUpdated"] == "1"
    assert res.metrics["numTargetRowsInserted"] == "1"
    got = {r["id"]: r["x"] for r in t.to_arrow().to_pylist()}
    assert got == {1: 1, 2: 22, 4: 40}
    dup = pa.table({"id": [1, 1], "date": ["d", "d"], "x": [0, 0], "y": [0.0, 0.0]})
    before = t.version
    with pytest.raises(MergeCardinalityError):
        t.merge(dup, "t.id = s.id", source_alias="s", target_alias="t").when_matched_update_all().execute()
    assert t.version == before


def test_optimize_compacts_and_zorders(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    for i in range(6):
        t.append(rows([i * 2, i * 2 + 1]))
    res = t.optimize()
    assert res.metrics["numRemovedFiles"] == "6" and res.metrics["numAddedFiles"] == "1"
    assert len(t.files()) == 1
    assert sorted_ids(t) == list(range(12))
    info = t.history(1)[0]
    assert info["operation"] == "OPTIMIZE" and info["isBlindAppend"] is False
    snap = t.snapshot()
    assert all(not a.data_change for a in t._read_commit(snap.version, required=True).adds)  # type: ignore[union-attr]
    t.optimize(zorder_by=["x", "y"])
    assert sorted_ids(t) == list(range(12))
    with pytest.raises(UnknownColumnError):
        t.optimize(zorder_by=["nope"])


def test_bad_input_leaves_table_unchanged(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(rows([1, 2]))
    before_log = _log_files(local_uri)
    before_files = sorted(str(p) for p in Path(local_uri).rglob("*.parquet"))
    bad = rows([3]).append_column("extra", pa.array([1]))
    with pytest.raises(SchemaMismatchError) as info:
        t.append(bad)
    assert info.value.columns == ["extra"]
    with pytest.raises(UnknownColumnError) as unk:
        t.delete("nope = 1")
    assert unk.value.column == "nope"
    with pytest.raises(PredicateError):
        t.delete("id = = 1")
    with pytest.raises(UnknownColumnError):
        t.update("id = 1", set={"nope": "1"})
    with pytest.raises(InvalidTablePropertyError) as prop:
        t.set_properties({"delta.isolationLevel": "Snapshot"})
    assert prop.value.allowed == ["Serializable", "WriteSerializable"]
    with pytest.raises(InvalidInputError):
        t.overwrite(rows([9], "2024-02-02"), replace_where="date = '2024-01-01'")
    with pytest.raises(InvalidInputError):
        t.update("id = 1", set={"x": "'not a number'"})
    assert _log_files(local_uri) == before_log
    assert sorted(str(p) for p in Path(local_uri).rglob("*.parquet")) == before_files
    assert sorted_ids(t) == [1, 2]


def test_bad_isolation_level_at_create(local_uri: str) -> None:
    with pytest.raises(InvalidTablePropertyError):
        Table.create(local_uri, SCHEMA, properties={"delta.isolationLevel": "ReadCommitted"})
    assert not Table.exists(local_uri)
    t = Table.create(local_uri, SCHEMA, properties={"delta.isolationLevel": "Serializable"})
    assert t.snapshot().isolation_level is IsolationLevel.SERIALIZABLE


def test_append_only_tables_refuse_deletes(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties={"delta.appendOnly": "true"})
    t.append(rows([1]))
    with pytest.raises(AppendOnlyViolationError):
        t.delete("id = 1")
    assert sorted_ids(t) == [1]


def test_corrupt_line_and_gap_fail_clearly(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    path = Path(local_uri, "_delta_log", "00000000000000000001.json")
    good = path.read_bytes()
    path.write_bytes(good + b'{"add": {"path": \n')
    with pytest.raises(CorruptLogError) as info:
        Table.open(local_uri)
    assert info.value.version == 1 and info.value.line == len(good.splitlines()) + 1
    path.write_bytes(good)
    gap = Path(local_uri, "_delta_log", "00000000000000000003.json")
    gap.write_bytes(encode_commit([CommitInfo(timestamp=1, operation="WRITE")]))
    with pytest.raises(CorruptLogError) as gap_info:
        Table.open(local_uri)
    assert gap_info.value.version == 2


def test_idempotent_writes_skip_repeated_versions(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    counts = []
    for version in (1, 2, 2, 3):
        res = t.append(rows([version]), txn_app_id="job", txn_version=version)
        counts.append(t.to_arrow().num_rows)
        assert res.skipped == (counts[-1] == (counts[-2] if len(counts) > 1 else -1))
    assert counts == [1, 2, 2, 3]
    with pytest.raises(InvalidInputError):
        t.append(rows([9]), txn_app_id="job")


def test_claimed_but_unpublished_slot_is_recovered_by_readers(local_uri: str) -> None:
    """A writer that died between claiming version N and publishing it does not block
    the table: the next reader publishes N from the staged commit."""
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    dead = Table.open(local_uri).transaction()
    dead.append(rows([2]))
    # Do what the commit loop does up to the claim, then "crash".
    from eventlog.txn.attempt import CommitAttempt

    loop = CommitAttempt(dead.table, dead.pending())
    data = loop.bytes(2)
    t.log.stage(loop.staged_name, data)
    slots = EmbeddedSlotStore(os.path.join(local_uri, "_eventlog", "slots"))
    assert slots.claim(t.key, 2, SlotClaim(dead.txn_id, loop.staged_name))
    assert not t.log.commit_exists(2)
    reader = Table.open(local_uri)
    assert reader.version == 2
    assert sorted_ids(reader) == [1, 2]
    assert slots.get(t.key, 2).complete  # type: ignore[union-attr]
    t.append(rows([3]))
    assert t.version == 3


def test_all_common_types_round_trip(any_uri: str) -> None:
    data = pa.table(
        {
            "i": pa.array([1, None], pa.int32()),
            "l": pa.array([2**40, 3], pa.int64()),
            "d": pa.array([1.5, None], pa.float64()),
            "dec": pa.array([Decimal("1.25"), Decimal("-3.50")], pa.decimal128(10, 2)),
            "s": pa.array(["a", "é"], pa.string()),
            "b": pa.array([True, False]),
            "day": pa.array([dt.date(2024, 1, 1), dt.date(1999, 12, 31)]),
            "ts": pa.array([dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC), None], pa.timestamp("us", "UTC")),
            "arr": pa.array([[1, 2], []], pa.list_(pa.int64())),
            "st": pa.array([{"a": 1, "b": "x"}, {"a": None, "b": None}]),
            "m": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())),
            "bin": pa.array([b"\x00\x01", b""], pa.binary()),
        }
    )
    t = Table.create(any_uri, data.schema, partition_by=["day"])
    t.append(data)
    got = Table.open(any_uri).to_arrow().sort_by([("l", "descending")])
    assert got.select(data.schema.names).to_pylist() == data.to_pylist()
    assert sorted(Table.open(any_uri).to_arrow(filter="dec > 0").column("l").to_pylist()) == [2**40]


def test_version_taken_outside_the_slot_store_is_a_lost_race(local_uri: str) -> None:
    """A writer that bypasses the slot store (another Delta library) writes version N after
    our claim of N: we treat N as lost, conflict-check it and commit at N+1."""
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    txn = t.transaction()
    txn.append(rows([2]))
    foreign = [
        CommitInfo(
            timestamp=int(time.time() * 1000), operation="WRITE", is_blind_append=True, txn_id="foreign"
        ),
        *Table.open(local_uri).commits_between(1, 1)[0].adds,
    ]
    assert t.log.write_commit_unguarded(2, encode_commit(foreign))
    result = txn.commit()
    assert result.version == 3 and result.attempts == 2
    assert [h["txnId"] for h in t.history(2)] == [result.txn_id, "foreign"]


def test_claimed_slot_with_lost_staged_file_is_repaired_by_a_writer_once_the_writer_is_gone(
    local_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import eventlog.log.recovery as recovery

    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    slots = EmbeddedSlotStore(os.path.join(local_uri, "_eventlog", "slots"))
    assert slots.claim(t.key, 2, SlotClaim("lost-txn", "lost-txn.json", digest="ab" * 32))  # never staged
    assert Table.open(local_uri).version == 1  # readers see what was published, and write nothing
    with pytest.raises(CorruptLogError) as info:
        Table.open(local_uri).append(rows([3]))  # a writer: the claimant may still be alive
    assert info.value.version == 2 and "lost-txn" in str(info.value)
    monkeypatch.setattr(recovery, "REPAIR_GRACE_SECONDS", 0.0)
    reader = Table.open(local_uri)
    assert reader.version == 1 and not t.log.commit_exists(2)  # still: a read never repairs
    assert not slots.get(t.key, 2).complete  # type: ignore[union-attr]
    assert t.append(rows([3])).version == 3  # the writer resolves version 2, then commits
    repair = t.history(2)[1]
    assert repair["operation"] == "REPAIR" and repair["version"] == 2
    assert repair["operationParameters"]["lostTxnId"] == "lost-txn"
    assert repair["operationParameters"]["lostDigest"] == "ab" * 32
    assert "acceptedLoss" not in repair["operationParameters"]
    assert slots.get(t.key, 2).complete  # type: ignore[union-attr]
    assert sorted_ids(t) == [1, 3]
    report = t.verify()
    assert report.ok and any("never completed (txn lost-txn)" in note for note in report.notes)


def test_commit_version_bounds_of_a_log_listing() -> None:
    names = [
        "00000000000000000007.json",
        "00000000000000000005.checkpoint.parquet",
        "_last_checkpoint",
        "00000000000000000012.json",
        "00000000000000000005.json",
        "00000000000000000006.crc",
        "_staged_commits",
        "0000000000000000000x.json",
        ".00000000000000000013.json.tmp",
    ]
    assert LogStore.commit_version_bounds(names) == (5, 12)
    assert LogStore.commit_version_bounds(names) == (
        LogStore.commit_versions(names)[0],
        LogStore.commit_versions(names)[-1],
    )
    assert LogStore.commit_version_bounds(["_last_checkpoint", "_staged_commits"]) is None


def test_commit_result_says_where_the_time_went(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    first = t.append(rows([1]))
    assert {"stage", "claim", "publish", "total"} <= set(first.timings)
    assert all(v >= 0 for v in first.timings.values())
    assert first.timings["total"] >= first.timings["claim"] + first.timings["publish"]
    assert "check" not in first.timings  # nothing won since its read version
    stale = t.transaction()
    stale.append(rows([2]))
    Table.open(local_uri).append(rows([3]))  # wins in between
    second = stale.commit()
    assert second.version == 3 and second.attempts == 2
    assert {"check", "backoff"} <= set(second.timings)  # the lost first claim cost a re-check
