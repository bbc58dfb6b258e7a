"""checkpointProtection: log cleanup keeps the history before
``delta.requireCheckpointProtectionBeforeVersion`` unless Delta's rules let it go (in one go
up to that version, up to a checkpoint, or over protocols this library supports), and no
checkpoint is written at a version whose protocol this library cannot write.

The table is what Delta Spark's DROP FEATURE leaves: a writer feature this library lacks
(``someDroppedFeature``) in versions 2..3, dropped at version 4, which adds the
``checkpointProtection`` feature with the protected version 4.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import fsspec
import pytest

from eventlog import Table
from eventlog.errors import UnsupportedProtocolError
from eventlog.log.actions import CommitInfo, Metadata, Protocol, encode_commit
from eventlog.log.checkpoint import CheckpointState, write_checkpoint
from eventlog.log.cleanup import PROTECTION_KEY, CheckpointProtection, cleanup_expired_logs
from tests.conftest import SCHEMA, rows

DAY = 86_400
RETENTION = {
    "delta.logRetentionDuration": "interval 1 days",
    "eventlog.auditRetentionDuration": "interval 1 days",
}
BASE = ("appendOnly", "invariants")


def _commit(t: Table, *actions: Protocol | Metadata) -> None:
    """A commit of another Delta writer (outside our version slots)."""
    version = t.refresh().version + 1
    info = CommitInfo(timestamp=int(time.time() * 1000), operation="DROP FEATURE", txn_id="delta-spark")
    assert t.log.write_commit_unguarded(version, encode_commit([info, *actions]))


def _protected_table(uri: str, *, protect: bool = True, before: int = 4) -> Table:
    t = Table.create(uri, SCHEMA, properties={"delta.checkpointInterval": "1000", **RETENTION})
    t.append(rows([1]))  # 1
    _commit(t, Protocol(1, 7, None, (*BASE, "someDroppedFeature")))  # 2
    _commit(t)  # 3: written by the writer that knows the feature
    features = (*BASE, "checkpointProtection") if protect else BASE
    metadata = t.refresh().metadata
    config = {**metadata.configuration, PROTECTION_KEY: str(before)}
    _commit(t, Protocol(1, 7, None, features), dataclasses.replace(metadata, configuration=config))  # 4
    t = Table.open(uri)
    t.append(rows([5]))  # 5
    t.append(rows([6]))  # 6
    return t


def _age(uri: str, versions: range) -> None:
    then = time.time() - 10 * DAY
    for p in (Path(uri) / "_delta_log").iterdir():
        if p.name[:20].isdigit() and int(p.name[:20]) in versions:
            os.utime(p, (then, then))


def _commits(uri: str) -> list[int]:
    return sorted(
        int(p.name[:20]) for p in (Path(uri) / "_delta_log").glob("*.json") if ".checkpoint." not in p.name
    )


def _ids(uri: str) -> list[int]:
    return sorted(Table.open(uri).to_arrow().column("id").to_pylist())


def test_history_with_a_protocol_we_cannot_write_is_kept(local_uri: str) -> None:
    t = _protected_table(local_uri)
    _age(local_uri, range(2))  # would leave version 2 first: its protocol is not ours to write
    assert t.checkpoint() == 6
    assert _commits(local_uri) == list(range(7))
    _age(local_uri, range(3))  # 0..2 (read fine), 3 first kept: not writable here either
    t.checkpoint()
    assert _commits(local_uri) == list(range(7))


def test_history_before_the_protected_version_goes_in_one_go(local_uri: str) -> None:
    t = _protected_table(local_uri)
    _age(local_uri, range(4))  # 0..3: everything before the protected version 4
    t.checkpoint()
    assert _commits(local_uri) == [4, 5, 6]
    assert _ids(local_uri) == [1, 5, 6]
    assert Table.open(local_uri).verify(allow_unguarded=True).ok


def test_cleanup_up_to_an_existing_checkpoint_is_allowed(local_uri: str) -> None:
    t = _protected_table(local_uri)
    # The writer that knew the feature checkpointed version 2 (we cannot: see below).
    snap = t.snapshot(2)
    state = CheckpointState(2, snap.protocol, snap.metadata, snap.live_files, snap.tombstone_files, (), ())
    write_checkpoint(fsspec.filesystem("file"), t.log.log_dir, state)
    _age(local_uri, range(2))
    t.checkpoint()
    assert _commits(local_uri) == [2, 3, 4, 5, 6]
    assert _ids(local_uri) == [1, 5, 6]


def test_cleanup_over_protocols_we_support_is_allowed(local_uri: str) -> None:
    t = _protected_table(local_uri)
    _age(local_uri, range(1))  # version 0 goes, 1 is kept: both protocols are ours
    t.checkpoint()
    assert _commits(local_uri) == [1, 2, 3, 4, 5, 6]


def test_without_the_feature_the_property_protects_nothing(local_uri: str) -> None:
    t = _protected_table(local_uri, protect=False)
    _age(local_uri, range(2))
    t.checkpoint()
    assert _commits(local_uri) == [2, 3, 4, 5, 6]


def test_commits_go_before_checkpoints(local_uri: str) -> None:
    t = _protected_table(local_uri)
    snap = t.snapshot(1)
    state = CheckpointState(1, snap.protocol, snap.metadata, snap.live_files, snap.tombstone_files, (), ())
    write_checkpoint(fsspec.filesystem("file"), t.log.log_dir, state)
    assert t.checkpoint(t.snapshot(5)) == 5  # nothing old enough yet
    _age(local_uri, range(4))
    protection = CheckpointProtection(4, lambda protocol, write: True)
    deleted = cleanup_expired_logs(t.log, 5, int(time.time() * 1000) - DAY * 1000, protection=protection)
    assert deleted == [*(f"{v:020d}.json" for v in range(4)), f"{1:020d}.checkpoint.parquet"]


def test_no_checkpoint_at_a_version_whose_protocol_we_cannot_write(local_uri: str) -> None:
    t = _protected_table(local_uri)
    for version in (2, 3):
        with pytest.raises(UnsupportedProtocolError) as info:
            t.checkpoint(t.snapshot(version))
        assert info.value.features == ["someDroppedFeature"]
    assert not list((Path(local_uri) / "_delta_log").glob("*.checkpoint*"))
