"""Storage failures reach users as one typed error, StorageError (an EventlogError and an
OSError), naming the table, the file and the step; the failed write leaves the table as it
was. The data-file case runs on a real full file system: a 1 MB tmpfs mounted by the test
(root, as in CI)."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from eventlog import EventlogError, StorageError, Table
from eventlog.files import deletion_vectors
from eventlog.log import checkpoint
from eventlog.log.storage import LogStore
from lockstore import SlotStoreWriteRefusedError
from tests.conftest import SCHEMA, rows


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs: writes past it fail with ENOSPC."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "_delta_log" not in p.parts}


def test_a_full_disk_while_writing_data_files(small_disk: Path) -> None:
    t = Table.create(str(small_disk / "t"), SCHEMA)
    t.append(rows([1, 2]))
    before = _files(small_disk / "t")
    noise = np.random.default_rng(1).random(400_000)  # ~3 MB of incompressible doubles
    big = pa.table({"id": np.arange(400_000), "date": ["d"] * 400_000, "x": np.arange(400_000), "y": noise})
    with pytest.raises(StorageError) as err:
        t.append(big.cast(SCHEMA))
    e = err.value
    assert isinstance(e, OSError) and isinstance(e, EventlogError)
    assert (e.step, e.errno) == ("data file", errno.ENOSPC) and e.path.endswith(".parquet")
    assert e.uri == t.uri and "No space left on device" in str(e)
    assert isinstance(e.__cause__, OSError)
    assert _files(small_disk / "t") == before  # the partial file is gone
    assert t.refresh().version == 1
    assert t.append(rows([3])).version == 2  # space came back with the deleted file
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2, 3]


def test_a_staged_commit_that_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA)

    def io_error(self: LogStore, name: str, data: bytes, atomic: bool) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(LogStore, "_stage", io_error)
    with pytest.raises(StorageError) as err:
        t.append(rows([1]))
    assert (err.value.step, err.value.errno) == ("staged commit", errno.EIO)
    assert err.value.path.startswith("_eventlog/staged/")
    monkeypatch.undo()
    assert not list(Path(t.uri).rglob("*.parquet"))  # the data file went with the failed commit
    assert Table.open(t.uri).version == 0


def test_a_deletion_vector_that_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    t.append(rows([1, 2, 3]))
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setattr(deletion_vectors, "dv_file_path", lambda root, dv: f"{blocker}/dv.bin")
    with pytest.raises(StorageError) as err:
        t.delete("id = 2")
    assert err.value.step == "deletion vector" and err.value.errno in (errno.ENOTDIR, errno.EEXIST)
    assert t.refresh().version == 1 and sorted(t.to_arrow().column("id").to_pylist()) == [1, 2, 3]


def test_an_explicit_checkpoint_that_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    t.append(rows([1]))

    def no_space(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_classic", no_space)
    with pytest.raises(StorageError) as err:
        t.checkpoint()
    assert (err.value.step, err.value.path) == (
        "checkpoint",
        "_delta_log/00000000000000000001.checkpoint.parquet",
    )
    assert not (Path(t.uri) / "_delta_log" / "_last_checkpoint").exists()


def test_storage_errors_keep_their_fields_when_pickled() -> None:
    e = StorageError("t: storage failed", uri="t", path="a.parquet", step="data file", errno=errno.ENOSPC)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.uri, back.path, back.step, back.errno) == (
        StorageError, "t", "a.parquet", "data file", errno.ENOSPC
    )  # fmt: skip
    assert os.strerror(back.errno) == "No space left on device"


def test_a_slot_claim_the_local_store_s_disk_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded slot store on a full disk: the claim is refused before anything is
    written, so the commit provably did not land: StorageError at the "slot claim" step,
    the staged commit deleted, the table as it was."""
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    t.append(rows([1]))
    real_symlink = os.symlink

    def full(src: str, dst: str, *args: object, **kwargs: object) -> None:
        if "/_eventlog/slots/" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", src, None, dst)
        real_symlink(src, dst)

    monkeypatch.setattr(os, "symlink", full)
    with pytest.raises(StorageError) as err:
        t.append(rows([2]))
    assert (err.value.step, err.value.errno, err.value.uri) == ("slot claim", errno.ENOSPC, t.uri)
    assert "_eventlog/slots/" in err.value.path
    refused = err.value.__cause__  # lockstore's error, with the OSError under it
    assert isinstance(refused, SlotStoreWriteRefusedError) and refused.errno == errno.ENOSPC
    assert isinstance(refused.__cause__, OSError)
    assert pickle.loads(pickle.dumps(refused)).errno == errno.ENOSPC
    assert LogStore(t.uri).list_staged() == []
    monkeypatch.undo()
    assert Table.open(t.uri).version == 1
    assert t.append(rows([3])).version == 2
