"""The conflict checker's identity rule (pure functions): a winner that only moved identity
high-water marks does not fail a concurrent insert unless it may have generated values in
the insert's reserved range (a foreign writer's mark reached it), and the staged metadata
is rebased on the winner's with the furthest marks."""

from __future__ import annotations

import dataclasses

import orjson
import pyarrow as pa
import pytest

from eventlog import IdentityColumnError, identity_field
from eventlog.errors import MetadataChangedException
from eventlog.files.identity import identity_columns, with_high_water_marks
from eventlog.files.schema import from_spark_schema_json, to_spark_schema_json
from eventlog.log.actions import CommitInfo, Metadata, Protocol
from eventlog.log.commit import Commit
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.txn.conflicts import ReadSet, TransactionSummary, WinningCommit, check_conflicts
from eventlog.txn.identity import (
    IdentityRange,
    only_marks_changed,
    recorded_ranges,
    restage_metadata,
    stamp_commit_info,
)

UP = pa.schema([identity_field("id"), identity_field("down", start=0, step=-2), ("v", pa.string())])
READ = Metadata(id="t1", schema_string=with_high_water_marks(to_spark_schema_json(UP), {"id": 10}))


def marks(**values: int) -> Metadata:
    return dataclasses.replace(READ, schema_string=with_high_water_marks(READ.schema_string, values))


def summary(*ranges: IdentityRange, metadata: Metadata | None = None) -> TransactionSummary:
    return TransactionSummary(
        table="/t",
        read_version=4,
        read_protocol=Protocol(1, 6),
        read_metadata=READ,
        partition_schema=pa.schema([]),
        read_set=ReadSet(),
        isolation_level=IsolationLevel.WRITE_SERIALIZABLE,
        is_blind_append=True,
        metadata=metadata,
        identity=tuple(ranges),
    )


def winner(metadata: Metadata, *ranges: IdentityRange, version: int = 5) -> WinningCommit:
    info = CommitInfo(timestamp=1, operation="WRITE", is_blind_append=True)
    info = stamp_commit_info(info, ranges, only_marks=True)
    return WinningCommit.of(Commit(version, (info, metadata)))


def test_a_winner_of_ours_never_conflicts_even_when_its_mark_passed_our_range() -> None:
    ours = IdentityRange("id", 11, 20)
    theirs = IdentityRange("id", 21, 40)
    rebased = check_conflicts(summary(ours), winner(marks(id=40), theirs))
    assert rebased.read_metadata == marks(id=40)


def test_a_foreign_winner_below_our_range_does_not_conflict() -> None:
    ours = IdentityRange("id", 31, 35)  # our counter was already past the foreign values
    rebased = check_conflicts(summary(ours), winner(marks(id=30)))
    assert rebased.read_metadata == marks(id=30)


def test_a_foreign_winner_whose_mark_reached_our_range_conflicts() -> None:
    ours = IdentityRange("id", 11, 20)
    with pytest.raises(MetadataChangedException) as info:
        check_conflicts(summary(ours), winner(marks(id=11), version=7))
    assert info.value.winning_version == 7
    assert "identity column id" in info.value.detail


def test_negative_step_compares_downwards() -> None:
    ours = IdentityRange("down", -20, -30)
    assert check_conflicts(summary(ours), winner(marks(down=-18))).read_metadata == marks(down=-18)
    with pytest.raises(MetadataChangedException):
        check_conflicts(summary(ours), winner(marks(down=-20)))


def test_a_transaction_without_identity_values_adopts_a_marks_only_winner() -> None:
    assert check_conflicts(summary(), winner(marks(id=99))).read_metadata == marks(id=99)


def test_a_real_metadata_change_still_conflicts_with_a_marks_only_winner() -> None:
    mine = dataclasses.replace(READ, configuration={"delta.appendOnly": "true"})
    with pytest.raises(MetadataChangedException):
        check_conflicts(summary(IdentityRange("id", 11, 11), metadata=mine), winner(marks(id=12)))


def test_a_winner_that_changes_more_than_marks_conflicts_as_in_delta() -> None:
    renamed = dataclasses.replace(
        marks(id=12), schema_string=marks(id=12).schema_string.replace('"v"', '"w"')
    )
    assert not only_marks_changed(READ, renamed)
    with pytest.raises(MetadataChangedException):
        check_conflicts(summary(IdentityRange("id", 50, 60)), winner(renamed, IdentityRange("id", 11, 12)))
    described = dataclasses.replace(marks(id=12), description="new")
    with pytest.raises(MetadataChangedException):
        check_conflicts(summary(IdentityRange("id", 50, 60)), winner(described, IdentityRange("id", 11, 12)))


def test_restage_takes_the_furthest_marks_and_keeps_the_winners_other_fields() -> None:
    base = dataclasses.replace(marks(id=40, down=-50), configuration={"k": "v"})
    staged = restage_metadata(base, [IdentityRange("id", 11, 20), IdentityRange("down", -2, -10)])
    columns = {
        c.name: c.high_water_mark for c in identity_columns(from_spark_schema_json(staged.schema_string))
    }
    assert columns == {"id": 40, "down": -50}  # never moved back
    staged = restage_metadata(base, [IdentityRange("id", 41, 45), IdentityRange("down", -52, -60)])
    columns = {
        c.name: c.high_water_mark for c in identity_columns(from_spark_schema_json(staged.schema_string))
    }
    assert columns == {"id": 45, "down": -60}
    assert dataclasses.replace(staged, schema_string=base.schema_string) == base
    fields = orjson.loads(staged.schema_string)["fields"]
    assert fields[0]["metadata"]["delta.identity.start"] == 1


def test_recorded_ranges_round_trip_and_foreign_commits_have_none() -> None:
    info = stamp_commit_info(
        CommitInfo(timestamp=1, operation="WRITE"),
        [IdentityRange("id", 1, 5), IdentityRange("id", 9, 9)],
        only_marks=False,
    )
    assert "tags" not in info.extra
    parsed = CommitInfo.from_json(orjson.loads(orjson.dumps(info.to_json())))
    assert recorded_ranges(parsed) == [IdentityRange("id", 1, 5), IdentityRange("id", 9, 9)]
    assert recorded_ranges(CommitInfo(timestamp=1, operation="WRITE")) is None


def test_identity_field_refuses_non_integer_start() -> None:
    with pytest.raises(IdentityColumnError) as info:
        identity_field("id", start=1.5)  # type: ignore[arg-type]
    assert info.value.reason == "type"
