"""VACUUM in the engine: what it deletes, what it must keep, and the retention check."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from eventlog import InvalidInputError, Table
from tests.conftest import SCHEMA, rows, sorted_ids

WEEK = 7 * 24 * 3600


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def test_vacuum_deletes_only_old_unreferenced_files(local_uri: str) -> None:
    t = Table.create(
        local_uri, SCHEMA, partition_by=["date"], properties={"delta.enableDeletionVectors": "true"}
    )
    t.append(rows([1, 2, 3], "2024-01-01"))
    t.delete("id = 2")  # a deletion vector file the live snapshot needs
    root = Path(local_uri)
    live = {root / f for f in t.files()}
    old_orphan = root / "date=2024-01-01" / "part-orphan-old.parquet"
    young_orphan = root / "date=2024-01-01" / "part-orphan-young.parquet"
    hidden = root / "_eventlog" / "something"
    for f in (old_orphan, young_orphan):
        f.write_bytes(b"x")
    hidden.parent.mkdir(exist_ok=True)
    hidden.write_bytes(b"x")
    for f in [old_orphan, hidden, *live, *root.glob("deletion_vector_*.bin")]:
        _age(f, 2 * WEEK)  # referenced files may be old: they must still stay

    assert t.vacuum(dry_run=True) == [f"{t.uri}/date=2024-01-01/part-orphan-old.parquet"]
    assert old_orphan.exists()
    assert t.vacuum() == [f"{t.uri}/date=2024-01-01/part-orphan-old.parquet"]
    assert not old_orphan.exists() and young_orphan.exists() and hidden.exists()
    assert all(f.exists() for f in live) and list(root.glob("deletion_vector_*.bin"))
    assert sorted_ids(Table.open(local_uri)) == [1, 3]


def test_removed_files_stay_for_the_retention_then_go(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    first = Path(local_uri) / t.files()[0]
    t.overwrite(rows([2]))  # removes the first file: time travel to v1 still reads it
    _age(first, 2 * WEEK)
    assert t.vacuum() == []  # its remove is within the retention
    assert sorted_ids(t, version=1) == [1]
    with pytest.raises(InvalidInputError) as info:
        t.vacuum(retention_hours=0)
    assert "retention" in str(info.value)
    assert first.exists()
    assert t.vacuum(retention_hours=0, enforce_retention=False) == [f"{t.uri}/{first.name}"]
    assert not first.exists() and sorted_ids(t) == [2]


@pytest.mark.parametrize("directory", ["_eventlog/staged", "_delta_log/_staged_commits"])
def test_abandoned_staged_commits_older_than_the_retention_go(local_uri: str, directory: str) -> None:
    """Both where commits are staged and where earlier releases staged them."""
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    staged = Path(local_uri) / directory
    staged.mkdir(exist_ok=True, parents=True)
    old, young = staged / "dead-writer.json", staged / "in-flight.json"
    for f in (old, young):
        f.write_bytes(b'{"commitInfo":{}}\n')
    _age(old, 2 * WEEK)
    expected = [f"{t.uri}/{directory}/dead-writer.json"]
    assert t.vacuum(dry_run=True) == expected and old.exists()
    assert t.vacuum() == expected
    assert not old.exists() and young.exists()
    assert sorted_ids(Table.open(local_uri)) == [1]


def test_vacuum_publishes_a_claimed_commit_before_deleting_old_staged_files(local_uri: str) -> None:
    """A claimed, unpublished version is the commit point of its (dead) writer: VACUUM's
    refresh publishes it from the staged file first, however old that file is."""
    from eventlog.txn.attempt import CommitAttempt
    from lockstore import EmbeddedSlotStore, SlotClaim

    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    dead = Table.open(local_uri).transaction()
    dead.append(rows([2]))
    loop = CommitAttempt(dead.table, dead.pending())
    t.log.stage(loop.staged_name, loop.bytes(2))
    slots = EmbeddedSlotStore(os.path.join(local_uri, "_eventlog", "slots"))
    assert slots.claim(t.key, 2, SlotClaim(dead.txn_id, loop.staged_name))
    _age(Path(t.log.staged_path(loop.staged_name)), 2 * WEEK)
    fresh = Table.handle(local_uri)  # has not read the log yet: nothing recovered so far
    assert fresh.vacuum() == [f"{t.uri}/_eventlog/staged/{loop.staged_name}"]
    reopened = Table.open(local_uri)
    assert reopened.version == 2 and sorted_ids(reopened) == [1, 2]
