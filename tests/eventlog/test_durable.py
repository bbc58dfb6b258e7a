"""Durable mode (eventlog.log.durable): what is fsynced before a commit is acknowledged.

``os.fsync`` is wrapped to record, for every call, the path synced and, for a directory,
its entries at that moment: a directory sync makes exactly those entries durable. The
tests check, per step, that each new file's content and each new entry (the data file,
the staged commit, the slot claim, the published commit, new directories) was synced
before the step returned, and in the order a power loss needs (the staged commit before
the claim that names it). The power-loss simulation itself is
tests/faults/test_power_loss.py.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import Table, write_table
from eventlog.errors import CorruptLogError
from eventlog.log.durable import DurableLocalFileSystem, is_durable
from eventlog.log.storage import commit_file_name
from lockstore import LocalFileSlotStore
from tests.support.fsyncs import Synced, record_fsyncs


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Synced:
    return record_fsyncs(monkeypatch)


def _rows(*xs: int) -> pa.Table:
    return pa.table({"x": pa.array(xs, pa.int64())})


def _data_files(root: Path) -> set[Path]:
    return set(root.glob("*.parquet"))


def _slot_dir(root: Path) -> Path:
    return root / "_eventlog" / "slots" / "table"


def test_create_syncs_every_new_directory_and_file(tmp_path: Path, synced: Synced) -> None:
    root = tmp_path / "a" / "b"
    table = Table.create(root, data=_rows(1, 2), durable=True)
    assert table.log.durable and table.version == 0
    # The directories Table.create made: each one's entry synced into its parent.
    for made in (tmp_path / "a", root, root / "_delta_log", root / "_eventlog" / "staged", _slot_dir(root)):
        assert synced.entry_durable(made) >= 0, made
    (data,) = _data_files(root)
    assert synced.file_synced(data) >= 0
    assert synced.entry_durable(data) > synced.file_synced(data)
    assert synced.entry_durable(root / "_delta_log" / commit_file_name(0)) >= 0
    assert synced.entry_durable(_slot_dir(root) / f"{0:020d}.slot") >= 0
    assert synced.entry_durable(_slot_dir(root) / "_table_id") >= 0


def test_append_syncs_before_it_returns_in_commit_order(tmp_path: Path, synced: Synced) -> None:
    root = tmp_path / "t"
    table = Table.create(root, data=_rows(1), durable=True)
    before = _data_files(root)
    synced.calls.clear()
    assert table.append(_rows(2, 3)).version == 1
    (data,) = _data_files(root) - before
    staged = [p for p in synced.files() if "/_eventlog/staged/" in p]
    assert len(staged) == 1  # the staged commit (deleted after the publish)
    staged_entry = synced.entry_durable(staged[0])
    claim = synced.entry_durable(_slot_dir(root) / f"{1:020d}.slot")
    published = synced.entry_durable(root / "_delta_log" / commit_file_name(1))
    # Data file and its entry, then the staged commit and its entry, then the claim that
    # names it (the commit point), then the published commit: each durable before the next.
    assert 0 <= synced.file_synced(data) < synced.entry_durable(data) < synced.file_synced(staged[0])
    assert synced.file_synced(staged[0]) < staged_entry < claim < published
    # The cost: data file, table dir, staged file, staged dir, claim dir, _delta_log, and
    # the slot dir again for the completion marker.
    assert len(synced.calls) == 7
    assert sorted(Table.open(root).to_arrow().column("x").to_pylist()) == [1, 2, 3]


def test_delete_with_deletion_vectors_syncs_the_vector_file(tmp_path: Path, synced: Synced) -> None:
    root = tmp_path / "dv"
    table = Table.create(
        root, data=_rows(1, 2, 3), properties={"delta.enableDeletionVectors": "true"}, durable=True
    )
    synced.calls.clear()
    table.delete("x = 2")
    (vector,) = root.glob("deletion_vector_*.bin")
    assert 0 <= synced.file_synced(vector) < synced.entry_durable(vector)
    assert synced.entry_durable(vector) < synced.entry_durable(root / "_delta_log" / commit_file_name(1))
    assert sorted(Table.open(root).to_arrow().column("x").to_pylist()) == [1, 3]


def test_checkpoint_is_synced_before_it_is_renamed_in(tmp_path: Path, synced: Synced) -> None:
    root = tmp_path / "cp"
    table = Table.create(root, data=_rows(1), durable=True)
    synced.calls.clear()
    assert table.checkpoint() == 0
    log_dir = root / "_delta_log"
    checkpoint = log_dir / f"{0:020d}.checkpoint.parquet"
    temps = [p for p in synced.files() if os.path.dirname(p) == os.fspath(log_dir)]
    # The two temp files (checkpoint, pointer) synced whole, then renamed into a synced dir.
    assert len(temps) == 2 and all(os.path.basename(p).startswith(".") for p in temps)
    assert synced.entry_durable(checkpoint) > synced.file_synced(temps[0])
    assert synced.entry_durable(log_dir / "_last_checkpoint") > synced.file_synced(temps[1])


def test_open_durable_syncs_what_its_writes_make(tmp_path: Path, synced: Synced) -> None:
    Table.create(tmp_path / "o", data=_rows(1))
    assert synced.calls == []
    table = Table.open(tmp_path / "o", durable=True)
    assert is_durable(table.log.fs) and isinstance(table.slots, LocalFileSlotStore)
    table.append(_rows(2))
    assert synced.entry_durable(tmp_path / "o" / "_delta_log" / commit_file_name(1)) >= 0
    assert synced.entry_durable(_slot_dir(tmp_path / "o") / f"{1:020d}.slot") >= 0


def test_write_table_durable(tmp_path: Path, synced: Synced) -> None:
    write_table(tmp_path / "w", _rows(1), durable=True)
    result = write_table(tmp_path / "w", _rows(2), durable=True)
    assert result.version == 1
    assert synced.entry_durable(tmp_path / "w" / "_delta_log" / commit_file_name(1)) >= 0


def test_default_mode_syncs_nothing(tmp_path: Path, synced: Synced) -> None:
    table = Table.create(tmp_path / "d", data=_rows(1, 2), properties={"delta.enableDeletionVectors": "true"})
    table.append(_rows(3))
    table.delete("x = 1")
    table.checkpoint()
    assert not table.log.durable
    assert synced.calls == []
    assert sorted(Table.open(tmp_path / "d").to_arrow().column("x").to_pylist()) == [2, 3]


def test_object_stores_need_nothing(synced: Synced) -> None:
    # A PUT is durable when acknowledged (the memory file system stands in for one here).
    table = Table.create(f"memory://durable-{uuid.uuid4().hex}/t", data=_rows(1), durable=True)
    table.append(_rows(2))
    assert not table.log.durable and not isinstance(table.log.fs, DurableLocalFileSystem)
    assert synced.calls == []
    assert sorted(table.to_arrow().column("x").to_pylist()) == [1, 2]


@pytest.mark.parametrize("emptied", [1, 2])
def test_a_commit_emptied_by_a_power_loss_is_refused(tmp_path: Path, emptied: int) -> None:
    # Without durable mode, a power loss after the kernel wrote a directory back but not a
    # file's content leaves a zero-byte commit file (ext4's zero-length files). Reading it
    # as a commit without actions would show a torn table (rows of later commits on top of
    # a missing one), so readers get a typed error naming the version.
    root = tmp_path / "torn"
    table = Table.create(root, data=_rows(1))
    table.append(_rows(2))
    table.append(_rows(3))
    (root / "_delta_log" / commit_file_name(emptied)).write_bytes(b"")
    with pytest.raises(CorruptLogError) as caught:
        Table.open(root)
    assert caught.value.version == emptied
