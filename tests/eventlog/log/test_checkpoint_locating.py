"""Locating checkpoints: which kind wins at a version, and ``_last_checkpoint`` with ``parts``
and ``v2Checkpoint``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import orjson
import pytest

from eventlog.log.checkpoint import (
    CheckpointFiles,
    LastCheckpoint,
    find_latest_checkpoint,
    list_checkpoints,
    read_last_checkpoint,
    read_last_checkpoint_info,
)
from tests.eventlog.log.checkpoint_samples import UUID_A, checkpoint_name


def test_listing_prefers_classic_then_v2_then_multipart() -> None:
    names = [
        checkpoint_name(3, "0000000001.0000000002.parquet"),
        checkpoint_name(3, "0000000002.0000000002.parquet"),
        checkpoint_name(3, f"{UUID_A}.json"),
        checkpoint_name(3, "parquet"),
        checkpoint_name(4, "0000000001.0000000001.parquet"),  # a 1-part set is complete
        checkpoint_name(6, "0000000003.0000000002.parquet"),  # part beyond its count: ignored
        checkpoint_name(8, "not-a-uuid.json"),
        "_sidecars/x.parquet",
    ]
    assert [(c.version, c.kind) for c in list_checkpoints(names)] == [
        (4, "multipart"),
        (3, "classic"),
        (3, "v2"),
        (3, "multipart"),
    ]
    assert find_latest_checkpoint(None, "unused", listing=names) == 4
    assert find_latest_checkpoint(None, "unused", at_or_before=3, listing=names) == 3


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (
            {"version": 4, "size": 10, "parts": 3, "sizeInBytes": 99, "numOfAddFiles": 5},
            LastCheckpoint(4, 10, 3, 99, 5),
        ),
        (
            {"version": 4, "size": -1, "parts": "3", "sizeInBytes": True, "numOfAddFiles": -2},
            LastCheckpoint(4, -1),
        ),  # wrong types dropped
        (
            {"version": 4, "size": 1, "v2Checkpoint": {"path": checkpoint_name(4, f"{UUID_A}.parquet")}},
            LastCheckpoint(4, 1, v2_checkpoint=checkpoint_name(4, f"{UUID_A}.parquet")),
        ),
        (
            {"version": 4, "v2Checkpoint": {"path": checkpoint_name(5, f"{UUID_A}.parquet")}},
            LastCheckpoint(4),
        ),
        ({"version": 4, "v2Checkpoint": {"path": "junk"}}, LastCheckpoint(4)),
        ({"size": 4}, None),
        ([4], None),
    ],
)
def test_last_checkpoint_info(tmp_path: Path, content: Any, want: LastCheckpoint | None) -> None:
    (tmp_path / "_last_checkpoint").write_bytes(orjson.dumps(content))
    fs = fsspec.filesystem("file")
    assert read_last_checkpoint_info(fs, str(tmp_path)) == want
    assert read_last_checkpoint(fs, str(tmp_path)) == (None if want is None else want.version)


def test_last_checkpoint_files() -> None:
    assert LastCheckpoint(2).files() == CheckpointFiles(2, "classic", (checkpoint_name(2, "parquet"),))
    assert LastCheckpoint(2, parts=2).files() == CheckpointFiles(
        2,
        "multipart",
        (
            checkpoint_name(2, "0000000001.0000000002.parquet"),
            checkpoint_name(2, "0000000002.0000000002.parquet"),
        ),
    )
    v2 = checkpoint_name(2, f"{UUID_A}.json")
    assert LastCheckpoint(2, parts=2, v2_checkpoint=v2).files() == CheckpointFiles(2, "v2", (v2,))
