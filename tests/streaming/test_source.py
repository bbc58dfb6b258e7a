"""Change selection for streaming reads, on the engine alone (no Spark): offsets, what a
stream emits and in what order, rate limits, start positions, the commits it refuses,
metadata changes with a restart, and data loss."""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Mapping

import pyarrow as pa
import pytest

from eventlog import InvalidInputError, Table
from eventlog.errors import EventlogError, VersionNotFoundError
from eventlog.log.cleanup import cleanup_expired_logs
from streaming import (
    Admission,
    ChangeCommitError,
    ChangeSource,
    DataLossError,
    InvalidOffsetError,
    SourceMetadataChangedError,
    SourceOffset,
    SourceOptions,
    recover,
)
from tests.conftest import SCHEMA, rows

UNLIMITED = Admission()
LogCapture = pytest.LogCaptureFixture


def source(table: Table, read_version: int | None = None, **options: str) -> ChangeSource:
    """A stream's source on its own handle (as in a query: the writers' handles are others)."""
    return ChangeSource(Table.open(table.uri), SourceOptions.parse(options), read_version=read_version)


def drain(
    src: ChangeSource, start: SourceOffset | None = None, admission: Admission | None = None
) -> tuple[list[list[int]], SourceOffset]:
    """Run the stream to the end: the ids of each batch (in emitted order) and the last offset."""
    position = start or src.initial_offset()
    limit = admission or src.options.default_admission()
    batches: list[list[int]] = []
    for _ in range(1000):
        end = src.latest_offset(position, limit)
        if end == position:
            return batches, position
        batches.append(src.read(src.files_between(position, end)).column("id").to_pylist())
        position = end
    raise AssertionError("the stream never caught up")


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


@pytest.fixture
def table(local_uri: str) -> Table:
    t = Table.create(local_uri, SCHEMA)
    for k in range(3):
        t.append(rows([10 * k, 10 * k + 1]))  # versions 1..3, one file each
    return t


# --------------------------------------------------------------------------- offsets


def test_offsets_are_readable_json_stable_across_parsing(table: Table) -> None:
    src = source(table)
    start = src.initial_offset()
    assert start.to_json() == {
        "sourceVersion": 1,
        "tableId": table.snapshot().table_id,
        "version": 3,
        "index": 0,
        "isInitialSnapshot": True,
    }
    assert src.parse_offset(str(start)) == start
    assert src.parse_offset(start.to_json()) == start
    assert source(table).initial_offset() == start  # another run, same table state: same offset


@pytest.mark.parametrize(
    ("offset", "reason"),
    [
        ({"version": 1}, "malformed"),
        ({"tableId": "t", "version": "1"}, "malformed"),
        ({"tableId": "t", "version": -1}, "malformed"),
        ("{not json", "malformed"),
        ({"sourceVersion": 2, "tableId": "t", "version": 1}, "format version 2"),
        ({"tableId": "another", "version": 1}, "deleted and created again"),
    ],
)
def test_bad_offsets_are_refused(table: Table, offset: object, reason: str) -> None:
    src = source(table)
    data = offset if isinstance(offset, str) else {**offset}  # type: ignore[dict-item]
    if isinstance(data, dict) and data.get("tableId") == "t":
        data["tableId"] = src.table_id
    with pytest.raises(InvalidOffsetError) as info:
        src.parse_offset(data)  # type: ignore[arg-type]
    assert reason in info.value.reason
    assert isinstance(info.value, EventlogError)


# --------------------------------------------------------------------------- selection


def test_first_batch_is_the_snapshot_then_every_later_commit_in_order(table: Table) -> None:
    src = source(table)
    start = src.initial_offset()
    end = src.latest_offset(start, UNLIMITED)
    assert end == SourceOffset(src.table_id, 4, 0)  # the batch ends with the snapshot
    assert sorted(src.read(src.files_between(start, end)).column("id").to_pylist()) == [0, 1, 10, 11, 20, 21]
    assert src.latest_offset(end, UNLIMITED) == end  # nothing new
    table.append(rows([30]))
    table.append(rows([40]))
    batches, last = drain(src, end)
    assert batches == [[30, 40]]
    assert last == SourceOffset(src.table_id, 6, 0)


def test_snapshot_files_in_modification_order_and_deletion_vectors_applied(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    t.append(rows([1, 2, 3]))
    t.append(rows([4, 5, 6]))
    t.delete("id IN (2, 5)")
    src = source(t)
    files = src.files_between(src.initial_offset(), src.latest_offset(src.initial_offset(), UNLIMITED))
    assert [f.index for f in files] == [0, 1]
    assert [(f.add.modification_time, f.add.path) for f in files] == sorted(
        (a.modification_time, a.path) for a in t.snapshot().add_files
    )
    assert all(f.add.deletion_vector is not None for f in files)
    assert sorted(src.read(files).column("id").to_pylist()) == [1, 3, 4, 6]


def test_empty_snapshot_moves_on_to_the_commits(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    src = source(t)
    start = src.initial_offset()
    end = src.latest_offset(start, UNLIMITED)
    assert end == SourceOffset(src.table_id, 1, 0)
    assert src.files_between(start, end) == []
    t.append(rows([7]))
    assert flat(drain(src, end)[0]) == [7]


def test_optimize_is_skipped_and_never_emits_rows_twice(table: Table) -> None:
    src = source(table, startingVersion="0")
    table.optimize()  # dataChange=false: rewrites 0..21 into one file
    table.append(rows([30]))
    batches, _ = drain(src)
    assert flat(batches) == [0, 1, 10, 11, 20, 21, 30]


def test_added_files_of_a_commit_are_indexed_in_log_order(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(pa.concat_tables([rows([1], "2024-01-01"), rows([2], "2024-01-02"), rows([3], "2024-01-03")]))
    src = source(t, startingVersion="1")
    files = src.files_between(src.initial_offset(), src.latest_offset(src.initial_offset(), UNLIMITED))
    adds = t.commits_between(1, 1)[0].adds
    assert [(f.version, f.index, f.add.path) for f in files] == [(1, i, a.path) for i, a in enumerate(adds)]


# --------------------------------------------------------------------------- limits


def test_max_files_per_trigger_splits_snapshot_and_commits(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(pa.concat_tables([rows([1], "2024-01-01"), rows([2], "2024-01-02")]))  # v1: 2 files
    t.append(rows([3], "2024-01-03"))  # v2: 1 file
    src = source(t, maxFilesPerTrigger="1")
    assert src.options.default_admission() == Admission(max_files=1)
    position = src.initial_offset()
    ends = []
    for _ in range(4):
        position = src.latest_offset(position, src.options.default_admission())
        ends.append((position.version, position.index, position.initial_snapshot))
    assert ends == [(2, 1, True), (2, 2, True), (3, 0, False), (3, 0, False)]
    t.append(pa.concat_tables([rows([4], "2024-01-01"), rows([5], "2024-01-02")]))  # v3: 2 files
    batches, last = drain(src, position)
    assert batches == [[4], [5]]
    assert (last.version, last.index) == (4, 0)


def test_max_bytes_per_trigger_admits_at_least_one_file(table: Table) -> None:
    size = table.snapshot().add_files[0].size
    one = source(table, startingVersion="0", maxBytesPerTrigger="1")
    assert one.options.default_admission() == Admission(max_bytes=1)
    assert drain(one)[0] == [[0, 1], [10, 11], [20, 21]]
    two = source(table, startingVersion="0", maxBytesPerTrigger=str(size + 1))
    assert drain(two)[0] == [[0, 1, 10, 11], [20, 21]]
    both = source(table, startingVersion="0", maxBytesPerTrigger="1g", maxFilesPerTrigger="2")
    assert both.options.default_admission() == Admission(max_files=2, max_bytes=1024**3)
    assert drain(both)[0] == [[0, 1, 10, 11], [20, 21]]


def test_default_limit_is_1000_files(table: Table) -> None:
    assert source(table).options.default_admission() == Admission(max_files=1000)


def test_available_now_stops_at_the_version_latest_when_prepared(table: Table) -> None:
    src = source(table, startingVersion="1", maxFilesPerTrigger="1")
    assert src.prepare_available_now() == 3
    table.append(rows([99]))
    batches, last = drain(src)
    assert batches == [[0, 1], [10, 11], [20, 21]]
    assert last.version == 4
    assert flat(drain(source(table, startingVersion="4"))[0]) == [99]  # a later run reads it


# --------------------------------------------------------------------------- start positions


def test_starting_version_reads_commits_from_that_version_inclusive(table: Table) -> None:
    assert flat(drain(source(table, startingVersion="2"))[0]) == [10, 11, 20, 21]


def test_starting_version_latest_reads_only_new_commits(table: Table) -> None:
    src = source(table, startingVersion="LATEST")
    assert src.initial_offset() == SourceOffset(src.table_id, 4, 0)
    table.append(rows([50]))
    assert flat(drain(src)[0]) == [50]


def test_starting_version_beyond_the_latest_is_refused(table: Table) -> None:
    with pytest.raises(VersionNotFoundError):
        source(table, startingVersion="9").initial_offset()


def test_starting_timestamp_reads_from_the_first_commit_at_or_after_it(table: Table) -> None:
    history = {h["version"]: h["timestamp"] for h in table.history()}
    at_two = source(table, startingTimestamp=str(_iso(history[2])))
    assert at_two.initial_offset().version == 2
    just_after_two = source(table, startingTimestamp=_iso(history[2] + 1))
    assert just_after_two.initial_offset().version == (3 if history[3] > history[2] else 4)
    assert source(table, startingTimestamp="2000-01-01").initial_offset().version == 0
    future = source(table, startingTimestamp="2999-01-01T00:00:00Z")
    assert future.initial_offset().version == 4  # waits for the next commit


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()


# --------------------------------------------------------------------------- change commits


def test_delete_fails_naming_version_and_operation_after_earlier_rows(table: Table) -> None:
    src = source(table, startingVersion="1")
    table.delete("id = 0")  # v4
    table.append(rows([30]))  # v5
    start = src.initial_offset()
    end = src.latest_offset(start, UNLIMITED)
    assert end == SourceOffset(src.table_id, 4, 0)  # rows before the DELETE come first
    assert sorted(src.read(src.files_between(start, end)).column("id").to_pylist()) == [0, 1, 10, 11, 20, 21]
    with pytest.raises(ChangeCommitError) as info:
        src.latest_offset(end, UNLIMITED)
    err = info.value
    assert (err.version, err.operation, err.removed_files, err.added_files) == (4, "DELETE", 1, 1)
    assert "skipChangeCommits" in str(err)


@pytest.mark.parametrize("change", ["delete", "update", "overwrite", "merge"])
def test_skip_change_commits_skips_every_change(table: Table, change: str) -> None:
    if change == "delete":
        table.delete("id = 0")
    elif change == "update":
        table.update("id = 0", {"x": "42"})
    elif change == "overwrite":
        table.overwrite(rows([5]))
    else:
        merge = table.merge(rows([0, 77]), "target.id = source.id")
        merge.when_matched_update_all().when_not_matched_insert_all().execute()
    table.append(rows([30]))
    with pytest.raises(ChangeCommitError):
        drain(source(table, startingVersion="4"))
    assert flat(drain(source(table, startingVersion="4", skipChangeCommits="true"))[0]) == [30]


def test_ignore_deletes_skips_whole_file_deletes_only(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(pa.concat_tables([rows([1], "2024-01-01"), rows([2, 3], "2024-01-02")]))  # v1
    t.delete("date = '2024-01-01'")  # v2: removes a whole file, adds none
    t.append(rows([4], "2024-01-03"))  # v3
    assert flat(drain(source(t, startingVersion="1", ignoreDeletes="true"))[0]) == [1, 2, 3, 4]
    t.delete("id = 2")  # v4: rewrites the file holding 2 and 3
    with pytest.raises(ChangeCommitError) as info:
        drain(source(t, startingVersion="3", ignoreDeletes="true"))
    assert info.value.version == 4


# --------------------------------------------------------------------------- metadata changes


def test_property_change_fails_then_a_restart_continues_at_the_same_offset(table: Table) -> None:
    src = source(table, startingVersion="1")
    table.set_properties({"team": "ingest"})  # v4
    table.append(rows([30]))  # v5
    batches, position = drain_until_error(src)
    assert flat(batches) == [0, 1, 10, 11, 20, 21]
    with pytest.raises(SourceMetadataChangedError) as info:
        src.latest_offset(position, UNLIMITED)
    err = info.value
    assert (err.version, err.operation, err.read_version) == (4, "SET TBLPROPERTIES", 3)
    assert err.changed == ["properties"]
    assert (err.old_properties, err.new_properties) == ({}, {"team": "ingest"})
    assert "must be restarted" in str(err)
    restarted = source(table)  # the new run takes the latest metadata
    resumed = restarted.parse_offset(str(position))
    assert flat(drain(restarted, resumed)[0]) == [30]


def test_added_column_fails_with_both_schemas_and_the_restart_reads_it(table: Table) -> None:
    src = source(table, startingVersion="3")
    table.add_columns([pa.field("z", pa.string())])  # v4
    table.append(rows([30]).append_column("z", pa.array(["new"])))  # v5
    batches, position = drain_until_error(src)
    assert flat(batches) == [20, 21]
    with pytest.raises(SourceMetadataChangedError) as info:
        src.latest_offset(position, UNLIMITED)
    err = info.value
    assert err.changed == ["schema"]
    assert "z" not in err.old_schema and '"name":"z"' in err.new_schema.replace(" ", "")
    old, new = (
        "id: long, date: string, x: long, y: double",
        "id: long, date: string, x: long, y: double, z: string",
    )
    assert f"[{old}] -> [{new}]" in str(err)
    restarted = source(table)
    assert restarted.schema.names == ["id", "date", "x", "y", "z"]
    end = restarted.latest_offset(position, UNLIMITED)
    assert restarted.read(restarted.files_between(position, end)).column("z").to_pylist() == ["new"]
    again = source(table, startingVersion="1")  # a new stream across the change reads old rows as null
    start = again.initial_offset()
    out = again.read(again.files_between(start, again.latest_offset(start, UNLIMITED)))
    assert out.column("z").to_pylist() == [None] * 6 + ["new"]


def test_schema_merging_append_fails_before_its_rows(table: Table) -> None:
    src = source(table, startingVersion="3")
    table.append(rows([30]).append_column("z", pa.array(["m"])), schema_mode="merge")  # v4: metadata + add
    batches, position = drain_until_error(src)
    assert flat(batches) == [20, 21] and position.version == 4
    with pytest.raises(SourceMetadataChangedError):
        src.latest_offset(position, UNLIMITED)
    restarted = source(table)
    assert flat(drain(restarted, position)[0]) == [30]


def test_metadata_changes_up_to_the_read_version_are_not_errors(table: Table) -> None:
    table.set_properties({"a": "1"})  # v4
    table.append(rows([30]))  # v5
    assert flat(drain(source(table, startingVersion="1"))[0]) == [0, 1, 10, 11, 20, 21, 30]


def drain_until_error(src: ChangeSource) -> tuple[list[list[int]], SourceOffset]:
    position = src.initial_offset()
    batches: list[list[int]] = []
    while True:
        try:
            end = src.latest_offset(position, UNLIMITED)
        except EventlogError:
            return batches, position
        if end == position:
            return batches, position
        batches.append(src.read(src.files_between(position, end)).column("id").to_pylist())
        position = end


# --------------------------------------------------------------------------- data loss


def _clean_up_log(table: Table) -> None:
    """Delta's log cleanup, as if every commit had expired: removes commits 0..2 (below the
    checkpoint at version 3)."""
    assert table.checkpoint() == 3
    removed = cleanup_expired_logs(table.log, 3, cutoff_ms=int(time.time() * 1000) + 60_000)
    assert [int(name[:20]) for name in removed if name.endswith(".json")] == [0, 1, 2]


def test_cleaned_up_commits_fail_with_data_loss(table: Table) -> None:
    _clean_up_log(table)
    src = source(table, startingVersion="1")  # a handle that never read them
    with pytest.raises(DataLossError) as info:
        src.latest_offset(src.initial_offset(), UNLIMITED)
    assert (info.value.kind, info.value.first_version, info.value.last_version) == ("commits", 1, 2)
    assert "failOnDataLoss=false" in str(info.value)


def test_cleaned_up_commits_are_skipped_with_a_warning(table: Table, caplog: LogCapture) -> None:
    _clean_up_log(table)
    src = source(table, startingVersion="1", failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="streaming.source"):
        assert flat(drain(src)[0]) == [20, 21]
    assert any("commits 1..2 were removed" in r.getMessage() for r in caplog.records)


def test_vacuumed_file_fails_or_is_skipped_with_a_warning(table: Table, caplog: LogCapture) -> None:
    first = table.commits_between(2, 2)[0].adds[0].path
    os.remove(os.path.join(table.uri, first))
    with pytest.raises(DataLossError) as info:
        drain(source(table, startingVersion="1"))
    assert (info.value.kind, info.value.first_version, info.value.path) == ("file", 2, first)
    with caplog.at_level(logging.WARNING, logger="streaming.source"):
        assert flat(drain(source(table, startingVersion="1", failOnDataLoss="false"))[0]) == [0, 1, 20, 21]
    assert any(first in r.getMessage() and "VACUUM" in r.getMessage() for r in caplog.records)


def test_optimize_then_vacuum_under_a_lagging_stream_is_data_loss(table: Table) -> None:
    src = source(table, startingVersion="1")
    table.optimize()
    time.sleep(0.05)  # VACUUM keeps what commits of the last millisecond (the retention) touched
    assert table.vacuum(0, enforce_retention=False)
    with pytest.raises(DataLossError):
        drain(src)


# --------------------------------------------------------------------------- restarts


def test_replayed_first_batch_reads_the_snapshot_the_earlier_run_planned(table: Table) -> None:
    old = source(table, maxFilesPerTrigger="2")
    end = old.latest_offset(old.initial_offset(), old.options.default_admission())  # planned, not committed
    table.append(rows([30]))
    new = source(table, maxFilesPerTrigger="2")
    assert new.initial_offset().version == 4  # this run's own snapshot would be v4
    files = new.files_between(new.initial_offset(), new.parse_offset(end.to_json()))
    assert [(f.version, f.index) for f in files] == [(3, 0), (3, 1)]
    rest, _ = drain(new, end)
    assert sorted(flat(rest)) == [20, 21, 30]


# --------------------------------------------------------------------------- options and errors


def test_options_are_case_insensitive_and_checked() -> None:
    opts = SourceOptions.parse({"startingversion": "5", "MAXFILESPERTRIGGER": "7", "failondataloss": "FALSE"})
    assert (opts.starting_version, opts.max_files_per_trigger, opts.fail_on_data_loss) == (5, 7, False)
    assert SourceOptions.parse({"maxBytesPerTrigger": "10mb"}).max_bytes_per_trigger == 10 * 1024**2
    bad: list[Mapping[str, str]] = [
        {"startingVersion": "x"},
        {"startingVersion": "-1"},
        {"startingVersion": "1", "startingTimestamp": "2024-01-01"},
        {"startingTimestamp": "yesterday"},
        {"maxFilesPerTrigger": "0"},
        {"maxBytesPerTrigger": "lots"},
        {"skipChangeCommits": "yes"},
        {"ignoreChanges": "true"},
    ]
    for options in bad:
        with pytest.raises(InvalidInputError):
            SourceOptions.parse(options)


def test_errors_pickle_and_are_recovered_from_wrapped_text() -> None:
    err = SourceMetadataChangedError(
        uri="/t", version=4, operation="ADD COLUMNS", changed=["schema"], old_schema="{}", new_schema="{}",
        old_properties={}, new_properties={"a": "1"}, old_protocol={}, new_protocol={}, read_version=3,
    )  # fmt: skip
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is SourceMetadataChangedError and str(copy) == str(err)
    assert copy.new_properties == {"a": "1"}
    wrapped = f"[STREAM_FAILED] Query terminated with exception: Traceback ...\n{err}\n\tat org.apache..."
    found = recover(wrapped)
    assert isinstance(found, SourceMetadataChangedError) and (found.version, found.read_version) == (4, 3)
    assert recover(RuntimeError("x")) is None
    chained = RuntimeError("outer")
    chained.__cause__ = DataLossError(uri="/t", kind="file", first_version=2, last_version=2, path="p")
    assert isinstance(recover(chained), DataLossError)
