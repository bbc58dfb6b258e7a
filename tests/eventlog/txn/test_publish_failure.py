"""A storage failure while publishing a commit whose slot was already granted. The claim and
the staged commit decide the version (readers publish it from the staged file), so the
commit has landed: as Delta's external log stores do, the writer reports success, keeps the
staged commit and the data files, and the next reader makes the version visible. Nothing
is lost, and a retry by the caller would not be needed (it would duplicate)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from eventlog import Table
from eventlog.log.storage import LogStore
from tests.conftest import SCHEMA, rows


def _failing_publish(monkeypatch: pytest.MonkeyPatch, times: int = 1) -> list[int]:
    publish = LogStore.publish
    failed: list[int] = []

    def flaky(self: LogStore, version: int, staged_name: str, data: bytes) -> bool:
        if len(failed) < times:
            failed.append(version)
            raise OSError(errno.ENOSPC, "No space left on device")
        return publish(self, version, staged_name, data)

    monkeypatch.setattr(LogStore, "publish", flaky)
    return failed


@pytest.mark.parametrize("group_commit", [False, True])
def test_a_failed_publish_after_the_claim_is_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_commit: bool
) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA).append(rows([1, 2]))
    t = Table.open(uri, group_commit=group_commit)
    failed = _failing_publish(monkeypatch)
    result = t.append(rows([3]))
    assert failed == [2] and result.version == 2
    monkeypatch.undo()
    fresh = Table.open(uri)
    assert fresh.version == 2  # the reader published the claimed version from its staged commit
    assert sorted(fresh.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert fresh.verify().ok
    assert fresh.append(rows([4])).version == 3


def test_a_publish_that_keeps_failing_leaves_the_version_to_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA)
    _failing_publish(monkeypatch, times=100)
    assert t.append(rows([7])).version == 1
    assert [p.name for p in (Path(uri) / "_delta_log").glob("*.json")] == ["00000000000000000000.json"]
    assert len(list((Path(uri) / "_eventlog" / "staged").iterdir())) == 1  # kept for the readers
    monkeypatch.undo()
    fresh = Table.open(uri)
    assert sorted(fresh.to_arrow().column("id").to_pylist()) == [7]
    assert fresh.verify().ok and fresh.append(rows([8])).version == 2


def test_a_checkpoint_that_fails_after_the_commit_does_not_undo_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint written after a commit is an optimization: when storage refuses it,
    the commit stands, its files stay, and the writer is told it committed (Delta's
    postCommit logs a failed checkpoint and goes on)."""
    from eventlog.table import handle

    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, properties={"delta.checkpointInterval": "2"})
    t.append(rows([1]))

    def no_space(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(handle, "write_snapshot_checkpoint", no_space)
    result = t.append(rows([2]))  # version 2: a checkpoint is due
    assert result.version == 2
    monkeypatch.undo()
    fresh = Table.open(uri)
    assert sorted(fresh.to_arrow().column("id").to_pylist()) == [1, 2]
    assert fresh.verify().ok
    assert not list((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))
    assert fresh.append(rows([3])).version == 3


def test_a_staged_file_that_cannot_be_deleted_after_the_commit_does_not_fail_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting the staged commit once it is published is cleanup: when storage refuses,
    the commit is still reported (a caller that retried would write it twice)."""
    import os

    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA)
    unlink = os.unlink

    def refuse_staged(path: str, *args: object, **kwargs: object) -> None:
        if "_eventlog/staged" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", refuse_staged)
    assert t.append(rows([1])).version == 1
    monkeypatch.undo()
    fresh = Table.open(uri)
    assert fresh.to_arrow().column("id").to_pylist() == [1] and fresh.verify().ok
