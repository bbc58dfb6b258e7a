"""DROP FEATURE (``Table.drop_feature``): Delta's drop-feature protocol — traces removed,
history protected by ``checkpointProtection`` (or truncated), then a protocol downgrade
that fails concurrent writers."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import deltalake
import pytest

from eventlog import FeatureDropError, ProtocolChangedException, Table
from eventlog.log.actions import Protocol
from tests.conftest import SCHEMA, rows, sorted_ids

PROTECTION_KEY = "delta.requireCheckpointProtectionBeforeVersion"


def _table(uri: str, properties: dict[str, str]) -> Table:
    t = Table.create(uri, SCHEMA, properties=properties)
    t.append(rows([1, 2, 3, 4], "2024-01-01"))
    t.append(rows([5, 6, 7, 8], "2024-01-02"))
    return t


def _check_after(t: Table, ids: list[int]) -> None:
    assert sorted_ids(t) == ids
    assert sorted_ids(Table.open(t.uri)) == ids
    assert t.verify().ok
    got = deltalake.DeltaTable(t.uri).to_pyarrow_table().column("id").to_pylist()
    assert sorted(got) == ids


def _features(t: Table) -> set[str]:
    p = t.snapshot().protocol
    return set(p.reader_features or ()) | set(p.writer_features or ())


def test_drop_deletion_vectors_purges_and_protects_checkpoints(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableDeletionVectors": "true"})
    t.delete("id IN (2, 6)")
    result = t.drop_feature("deletionVectors")
    assert result.operation == "DROP FEATURE"
    (info,) = t.history(1)
    assert info["operationParameters"] == {"featureName": "deletionVectors", "truncateHistory": "false"}
    assert all(a.deletion_vector is None for a in t.snapshot().add_files)
    assert "deletionVectors" not in _features(t) and "checkpointProtection" in _features(t)
    assert t.snapshot().protocol.min_reader_version == 1  # no reader feature remains
    assert t.properties["delta.enableDeletionVectors"] == "false"
    assert t.properties[PROTECTION_KEY] == str(result.version)
    ops = [h["operation"] for h in t.history()][:6]
    assert ops == [
        "DROP FEATURE",
        "Empty Commit",
        "Empty Commit",
        "Empty Commit",
        "REORG",
        "SET TBLPROPERTIES",
    ]
    _check_after(t, [1, 3, 4, 5, 7, 8])
    t.append(rows([9], "2024-01-03"))  # still writable
    assert sorted_ids(t)[-1] == 9


def test_drop_v2_checkpoint(local_uri: str) -> None:
    t = _table(local_uri, {"delta.checkpointPolicy": "v2"})
    t.checkpoint()
    t.drop_feature("v2Checkpoint")
    assert t.properties["delta.checkpointPolicy"] == "classic"
    assert "v2Checkpoint" not in _features(t)
    _check_after(t, list(range(1, 9)))


def test_drop_in_commit_timestamps_is_a_writer_feature_drop(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableInCommitTimestamps": "true"})
    before = t.version
    t.drop_feature("inCommitTimestamp")
    assert t.version == before + 2  # the properties off, then the downgrade: no barrier
    assert t.properties["delta.enableInCommitTimestamps"] == "false"
    assert "delta.inCommitTimestampEnablementVersion" not in t.properties
    assert t.snapshot().protocol == Protocol(1, 2)
    _check_after(t, list(range(1, 9)))


def test_drop_check_constraints_only_once_none_remains(local_uri: str) -> None:
    t = _table(local_uri, {})
    t.add_constraint("positive", "id > 0")
    assert t.snapshot().protocol == Protocol(1, 3)
    with pytest.raises(FeatureDropError) as err:
        t.drop_feature("checkConstraints")
    assert (err.value.feature, err.value.reason) == ("checkConstraints", "in use")
    t.drop_constraint("positive")
    t.drop_feature("checkConstraints")
    assert t.snapshot().protocol == Protocol(1, 2)
    _check_after(t, list(range(1, 9)))


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("deletionVectors", "not present"),
        ("changeDataFeed", "not removable"),  # Delta: not a RemovableFeature
        ("appendOnly", "not removable"),
    ],
)
def test_refusals_are_typed(local_uri: str, name: str, reason: str) -> None:
    t = _table(local_uri, {"delta.enableChangeDataFeed": "true"})
    version = t.version
    with pytest.raises(FeatureDropError) as err:
        t.drop_feature(name)
    assert (err.value.feature, err.value.reason) == (name, reason)
    again = pickle.loads(pickle.dumps(err.value))
    assert (again.feature, again.reason) == (name, reason)
    assert t.version == version


def test_truncate_history_waits_for_the_retention(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableDeletionVectors": "true"})
    t.delete("id = 2")
    with pytest.raises(FeatureDropError) as err:
        t.drop_feature("deletionVectors", truncate_history=True)
    assert err.value.reason == "wait for retention"
    with pytest.raises(FeatureDropError) as err:  # traces gone now, but the log keeps them
        t.drop_feature("deletionVectors", truncate_history=True)
    assert err.value.reason == "historical versions exist"
    assert "deletionVectors" in _features(t)


def test_truncate_history_cuts_the_log_older_than_24_hours(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableDeletionVectors": "true"})
    t.delete("id = 2")
    with pytest.raises(FeatureDropError) as err:
        t.drop_feature("deletionVectors", truncate_history=True)  # traces removed now
    assert err.value.reason == "wait for retention"
    log_dir = Path(local_uri) / "_delta_log"
    old = time.time() - 25 * 3600  # the whole history so far is older than a day
    for f in log_dir.iterdir():
        if f.is_file():
            os.utime(f, (old, old))
    contents = sorted_ids(t)
    result = t.drop_feature("deletionVectors", truncate_history=True)
    assert result.operation == "DROP FEATURE" and "deletionVectors" not in _features(t)
    assert "checkpointProtection" not in _features(t)  # truncated, not protected
    kept = sorted(int(f.name[:20]) for f in log_dir.glob("*.json"))
    assert kept[0] > 0 and kept[-1] == result.version  # the day-old commits are gone
    reopened = Table.open(local_uri)
    assert sorted_ids(reopened) == contents and reopened.verify().ok


def test_truncate_history_keeps_what_the_audit_retention_keeps(local_uri: str) -> None:
    t = _table(
        local_uri,
        {"delta.enableDeletionVectors": "true", "eventlog.auditRetentionDuration": "interval 30 days"},
    )
    t.delete("id = 2")
    with pytest.raises(FeatureDropError):
        t.drop_feature("deletionVectors", truncate_history=True)
    old = time.time() - 25 * 3600
    for f in (Path(local_uri) / "_delta_log").iterdir():
        if f.is_file():
            os.utime(f, (old, old))
    with pytest.raises(FeatureDropError) as err:  # the audit retention keeps 30 days
        t.drop_feature("deletionVectors", truncate_history=True)
    assert err.value.reason == "historical versions exist"
    assert (Path(local_uri) / "_delta_log" / f"{0:020d}.json").exists()


def test_truncate_history_of_a_writer_feature_is_refused(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableInCommitTimestamps": "true"})
    with pytest.raises(FeatureDropError) as err:
        t.drop_feature("inCommitTimestamp", truncate_history=True)
    assert err.value.reason == "truncate history not allowed"


def test_a_concurrent_write_fails_with_protocol_changed(local_uri: str) -> None:
    t = _table(local_uri, {"delta.enableInCommitTimestamps": "true"})
    t.set_properties({"delta.enableInCommitTimestamps": "false"})
    txn = t.transaction()
    txn.append(rows([9], "2024-01-03"))
    Table.open(local_uri).drop_feature("inCommitTimestamp")
    with pytest.raises(ProtocolChangedException):
        txn.commit()
    assert sorted_ids(t) == list(range(1, 9))
