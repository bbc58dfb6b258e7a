"""Multi-part checkpoints: read whole (listed, by name, from ``_last_checkpoint``), and an
incomplete set skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import orjson
import pytest

from eventlog.log.checkpoint import (
    CheckpointFiles,
    LastCheckpoint,
    find_latest_checkpoint,
    list_checkpoints,
    read_checkpoint,
    read_last_checkpoint_info,
    write_checkpoint,
)
from eventlog.log.filetable import ADD_SCHEMA
from tests.eventlog.log.checkpoint_samples import NoListing, V, checkpoint_name, rich_state, write_multipart
from tests.eventlog.log.test_checkpoint import assert_states_equal, full_state


def test_multipart_checkpoint(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    (tmp_path / "scratch").mkdir()
    state = rich_state()
    write_multipart(tmp_path / "scratch", log, state, parts=3)
    (log / "_last_checkpoint").write_bytes(orjson.dumps({"version": V, "size": 60, "parts": 3}))
    fs, log_dir = fsspec.filesystem("file"), str(log)
    names = os.listdir(log)
    assert find_latest_checkpoint(fs, log_dir) == V
    assert list_checkpoints(names) == [
        CheckpointFiles(
            V, "multipart", tuple(checkpoint_name(V, f"{i:010d}.0000000003.parquet") for i in (1, 2, 3))
        )
    ]
    want = sorted(state.adds, key=lambda a: a.path)
    for got in (
        read_checkpoint(fs, log_dir, V),  # classic absent: the directory is listed
        read_checkpoint(fs, log_dir, V, listing=names),
        read_checkpoint(NoListing(), log_dir, V, last=read_last_checkpoint_info(fs, log_dir)),
    ):
        assert got.protocol == state.protocol and got.metadata == state.metadata
        assert sorted(got.adds, key=lambda a: a.path) == want
        assert sorted(got.removes, key=lambda r: r.path) == sorted(state.removes, key=lambda r: r.path)
        assert sorted(got.txns, key=lambda t: t.app_id) == sorted(state.txns, key=lambda t: t.app_id)
        assert sorted(got.domains, key=lambda d: d.domain) == sorted(state.domains, key=lambda d: d.domain)
        assert got.add_table.schema == ADD_SCHEMA


def test_incomplete_multipart_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    (tmp_path / "scratch").mkdir()
    fs, log_dir = fsspec.filesystem("file"), str(log)
    write_checkpoint(fs, log_dir, full_state(5))
    write_multipart(tmp_path / "scratch", log, rich_state(9), parts=3, skip=2)
    names = os.listdir(log)
    assert find_latest_checkpoint(fs, log_dir) == 5
    assert find_latest_checkpoint(fs, log_dir, listing=names) == 5
    assert [cp.version for cp in list_checkpoints(names)] == [5]
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, 9)
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, 9, listing=names)
    # a pointer naming the incomplete set: the missing part is a missing file
    with pytest.raises(FileNotFoundError):
        read_checkpoint(fs, log_dir, 9, last=LastCheckpoint(9, parts=3))
    assert_states_equal(read_checkpoint(fs, log_dir, 5, listing=names), full_state(5))
