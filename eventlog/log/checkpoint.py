"""Delta Lake checkpoints: the folded table state as Parquet.

This library writes two kinds (PROTOCOL.md "Checkpoints"):

* classic: ``_delta_log/<20-digit v>.checkpoint.parquet``, one row per action, the
  top-level nullable struct columns ``txn``, ``add``, ``remove``, ``metaData``,
  ``protocol`` and ``domainMetadata``, exactly one of them non-null per row (V1 spec);
* UUID-named V2 with sidecars, on tables whose ``delta.checkpointPolicy`` is ``v2``
  (:mod:`eventlog.log.checkpoint_v2`).

``_delta_log/_last_checkpoint`` is a JSON pointer to the newest one. Field names, types
and nullability match what delta-rs (delta-kernel) writes, so delta-rs and Delta Spark
open tables whose early JSON commits were deleted and only our checkpoint remains. It
reads every kind (classic, multi-part, V2 with sidecars): see
:mod:`eventlog.log.checkpoint_read` and :mod:`eventlog.log.checkpoint_locate`.

Per the protocol the checkpoint never holds ``commitInfo``/``cdc``, ``remove`` carries no
``stats``/``tags``, and domain metadata tombstones (``removed=true``) are left out. The
rows are built column-wise (:mod:`eventlog.log.checkpoint_parquet`).
"""

from __future__ import annotations

from typing import Any

import fsspec

from eventlog.errors import storage_step
from eventlog.log.checkpoint_locate import (
    CHAIN_HEAD_KEY,
    CheckpointFiles,
    LastCheckpoint,
    find_latest_checkpoint,
    list_checkpoints,
    read_last_checkpoint,
    read_last_checkpoint_info,
)
from eventlog.log.checkpoint_parquet import (
    ROW_GROUP_ROWS,
    file_blocks,
    non_file_blocks,
    publish,
    publish_pointer,
    with_stats,
    write_actions,
)
from eventlog.log.checkpoint_read import read_checkpoint
from eventlog.log.checkpoint_state import (
    CHECKPOINT_SCHEMA,
    LAST_CHECKPOINT,
    CheckpointState,
    checkpoint_path,
)
from eventlog.log.checkpoint_v2 import read_chain_head, uses_v2_checkpoints, write_v2_checkpoint
from eventlog.log.filetable import ActionSequence, AddFiles, RemoveFiles

__all__ = [
    "CHAIN_HEAD_KEY",
    "CHECKPOINT_SCHEMA",
    "LAST_CHECKPOINT",
    "ROW_GROUP_ROWS",
    "AddFiles",
    "CheckpointFiles",
    "CheckpointState",
    "ActionSequence",
    "LastCheckpoint",
    "RemoveFiles",
    "checkpoint_path",
    "find_latest_checkpoint",
    "list_checkpoints",
    "read_chain_head",
    "read_checkpoint",
    "read_last_checkpoint",
    "read_last_checkpoint_info",
    "uses_v2_checkpoints",
    "write_checkpoint",
]


# --------------------------------------------------------------------------- write


def _write_classic(fs: fsspec.AbstractFileSystem, log_dir: str, state: CheckpointState) -> int:
    schema = CHECKPOINT_SCHEMA
    if state.chain_head is not None:
        schema = schema.with_metadata({CHAIN_HEAD_KEY: state.chain_head})
    rows = 0

    def write(sink: Any) -> None:
        nonlocal rows
        rows = write_actions(sink, schema, non_file_blocks(state), file_blocks(state), with_stats(state))

    size = publish(fs, checkpoint_path(log_dir, state.version), write)
    pointer = {"version": state.version, "size": rows, "sizeInBytes": size, "numOfAddFiles": len(state.adds)}
    publish_pointer(fs, log_dir, pointer)
    return size


def write_checkpoint(fs: fsspec.AbstractFileSystem, log_dir: str, state: CheckpointState) -> int:
    """Write the checkpoint for ``state.version`` and point ``_last_checkpoint`` at it.

    A table whose ``delta.checkpointPolicy`` is ``v2`` (and whose protocol supports the
    ``v2Checkpoint`` feature) gets a UUID-named V2 checkpoint with sidecars
    (:mod:`eventlog.log.checkpoint_v2`); every other table a classic one. Returns the size of
    the checkpoint in bytes (V2: the top-level file and its sidecars). ``_last_checkpoint``
    is only replaced when it does not already name a newer checkpoint.
    """
    if state.version < 0:
        raise ValueError(f"checkpoint version must be >= 0, got {state.version}")
    name = f"_delta_log/{state.version:020d}.checkpoint.parquet"
    with storage_step(log_dir.rsplit("/", 1)[0], name, "checkpoint"):
        if uses_v2_checkpoints(state.protocol, state.metadata):
            return write_v2_checkpoint(fs, log_dir, state).size_in_bytes
        return _write_classic(fs, log_dir, state)
