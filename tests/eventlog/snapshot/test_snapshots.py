"""Snapshots as projections: immutable values, checkpoints equal to a full replay."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eventlog import Table
from eventlog.log.checkpoint import read_checkpoint
from eventlog.snapshot import Snapshot
from tests.conftest import SCHEMA, rows, sorted_ids


def _full_replay(table: Table) -> Snapshot:
    return Snapshot.from_commits(table.uri, table.commits_between(0, table.version))


def test_snapshots_are_immutable_values(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    before = t.snapshot()
    files_before = dict(before.files)
    t.append(rows([2]))
    after = t.snapshot()
    assert before.version == 1 and after.version == 2
    assert dict(before.files) == files_before  # the old value did not change
    assert len(after.files) == 2
    with pytest.raises(TypeError):
        before.files[("x", None)] = next(iter(files_before.values()))  # type: ignore[index]


def test_checkpoint_fold_equals_full_replay(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties={"delta.checkpointInterval": "5"})
    for i in range(12):
        t.append(rows([i]))
        if i % 4 == 3:
            t.delete(f"id = {i - 1}")
    assert sorted(p.name for p in Path(local_uri, "_delta_log").glob("*.checkpoint.parquet")) == [
        "00000000000000000005.checkpoint.parquet",
        "00000000000000000010.checkpoint.parquet",
        "00000000000000000015.checkpoint.parquet",
    ]
    reopened = Table.open(local_uri).snapshot()
    replay = _full_replay(t)
    assert reopened.version == replay.version == 15
    assert reopened.files == replay.files
    assert reopened.metadata == replay.metadata and reopened.protocol == replay.protocol
    assert reopened.txns == replay.txns
    assert sorted_ids(Table.open(local_uri)) == [0, 1, 3, 4, 5, 7, 8, 9, 11]
    # Time travel to a version between checkpoints also folds from the right one.
    assert (
        Table.open(local_uri).snapshot(7).files == Snapshot.from_commits(t.uri, t.commits_between(0, 7)).files
    )


def test_corrupt_checkpoint_falls_back_to_an_older_one_or_replay(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, properties={"delta.checkpointInterval": "3"})
    for i in range(7):
        t.append(rows([i]))
    newest = Path(local_uri, "_delta_log", "00000000000000000006.checkpoint.parquet")
    newest.write_bytes(b"not parquet")
    assert sorted_ids(Table.open(local_uri)) == list(range(7))
    Path(local_uri, "_delta_log", "00000000000000000003.checkpoint.parquet").write_bytes(b"junk")
    assert sorted_ids(Table.open(local_uri)) == list(range(7))


def test_checkpoint_expires_old_tombstones(local_uri: str) -> None:
    t = Table.create(
        local_uri, SCHEMA, properties={"delta.deletedFileRetentionDuration": "interval 1 second"}
    )
    t.append(rows([1]))
    t.delete("id = 1")
    assert len(t.snapshot().tombstones) == 1
    kept = t.checkpoint()
    assert len(read_checkpoint(t.log.fs, t.log.log_dir, kept).removes) == 1
    time.sleep(1.1)
    t.append(rows([2]))
    expired = t.checkpoint()
    assert list(read_checkpoint(t.log.fs, t.log.log_dir, expired).removes) == []


def test_lazy_fold_across_many_advances_equals_full_replay(local_uri: str) -> None:
    """Advancing records commits lazily and folds every 256 links; the file map a handle
    sees after hundreds of commits equals a replay from version 0, and older snapshots
    taken along the way keep their own state."""
    t = Table.create(local_uri, SCHEMA, properties={"delta.checkpointInterval": "100000"})
    taken = {}
    for i in range(600):
        t.append(rows([i]))
        if i % 50 == 49:
            t.delete(f"id = {i - 10}")
        if i in (100, 300, 599):
            taken[t.version] = t.snapshot()
    for version, snap in taken.items():
        assert snap.version == version
        assert snap.files == Snapshot.from_commits(t.uri, t.commits_between(0, version)).files
    assert len(t.snapshot().files) == 600 - 12
