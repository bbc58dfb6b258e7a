"""Writing V2 checkpoints: UUID-named, with sidecars (PROTOCOL.md "V2 Spec").

On a table whose ``delta.checkpointPolicy`` is ``v2`` (its protocol then supports the
``v2Checkpoint`` reader-writer feature), a checkpoint at version ``n`` is:

1. sidecar files ``_delta_log/_sidecars/<n>.checkpoint.<i>.<k>.<uuid>.parquet`` (Delta
   Spark's names) holding the ``add`` and ``remove`` actions, written first;
2. the top-level file ``_delta_log/<n>.checkpoint.<uuid>.parquet`` (or ``.json``): exactly
   one ``checkpointMetadata`` action, a ``sidecar`` action per sidecar file, and the
   protocol, metadata, ``txn`` and ``domainMetadata`` actions. It is published atomically,
   so a reader never sees it before its sidecars are complete;
3. ``_last_checkpoint`` naming it under ``v2Checkpoint`` (``path``, ``sizeInBytes``,
   ``modificationTime``), as Delta Spark writes it.

No multi-part checkpoint is ever written, and no V1 classic one on such a table. The only
classic-named checkpoint is the *compatibility* copy Delta's metadata cleanup makes
(:func:`write_compat_checkpoint`): the top-level file's rows, V2 spec, under the classic
name, so that readers that know no UUID names find the protocol and fail cleanly.

The hash chain head (:mod:`eventlog.log.verify`) travels in the ``checkpointMetadata``
tags under ``eventlog.chainHead`` (and, for Parquet, in the footer, as classic ones keep it).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from eventlog.log.actions import Metadata, Protocol
from eventlog.log.checkpoint_locate import (
    CHAIN_HEAD_KEY,
    CheckpointFiles,
    is_local,
    list_checkpoints,
    list_log,
)
from eventlog.log.checkpoint_parquet import (
    file_blocks,
    publish,
    publish_pointer,
    put_bytes,
    with_stats,
    write_actions,
)
from eventlog.log.checkpoint_state import (
    CHECKPOINT_METADATA_STRUCT,
    CHECKPOINT_SCHEMA,
    SIDECAR_STRUCT,
    SIDECARS,
    CheckpointState,
    checkpoint_path,
)
from eventlog.log.storage import file_mtime_ms, whole_file_options

__all__ = [
    "CHECKPOINT_POLICY_KEY",
    "SIDECAR_ROWS",
    "SIDECAR_SCHEMA",
    "V2_CHECKPOINT_SCHEMA",
    "V2CheckpointWritten",
    "read_chain_head",
    "uses_v2_checkpoints",
    "write_compat_checkpoint",
    "write_v2_checkpoint",
]

CHECKPOINT_POLICY_KEY = "delta.checkpointPolicy"
V2_FEATURE = "v2Checkpoint"
CHAIN_HEAD_TAG = CHAIN_HEAD_KEY.decode()
# File actions per sidecar: a few row groups each, so readers can fetch sidecars in parallel.
SIDECAR_ROWS = 1_048_576

V2_CHECKPOINT_SCHEMA = pa.schema([
    *CHECKPOINT_SCHEMA,
    pa.field("checkpointMetadata", CHECKPOINT_METADATA_STRUCT),
    pa.field("sidecar", SIDECAR_STRUCT),
])  # fmt: skip
SIDECAR_SCHEMA = pa.schema([CHECKPOINT_SCHEMA.field("add"), CHECKPOINT_SCHEMA.field("remove")])
_NON_FILE_KINDS = ("checkpointMetadata", "sidecar", "protocol", "metaData", "txn", "domainMetadata")


def uses_v2_checkpoints(protocol: Protocol, metadata: Metadata) -> bool:
    """Whether checkpoints of this table are V2: ``delta.checkpointPolicy`` is ``v2`` and
    the protocol supports the ``v2Checkpoint`` feature (else classic V1, always allowed)."""
    policy = str(metadata.configuration.get(CHECKPOINT_POLICY_KEY, "classic")).lower()
    listed = protocol.min_reader_version >= 3 and V2_FEATURE in (protocol.reader_features or ())
    return policy == "v2" and listed


@dataclass(frozen=True, slots=True)
class V2CheckpointWritten:
    """A V2 checkpoint just written: its top-level file and sidecar names, its total size
    (top-level file and sidecars) and its number of actions."""

    version: int
    name: str
    sidecars: tuple[str, ...]
    size_in_bytes: int
    rows: int


def _mtime(fs: fsspec.AbstractFileSystem, path: str) -> int:
    try:
        mtime = file_mtime_ms(fs.info(path))
    except OSError:
        mtime = None
    return int(time.time() * 1000) if mtime is None else mtime


def _slices(state: CheckpointState, rows_per_file: int) -> list[list[tuple[str, pa.Table, pa.StructType]]]:
    """The file actions cut into sidecars of at most ``rows_per_file`` rows (adds first)."""
    files: list[list[tuple[str, pa.Table, pa.StructType]]] = [[]]
    room = rows_per_file
    for kind, table, typ in file_blocks(state):
        start = 0
        while start < table.num_rows:
            if room == 0:
                files.append([])
                room = rows_per_file
            part = table.slice(start, room)
            files[-1].append((kind, part, typ))
            start += part.num_rows
            room -= part.num_rows
    return [f for f in files if f]


def _write_sidecars(
    fs: fsspec.AbstractFileSystem, log_dir: str, state: CheckpointState, rows_per_file: int
) -> list[tuple[dict[str, Any], int]]:
    """Write the sidecar files; their ``sidecar`` actions and row counts."""
    parts = _slices(state, rows_per_file)
    if not parts:
        return []
    directory = f"{log_dir}/{SIDECARS}"
    if is_local(fs):
        fs.makedirs(directory, exist_ok=True)
    out = []
    for i, files in enumerate(parts, 1):
        name = f"{state.version:020d}.checkpoint.{i:010d}.{len(parts):010d}.{uuid.uuid4()}.parquet"
        rows = 0

        def write(sink: Any, files: Sequence[tuple[str, pa.Table, pa.StructType]] = files) -> None:
            nonlocal rows
            rows = write_actions(sink, SIDECAR_SCHEMA, [], files, with_stats(state))

        path = f"{directory}/{name}"
        size = publish(fs, path, write)
        action = {"path": name, "sizeInBytes": size, "modificationTime": _mtime(fs, path), "tags": {}}
        out.append((action, rows))
    return out


def _non_file_actions(state: CheckpointState) -> list[tuple[str, dict[str, Any]]]:
    actions: list[tuple[str, dict[str, Any]]] = [
        ("protocol", state.protocol.to_json()),
        ("metaData", state.metadata.to_json()),
    ]
    actions += [("txn", t.to_json()) for t in state.txns]
    # Tombstones do not belong in a checkpoint (PROTOCOL.md "Checkpoints").
    actions += [("domainMetadata", d.to_json()) for d in state.domains if not d.removed]
    return actions


def _parquet_rows(actions: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, pa.Array]]:
    """Actions (kind, JSON body) as struct-column blocks of the V2 top-level schema."""
    blocks = []
    for kind in _NON_FILE_KINDS:
        bodies = [body for k, body in actions if k == kind]
        if bodies:
            blocks.append((kind, pa.array(bodies, V2_CHECKPOINT_SCHEMA.field(kind).type)))
    return blocks


def _write_top_level(
    fs: fsspec.AbstractFileSystem, path: str, actions: Sequence[tuple[str, dict[str, Any]]], head: str | None
) -> int:
    if path.endswith(".json"):
        return put_bytes(fs, path, b"".join(orjson.dumps({kind: body}) + b"\n" for kind, body in actions))
    schema = V2_CHECKPOINT_SCHEMA
    if head is not None:
        schema = schema.with_metadata({CHAIN_HEAD_KEY: head})

    def write_parquet(sink: Any) -> None:
        write_actions(sink, schema, _parquet_rows(actions), [], False)

    return publish(fs, path, write_parquet)


def write_v2_checkpoint(
    fs: fsspec.AbstractFileSystem,
    log_dir: str,
    state: CheckpointState,
    *,
    top_level: str = "parquet",
    sidecar_rows: int = SIDECAR_ROWS,
) -> V2CheckpointWritten:
    """Write the UUID-named V2 checkpoint of ``state`` (see the module docstring) with its
    top-level file as ``top_level`` (``"parquet"`` or ``"json"``), and point
    ``_last_checkpoint`` at it unless that names a newer checkpoint."""
    if top_level not in ("parquet", "json"):
        raise ValueError(f"a V2 checkpoint's top-level file is parquet or json, not {top_level!r}")
    if sidecar_rows <= 0:
        raise ValueError(f"sidecar_rows must be positive, got {sidecar_rows}")
    log_dir = log_dir.rstrip("/")
    sidecars = _write_sidecars(fs, log_dir, state, sidecar_rows)
    sidecar_size = sum(int(a["sizeInBytes"]) for a, _ in sidecars)
    sidecar_actions = sum(rows for _, rows in sidecars)
    tags = {
        "sidecarNumActions": str(sidecar_actions),
        "sidecarSizeInBytes": str(sidecar_size),
        "numOfAddFiles": str(len(state.adds)),
    }
    if state.chain_head is not None:
        tags[CHAIN_HEAD_TAG] = state.chain_head
    actions = [
        ("checkpointMetadata", {"version": state.version, "tags": tags}),
        *(("sidecar", action) for action, _ in sidecars),
        *_non_file_actions(state),
    ]
    name = f"{state.version:020d}.checkpoint.{uuid.uuid4()}.{top_level}"
    path = f"{log_dir}/{name}"
    top_size = _write_top_level(fs, path, actions, state.chain_head)
    rows = len(actions) + sidecar_actions
    pointer = {
        "version": state.version,
        "size": rows,
        "sizeInBytes": top_size + sidecar_size,
        "numOfAddFiles": len(state.adds),
        "v2Checkpoint": {"path": name, "sizeInBytes": top_size, "modificationTime": _mtime(fs, path)},
    }
    publish_pointer(fs, log_dir, pointer)
    return V2CheckpointWritten(
        state.version, name, tuple(str(a["path"]) for a, _ in sidecars), top_size + sidecar_size, rows
    )


# --------------------------------------------------------------------------- compat, chain head


def _json_actions(fs: fsspec.AbstractFileSystem, path: str) -> list[tuple[str, dict[str, Any]]]:
    actions = []
    for line in fs.cat_file(path, **whole_file_options(fs)).splitlines():
        if line.strip():
            ((kind, body),) = orjson.loads(line).items()
            if kind in _NON_FILE_KINDS:
                actions.append((kind, body))
            elif kind in ("add", "remove"):
                # Inline file actions: a classic-named copy would need them as sidecars.
                raise ValueError(f"{path} holds file actions inline; no compatibility copy is made")
    return actions


def write_compat_checkpoint(fs: fsspec.AbstractFileSystem, log_dir: str, cp: CheckpointFiles) -> bool:
    """Write the classic-named compatibility copy of the UUID-named V2 checkpoint ``cp``
    (its top-level rows, V2 spec, as Delta's metadata cleanup does) unless a classic
    checkpoint of that version exists. Returns whether one was written.

    Raises ``FileNotFoundError``/``ValueError`` when ``cp`` cannot be copied (callers then
    keep the log as it is)."""
    log_dir = log_dir.rstrip("/")
    target = checkpoint_path(log_dir, cp.version)
    if cp.kind != "v2" or fs.exists(target):
        return False
    source = f"{log_dir}/{cp.names[0]}"
    if source.endswith(".parquet"):
        put_bytes(fs, target, fs.cat_file(source, **whole_file_options(fs)))
        return True
    actions = _json_actions(fs, source)
    head = next((b.get("tags") or {} for k, b in actions if k == "checkpointMetadata"), {}).get(
        CHAIN_HEAD_TAG
    )
    _write_top_level(fs, target, actions, head)
    return True


def _footer_head(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    with fs.open(path, "rb") as f:
        value = (pq.read_schema(f).metadata or {}).get(CHAIN_HEAD_KEY)
    return None if value is None else bytes(value).decode()


def read_chain_head(fs: fsspec.AbstractFileSystem, log_dir: str, version: int) -> str | None:
    """The chain head a checkpoint at ``version`` carries, or None: the footer of the
    classic checkpoint (read alone, no listing), else of a UUID-named V2 one, or its
    ``checkpointMetadata`` tags."""
    log_dir = log_dir.rstrip("/")
    with contextlib.suppress(FileNotFoundError):  # no classic one: look for a V2 one
        return _footer_head(fs, checkpoint_path(log_dir, version))
    try:
        names = list_log(fs, log_dir)
    except FileNotFoundError:
        return None
    for cp in list_checkpoints(names):
        if cp.version != version or cp.kind != "v2":
            continue
        path = f"{log_dir}/{cp.names[0]}"
        try:
            if path.endswith(".parquet"):
                return _footer_head(fs, path)
            tags = next(
                (b.get("tags") or {} for k, b in _json_actions(fs, path) if k == "checkpointMetadata"), {}
            )
            return tags.get(CHAIN_HEAD_TAG)
        except (OSError, ValueError, pa.ArrowException):
            continue
    return None
