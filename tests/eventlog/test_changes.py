"""The change data feed read, ``Table.changes`` (Delta's ``table_changes``): rows from cdc files,
adds and removes, deletion vector differences; the range checks, the errors and the commit
timestamps. Commits our writer does not make are written by hand; ``deltalake`` (which
writes change data files) is the peer for tables it writes."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from eventlog import ChangeDataNotRecordedError, InvalidChangeRangeError, Table, VersionNotFoundError
from eventlog.errors import InvalidInputError, UnknownColumnError
from eventlog.files import column_mapping as cm
from eventlog.files.deletion_vectors import inline_descriptor
from eventlog.log.actions import Action, AddCDCFile, AddFile, CommitInfo, encode_commit

CDF = {"delta.enableChangeDataFeed": "true"}
META = ("_change_type", "_commit_version", "_commit_timestamp")


def _rows(table: pa.Table, *drop: str) -> list[dict[str, Any]]:
    """Rows without ``drop``, in a canonical order."""
    keep = [c for c in table.column_names if c not in drop]
    return sorted(table.select(keep).to_pylist(), key=repr)


def _changes(table: pa.Table) -> list[tuple[Any, ...]]:
    """(version, change type, id) of each row, in order."""
    return [(r["_commit_version"], r["_change_type"], r["id"]) for r in table.to_pylist()]


def _data_file(uri: str, name: str, ids: list[int]) -> AddFile:
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), f"{uri}/{name}")
    stats = orjson.dumps({"numRecords": len(ids)}).decode()
    return AddFile(name, {}, os.path.getsize(f"{uri}/{name}"), 0, True, stats)


def _commit(uri: str, version: int, *actions: Action, operation: str = "WRITE", **info: Any) -> None:
    """Write commit ``version`` by hand (as another Delta writer would)."""
    metrics = info.pop("metrics", {})
    commit_info = CommitInfo(1_700_000_000_000 + version, operation, operation_metrics=metrics, extra=info)
    Path(uri, "_delta_log", f"{version:020d}.json").write_bytes(encode_commit([commit_info, *actions]))


def _empty(uri: str, properties: dict[str, str] | None = None) -> Table:
    props = CDF if properties is None else properties
    return Table.create(uri, pa.schema([pa.field("id", pa.int64())]), properties=props)


# --------------------------------------------------------------------------- deltalake's tables


def _deltalake_cdf(path: str, start: int = 0) -> pa.Table:
    return pa.table(DeltaTable(path).load_cdf(starting_version=start).read_all())


def test_changes_equal_deltalake_load_cdf_partitioned(local_uri: str) -> None:
    data = pa.table(
        {"id": pa.array([1, 2, 3, 4], pa.int64()), "p": ["a", "a", "b", "b"], "v": [10, 20, 30, 40]}
    )
    write_deltalake(local_uri, data, partition_by=["p"], configuration=CDF)
    dt_ = DeltaTable(local_uri)
    dt_.delete("id = 1")
    dt_.update(predicate="id = 3", updates={"v": "99"})
    source = pa.table({"id": pa.array([4, 5], pa.int64()), "p": ["b", "a"], "v": [41, 50]})
    (
        dt_.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    write_deltalake(
        local_uri, pa.table({"id": pa.array([6], pa.int64()), "p": ["a"], "v": [60]}), mode="append"
    )
    ours = Table.open(local_uri).changes(0)
    assert ours.column_names == ["id", "p", "v", *META]
    assert ours.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    theirs = _deltalake_cdf(local_uri)
    assert _rows(ours, "_commit_timestamp") == _rows(theirs.select(ours.column_names), "_commit_timestamp")
    assert ("delete", 1) in {(r["_change_type"], r["id"]) for r in ours.to_pylist()}
    assert ours.column("_commit_version").to_pylist() == sorted(ours.column("_commit_version").to_pylist())


def test_changes_from_a_later_start_equal_deltalake(local_uri: str) -> None:
    write_deltalake(local_uri, pa.table({"id": pa.array([1, 2, 3], pa.int64())}), configuration=CDF)
    DeltaTable(local_uri).delete("id = 2")
    write_deltalake(local_uri, pa.table({"id": pa.array([4], pa.int64())}), mode="append")
    ours = Table.open(local_uri).changes(1)
    assert _changes(ours) == [(1, "delete", 2), (2, "insert", 4)]
    assert _rows(ours, "_commit_timestamp") == _rows(
        _deltalake_cdf(local_uri, 1).select(ours.column_names), "_commit_timestamp"
    )


# --------------------------------------------------------------------------- inferred changes


def test_adds_and_removes_without_cdc_are_inserts_and_deletes(local_uri: str) -> None:
    table = _empty(local_uri)
    a = _data_file(local_uri, "a.parquet", [1, 2])
    _commit(local_uri, 1, a)
    b = _data_file(local_uri, "b.parquet", [3])
    _commit(local_uri, 2, a.remove(0), b, operation="DELETE")
    assert _changes(table.changes(1)) == [
        (1, "insert", 1),
        (1, "insert", 2),
        (2, "delete", 1),
        (2, "delete", 2),
        (2, "insert", 3),
    ]


def test_cdc_actions_replace_the_commits_adds_and_removes(local_uri: str) -> None:
    table = _empty(local_uri)
    a = _data_file(local_uri, "a.parquet", [1, 2])
    _commit(local_uri, 1, a)
    kept = _data_file(local_uri, "kept.parquet", [2])
    Path(local_uri, "_change_data").mkdir()
    cdc_rows = pa.table({"id": pa.array([1], pa.int64()), "_change_type": ["delete"]})
    pq.write_table(cdc_rows, f"{local_uri}/_change_data/cdc-1.parquet")
    cdc = AddCDCFile("_change_data/cdc-1.parquet", {}, 10)
    _commit(local_uri, 2, a.remove(0), kept, cdc, operation="DELETE")
    assert _changes(table.changes(2)) == [(2, "delete", 1)]


def test_data_change_false_and_noop_merge_yield_nothing(local_uri: str) -> None:
    table = _empty(local_uri)
    a = _data_file(local_uri, "a.parquet", [1, 2])
    _commit(local_uri, 1, a)
    b = _data_file(local_uri, "b.parquet", [1, 2])
    compacted = AddFile(b.path, {}, b.size, 0, False, b.stats)
    _commit(local_uri, 2, a.remove(0, data_change=False), compacted, operation="OPTIMIZE")
    c = _data_file(local_uri, "c.parquet", [1, 2])
    zero = {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0", "numTargetRowsDeleted": "0"}
    _commit(local_uri, 3, compacted.remove(0), c, operation="MERGE", metrics=zero)
    assert table.changes(2).num_rows == 0
    some = {**zero, "numTargetRowsInserted": "1"}
    d = _data_file(local_uri, "d.parquet", [1, 2, 7])
    _commit(local_uri, 4, c.remove(0), d, operation="MERGE", metrics=some)
    assert [r[1:] for r in _changes(table.changes(4))] == [
        ("delete", 1),
        ("delete", 2),
        ("insert", 1),
        ("insert", 2),
        ("insert", 7),
    ]


def test_deletion_vector_changes_give_only_the_rows_that_differ(local_uri: str) -> None:
    table = _empty(local_uri)
    f = _data_file(local_uri, "f.parquet", [10, 11, 12, 13])
    _commit(local_uri, 1, f)
    first = f.with_deletion_vector(inline_descriptor([0, 2]))
    _commit(local_uri, 2, f.remove(0), first, operation="DELETE")
    second = f.with_deletion_vector(inline_descriptor([0, 1]))
    _commit(local_uri, 3, first.remove(0), second, operation="RESTORE")
    _commit(local_uri, 4, second.remove(0), operation="DELETE")
    assert _changes(table.changes(2)) == [
        (2, "delete", 10),
        (2, "delete", 12),
        (3, "delete", 11),
        (3, "insert", 12),
        (4, "delete", 12),
        (4, "delete", 13),
    ]


def test_an_added_file_with_a_deletion_vector_inserts_its_live_rows(local_uri: str) -> None:
    table = _empty(local_uri)
    f = _data_file(local_uri, "f.parquet", [1, 2, 3])
    _commit(local_uri, 1, f.with_deletion_vector(inline_descriptor([1])))
    assert _changes(table.changes(1)) == [(1, "insert", 1), (1, "insert", 3)]


# --------------------------------------------------------------------------- schema


def test_partition_columns_come_from_the_actions(local_uri: str) -> None:
    table = Table.create(
        local_uri,
        data=pa.table({"id": pa.array([1], pa.int64()), "p": ["x"]}),
        partition_by=["p"],
        properties=CDF,
    )
    Path(local_uri, "_change_data", "p=y").mkdir(parents=True)
    pq.write_table(
        pa.table({"id": pa.array([5], pa.int64()), "_change_type": ["insert"]}),
        f"{local_uri}/_change_data/p=y/c.parquet",
    )
    _commit(local_uri, 1, AddCDCFile("_change_data/p=y/c.parquet", {"p": "y"}, 1))
    assert _rows(table.changes(0), "_commit_timestamp") == [
        {"id": 1, "p": "x", "_change_type": "insert", "_commit_version": 0},
        {"id": 5, "p": "y", "_change_type": "insert", "_commit_version": 1},
    ]


def test_column_mapping_reads_physical_names_under_the_end_versions_names(local_uri: str) -> None:
    props = {**CDF, "delta.columnMapping.mode": "name"}
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    table = Table.create(local_uri, data=data, properties=props)
    physical = cm.physical_schema(table.schema)
    assert physical.names != ["id", "v"]
    cdc_rows = cm.to_physical(pa.table({"id": pa.array([2], pa.int64()), "v": ["b"]}), table.schema)
    cdc_rows = cdc_rows.append_column("_change_type", pa.array(["delete"]))
    Path(local_uri, "_change_data").mkdir()
    pq.write_table(cdc_rows, f"{local_uri}/_change_data/c.parquet")
    _commit(local_uri, 1, AddCDCFile("_change_data/c.parquet", {}, 1), operation="DELETE")
    table.rename_column("v", "w")
    # Across the rename Delta refuses (tests/eventlog/test_changes_schema.py); after it, the
    # files written before it are read by their physical names under the new ones.
    pq.write_table(cdc_rows, f"{local_uri}/_change_data/c3.parquet")  # written before the rename
    _commit(local_uri, 3, AddCDCFile("_change_data/c3.parquet", {}, 1), operation="DELETE")
    rows = table.changes(2, columns=["id", "w", "_change_type", "_commit_version"])
    assert rows.to_pylist() == [{"id": 2, "w": "b", "_change_type": "delete", "_commit_version": 3}]
    assert all(not f.metadata for f in rows.schema)
    before = table.changes(0, 1, columns=["id", "v", "_change_type"])  # in version 1's names
    assert before.to_pylist() == [
        {"id": 1, "v": "a", "_change_type": "insert"},
        {"id": 2, "v": "b", "_change_type": "insert"},
        {"id": 2, "v": "b", "_change_type": "delete"},
    ]


def test_filter_and_columns(local_uri: str) -> None:
    table = _empty(local_uri)
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    table.append(pa.table({"id": pa.array([4], pa.int64())}))
    rows = table.changes(1, filter="_commit_version = 2 OR id = 1", columns=["_commit_version", "id"])
    assert rows.column_names == ["_commit_version", "id"]
    assert rows.to_pylist() == [{"_commit_version": 1, "id": 1}, {"_commit_version": 2, "id": 4}]
    with pytest.raises(UnknownColumnError) as err:
        table.changes(1, columns=["nope"])
    assert err.value.column == "nope"


# --------------------------------------------------------------------------- errors


def test_change_data_not_recorded_at_the_start_or_within_the_range(local_uri: str) -> None:
    table = _empty(local_uri, {})
    table.append(pa.table({"id": pa.array([1], pa.int64())}))
    table.set_properties(CDF)  # version 2
    table.append(pa.table({"id": pa.array([2], pa.int64())}))
    with pytest.raises(ChangeDataNotRecordedError) as err:
        table.changes(1)
    assert (err.value.version, err.value.start, err.value.end) == (1, 1, 3)
    assert "DELTA_MISSING_CHANGE_DATA" in str(err.value)
    assert _changes(table.changes(2)) == [(3, "insert", 2)]
    table.set_properties({"delta.enableChangeDataFeed": "false"})  # version 4
    with pytest.raises(ChangeDataNotRecordedError) as err:
        table.changes(2)
    assert (err.value.version, err.value.start, err.value.end) == (4, 2, 4)
    assert isinstance(err.value, InvalidInputError)


def test_invalid_ranges(local_uri: str) -> None:
    table = _empty(local_uri)
    table.append(pa.table({"id": pa.array([1], pa.int64())}))
    with pytest.raises(InvalidChangeRangeError) as err:
        table.changes(1, 0)
    assert (err.value.start, err.value.end, err.value.reason) == (1, 0, "end before start")
    with pytest.raises(InvalidChangeRangeError) as err:
        table.changes(5)
    assert (err.value.start, err.value.latest, err.value.reason) == (5, 1, "start after latest")
    with pytest.raises(InvalidInputError):
        table.changes()
    with pytest.raises(InvalidInputError):
        table.changes(0, start_timestamp=0)
    assert _changes(table.changes(1, 99)) == [(1, "insert", 1)]  # the end is capped at the latest


# --------------------------------------------------------------------------- timestamps


def _set_mtime(uri: str, version: int, ms: int) -> None:
    os.utime(Path(uri, "_delta_log", f"{version:020d}.json"), ns=(ms * 1_000_000, ms * 1_000_000))


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def test_commit_timestamps_are_monotonized_modification_times(local_uri: str) -> None:
    table = _empty(local_uri)
    for i in (1, 2, 3):
        table.append(pa.table({"id": pa.array([i], pa.int64())}))
    for version, ms in ((0, 1_000_000), (1, 2_000_000), (2, 1_500_000), (3, 3_000_000)):
        _set_mtime(local_uri, version, ms)
    rows = table.changes(1).to_pylist()
    assert [r["_commit_timestamp"] for r in rows] == [_utc(2_000_000), _utc(2_000_001), _utc(3_000_000)]


def test_in_commit_timestamps_date_their_commits(local_uri: str) -> None:
    table = _empty(local_uri)
    a = _data_file(local_uri, "a.parquet", [1])
    _commit(local_uri, 1, a, inCommitTimestamp=1_234_567_890_123)
    assert table.changes(1).column("_commit_timestamp").to_pylist() == [_utc(1_234_567_890_123)]


def test_timestamps_resolve_to_versions_as_delta(local_uri: str) -> None:
    table = _empty(local_uri)
    for i in (1, 2, 3):
        table.append(pa.table({"id": pa.array([i], pa.int64())}))
    for version in range(4):
        _set_mtime(local_uri, version, 1_000_000 * (version + 1))
    assert _changes(table.changes(start_timestamp=1_500_000, end_timestamp=3_500_000)) == [
        (1, "insert", 1),
        (2, "insert", 2),
    ]
    assert _changes(table.changes(start_timestamp=_utc(2_000_000), end_timestamp="1970-01-01T00:50:00")) == [
        (1, "insert", 1),
        (2, "insert", 2),
    ]
    # Both between the same two commits: nothing changed in between.
    assert table.changes(start_timestamp=2_100_000, end_timestamp=2_900_000).num_rows == 0
    with pytest.raises(InvalidChangeRangeError):
        table.changes(start_timestamp=2_900_000, end_timestamp=2_100_000)
    with pytest.raises(VersionNotFoundError):
        table.changes(start_timestamp=4_000_001)
    with pytest.raises(VersionNotFoundError):
        table.changes(0, end_timestamp=999_999)
