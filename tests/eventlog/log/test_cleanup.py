"""Log cleanup: Delta's metadata cleanup below a checkpoint, never past the audit retention."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from eventlog import InvalidInputError, Table
from eventlog.errors import VersionNotFoundError
from tests.conftest import SCHEMA, rows

DAY = 86_400


def _age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then))


def _build(tmp_path: Path, **props: str) -> Table:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties={"delta.checkpointInterval": "1000", **props})
    for i in range(1, 6):
        t.append(rows([i]))
    for p in (tmp_path / "t" / "_delta_log").iterdir():
        if p.is_file():
            _age(p, 10)  # versions 0..5 are 10 days old
    return t


def _commits(tmp_path: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in (tmp_path / "t" / "_delta_log").glob("*.json"))


def test_nothing_is_deleted_without_an_audit_retention(tmp_path: Path) -> None:
    t = _build(tmp_path, **{"delta.logRetentionDuration": "interval 1 days"})
    t.checkpoint()
    assert _commits(tmp_path) == [0, 1, 2, 3, 4, 5]


def test_expired_commits_below_the_checkpoint_go_and_audits_start_after_them(tmp_path: Path) -> None:
    t = _build(
        tmp_path,
        **{
            "delta.logRetentionDuration": "interval 1 days",
            "eventlog.auditRetentionDuration": "interval 2 days",
        },
    )
    t.append(rows([6]))  # version 6: fresh
    t.checkpoint()  # at 6; deletes 0..5 (older than both retentions)
    assert _commits(tmp_path) == [6]
    assert sorted(Table.open(t.uri).to_arrow().column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]
    with pytest.raises(VersionNotFoundError):
        t.snapshot(3)
    report = Table.open(t.uri).verify()
    assert report.ok and report.checked_from == 6
    assert [h["version"] for h in t.history()] == [6]  # the handle that cleaned up, too
    replay = Table.open(t.uri).replay()
    assert (replay.from_checkpoint, replay.start_version) == (6, 7)
    assert list(replay) == [] and replay.final is not None and replay.final.version == 6


def test_the_audit_retention_bounds_delta_cleanup(tmp_path: Path) -> None:
    t = _build(
        tmp_path,
        **{
            "delta.logRetentionDuration": "interval 1 days",
            "eventlog.auditRetentionDuration": "interval 30 days",
        },
    )
    t.checkpoint()
    assert _commits(tmp_path) == [0, 1, 2, 3, 4, 5]


def test_cleanup_stops_at_the_first_file_still_retained(tmp_path: Path) -> None:
    t = _build(
        tmp_path,
        **{
            "delta.logRetentionDuration": "interval 1 days",
            "eventlog.auditRetentionDuration": "interval 1 days",
        },
    )
    _age(tmp_path / "t" / "_delta_log" / f"{2:020d}.json", 0)  # version 2 is recent
    t.append(rows([6]))
    t.checkpoint()
    assert _commits(tmp_path) == [2, 3, 4, 5, 6]  # contiguous: 3..5 stay behind 2


def test_the_audit_retention_is_validated(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError):
        Table.create(str(tmp_path / "t"), SCHEMA, properties={"eventlog.auditRetentionDuration": "forever"})
