"""Snapshots read from the log, and checkpoints written from snapshots.

:func:`load_snapshot` folds a table's commits, starting from the newest checkpoint that
reads cleanly, into the :class:`Snapshot` at a version; :func:`checkpoint_due` says when a
new version deserves a checkpoint and :func:`write_snapshot_checkpoint` writes one.

Checkpoints are a cache of the fold, the commits are the truth: a damaged or vanished
checkpoint is skipped (an older one is used, or the log is replayed from version 0), as
Delta Spark does.
"""

from __future__ import annotations

import logging

import pyarrow.compute as pc

from eventlog.errors import CorruptLogError, TableNotFoundError, VersionNotFoundError
from eventlog.log.checkpoint import (
    CheckpointState,
    find_latest_checkpoint,
    read_checkpoint,
    read_last_checkpoint_info,
    write_checkpoint,
)
from eventlog.log.commitlog import CommitLog
from eventlog.log.storage import LogStore
from eventlog.snapshot.projection import Snapshot
from eventlog.snapshot.protocol import check_readable

__all__ = [
    "CHECKPOINT_INTERVAL_KEY",
    "DEFAULT_CHECKPOINT_INTERVAL",
    "checkpoint_due",
    "load_snapshot",
    "write_snapshot_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_KEY = "delta.checkpointInterval"
DEFAULT_CHECKPOINT_INTERVAL = 100


# --------------------------------------------------------------------------- loading


def load_snapshot(commitlog: CommitLog, version: int | None) -> Snapshot:
    """Replay the log (from the newest usable checkpoint) up to ``version``/latest.

    TableNotFoundError when the log holds no commit; VersionNotFoundError when the commits
    before the first listed one were cleaned up and no checkpoint covers them.

    When ``_last_checkpoint`` names a checkpoint at or before the wanted version, the log
    directory is not listed: the checkpoint proves its version published, and the commits
    after it are found by probing. Opening then costs the same at 1,000 or 100,000 commits.
    """
    log = commitlog.log
    pointed = _pointed_checkpoint(commitlog, version)
    if pointed is not None:
        checkpointed, cp = pointed
        commitlog.note_listed(cp)
        latest = commitlog.latest_version()
        target = latest if version is None else version
        if target >= cp:
            return _advance(commitlog, checkpointed, target)
    names = log.list_log()
    listed = LogStore.commit_version_bounds(names)
    if listed:
        # The listing proves these versions are published: no per-version check needed.
        commitlog.note_listed(listed[-1])
    latest = max(listed[-1] if listed else -1, commitlog.latest_version(probe_log=not listed))
    if latest < 0:
        raise TableNotFoundError(commitlog.uri)
    target = latest if version is None else version
    base = _newest_readable_checkpoint(commitlog.uri, log, target, names)
    if base is None and listed and listed[0] != 0:
        raise VersionNotFoundError(
            f"{commitlog.uri}: commits before version {listed[0]} were cleaned up and no "
            "checkpoint covers them",
            requested=target,
            earliest=listed[0],
            latest=latest,
        )
    return _advance(commitlog, base, target)


def _advance(commitlog: CommitLog, base: Snapshot | None, target: int) -> Snapshot:
    start = 0 if base is None else base.version + 1
    parts = base.partition_columns if base is not None else ()
    events, files = commitlog.events_between(start, target, parts)
    if base is None:
        snap = Snapshot.from_events(commitlog.uri, events, files)
    else:
        snap = base.advance_events(events, files)
    check_readable(snap.protocol, snap.metadata)
    return snap


def _pointed_checkpoint(commitlog: CommitLog, version: int | None) -> tuple[Snapshot, int] | None:
    """The checkpoint ``_last_checkpoint`` names, read, when it serves ``version``."""
    log = commitlog.log
    last = read_last_checkpoint_info(log.fs, log.log_dir)
    if last is None or (version is not None and last.version > version):
        return None
    cp = last.version
    try:
        state = read_checkpoint(log.fs, log.log_dir, cp, last=last)
        return _from_checkpoint(commitlog.uri, state), cp
    except (CorruptLogError, FileNotFoundError) as exc:
        logger.warning("%s: _last_checkpoint names checkpoint %s, unreadable: %s", commitlog.uri, cp, exc)
        return None


def _from_checkpoint(uri: str, state: CheckpointState) -> Snapshot:
    return Snapshot.from_state(
        uri, state.version, state.protocol, state.metadata, state.add_table, state.remove_table,
        state.txns, state.domains,
    )  # fmt: skip


def _newest_readable_checkpoint(uri: str, log: LogStore, target: int, names: list[str]) -> Snapshot | None:
    """The newest checkpoint at or before ``target`` that reads cleanly, as a snapshot."""
    bound = target
    while bound >= 0:
        cp = find_latest_checkpoint(log.fs, log.log_dir, at_or_before=bound, listing=names)
        if cp is None:
            return None
        try:
            return _from_checkpoint(uri, read_checkpoint(log.fs, log.log_dir, cp, listing=names))
        except (CorruptLogError, FileNotFoundError) as exc:
            logger.warning("skipping unreadable checkpoint %s of %s: %s", cp, uri, exc)
            bound = cp - 1
    return None


# --------------------------------------------------------------------------- checkpoints


def checkpoint_due(snapshot: Snapshot) -> bool:
    """Whether a checkpoint of ``snapshot`` is due: its version is a positive multiple of the
    table's ``delta.checkpointInterval`` (default 100; 0 or less never checkpoints)."""
    interval = int(snapshot.properties.get(CHECKPOINT_INTERVAL_KEY, DEFAULT_CHECKPOINT_INTERVAL))
    return interval > 0 and snapshot.version > 0 and snapshot.version % interval == 0


def write_snapshot_checkpoint(
    log: LogStore, snapshot: Snapshot, *, tombstone_horizon_ms: int, chain_head: str | None = None
) -> int:
    """Write a Delta checkpoint of ``snapshot``; returns its version.

    Tombstones deleted before ``tombstone_horizon_ms`` are dropped (they are past the
    table's deleted-file retention, so VACUUM may delete their files).
    """
    tombstones = snapshot.tombstone_files
    deleted = pc.fill_null(tombstones.column("deletionTimestamp"), 0)
    live_tombstones = tombstones.filter(pc.greater_equal(deleted, tombstone_horizon_ms))
    state = CheckpointState(
        version=snapshot.version,
        protocol=snapshot.protocol,
        metadata=snapshot.metadata,
        adds=snapshot.live_files,
        removes=live_tombstones,
        txns=tuple(snapshot.txns.values()),
        domains=tuple(snapshot.domains.values()),
        chain_head=chain_head,
    )
    write_checkpoint(log.fs, log.log_dir, state)
    return snapshot.version
