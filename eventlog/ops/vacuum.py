"""VACUUM: delete data files that no version within the retention period can read.

A file is kept when the latest snapshot references it, when a remove within the retention
retired it (time travel and in-flight readers may still read it), or when it is younger
than the retention (a writer may have written it and not committed yet). Deletion-vector
files follow the file they belong to. ``_delta_log``, ``_eventlog`` and every other name
starting with ``_`` or ``.`` are never touched, except partition directories and
``_change_data``, whose change files are never live and go once older than the retention
(Delta's rule).
A retention shorter than the table's (``delta.deletedFileRetentionDuration``, one week by
default) is refused unless the caller turns the check off, as in Delta. Staged commits
(``_eventlog/staged``, and ``_delta_log/_staged_commits`` of earlier releases) older than
the retention were abandoned by writers that died, and are deleted too
(:func:`abandoned_staged_commits`).

:func:`vacuum` runs in one process; :func:`sweep` is the part an engine (Spark) may run
in parallel over :func:`top_level_entries`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import unquote, urlparse

import fsspec
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import CorruptLogError, InvalidInputError
from eventlog.files.change_data import CHANGE_DATA_DIR
from eventlog.files.partition_values import escape_path_name
from eventlog.log.actions import DeletionVectorDescriptor
from eventlog.log.storage import LEGACY_STAGED_DIR, STAGED_DIR, LogStore, file_mtime_ms
from eventlog.log.storage_clock import retention_now_ms
from eventlog.ops.alter import (
    DEFAULT_DELETED_FILE_RETENTION,
    DELETED_FILE_RETENTION_KEY,
)
from eventlog.snapshot import Snapshot
from eventlog.snapshot.protocol import check_writable
from eventlog.txn.attempt import CommitTarget
from eventlog.txn.transaction import dv_relative_path
from eventlog.userinput import parse_interval_ms

RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"


def retention_ms(snapshot: Snapshot, retention_hours: float | None, *, enforce: bool = True) -> int:
    """The retention to use (ms): the table's, or ``retention_hours`` if not shorter."""
    configured = parse_interval_ms(
        snapshot.properties.get(DELETED_FILE_RETENTION_KEY, DEFAULT_DELETED_FILE_RETENTION)
    )
    retention = configured if retention_hours is None else int(retention_hours * 3_600_000)
    if retention < 0:
        raise InvalidInputError(f"retentionHours must not be negative, got {retention_hours}")
    if enforce and retention < configured:
        raise InvalidInputError(
            "Are you sure you would like to vacuum files with such a low retention period? If you "
            "have writers that are currently writing to this table, there is a risk that you may "
            "corrupt the state of your table. If you are certain that there are no operations being "
            "performed on this table, such as insert/upsert/delete/optimize, then you may turn off "
            f"this check (Spark: {RETENTION_CHECK_CONF} = false; Python: enforce_retention=False). "
            f"The table retention is {configured / 3_600_000:g} hours; "
            f"{retention / 3_600_000:g} hours were requested."
        )
    return retention


def referenced_files(table: CommitTarget, horizon: int) -> set[str]:
    """Table-relative paths (data and DV files) a version within retention may read."""
    snap = table.refresh()
    valid: set[str] = set()

    def keep(path: str, dv: DeletionVectorDescriptor | None) -> None:
        if not urlparse(path).scheme:
            valid.add(unquote(path))
        if dv is not None and dv.storage_type == "u":
            valid.add(dv_relative_path(dv))

    valid |= referenced_by(snap.live_files)
    tombstones = snap.tombstone_files
    recent = pc.greater_equal(pc.fill_null(tombstones.column("deletionTimestamp"), 0), horizon)
    valid |= referenced_by(tombstones.filter(recent))
    # Commits within retention: their removes cover tombstones a checkpoint may have dropped
    # under a shorter table retention than the one asked for here.
    version = snap.version
    while version >= 0:
        try:
            (commit,) = table.commits_between(version, version)
        except CorruptLogError:
            break  # older commits were cleaned up
        if (commit.timestamp or 0) < horizon and not _written_since(table.log, version, horizon):
            break
        for add in commit.adds:
            keep(add.path, add.deletion_vector)
        for rm in commit.removes:
            keep(rm.path, rm.deletion_vector)
        version -= 1
    return valid


def _written_since(log: LogStore, version: int, horizon: int) -> bool:
    """Whether commit ``version``'s file was written at or after ``horizon`` by the storage's
    clock. Its commitInfo timestamp is its writer's clock: a writer running hours behind
    dates a fresh remove hours back, and the files it removed must stay for the retention."""
    mtime = log.commit_mtime_ms(version)
    return mtime is not None and mtime >= horizon


# What ``urlparse`` takes for a scheme: a letter, then letters, digits, "+", "-" or ".", then ":".
_SCHEME = r"^[A-Za-z][A-Za-z0-9+.\-]*:"


def referenced_by(files: pa.Table) -> set[str]:
    """Table-relative paths the add or remove rows ``files`` reference, from their ``path``
    and ``deletionVector`` columns: data files (unquoted; absolute URIs are not the
    table's own) and the files of ``u`` deletion vectors."""
    paths = files.column("path")
    relative = paths.filter(pc.invert(pc.match_substring_regex(paths, _SCHEME)))
    quoted = pc.match_substring(relative, "%")
    out = set(relative.filter(pc.invert(quoted)).to_pylist())
    out.update(unquote(p) for p in relative.filter(quoted).to_pylist())
    dvs = files.column("deletionVector")
    if dvs.null_count < len(dvs):
        in_files = pc.fill_null(pc.equal(pc.struct_field(dvs, "storageType"), "u"), False)
        out.update(
            dv_relative_path(DeletionVectorDescriptor.from_json(d)) for d in dvs.filter(in_files).to_pylist()
        )
    return out


def is_hidden(name: str, partition_columns: Sequence[str]) -> bool:
    """Delta's rule: names starting with ``_`` or ``.`` are not data, except partition dirs
    and the change data files (``_change_data``: never live, swept once old enough)."""
    if not name.startswith(("_", ".")) or name == CHANGE_DATA_DIR:
        return False
    return not any(name.startswith(f"{escape_path_name(c)}=") for c in partition_columns)


def top_level_entries(
    fs: fsspec.AbstractFileSystem, root: str, partition_columns: Sequence[str]
) -> list[tuple[str, bool]]:
    """(name, is directory) of the table root's non-hidden entries: the units of a sweep."""
    return [
        (e["name"].rsplit("/", 1)[-1], e.get("type") == "directory")
        for e in fs.ls(root, detail=True)
        if not is_hidden(e["name"].rsplit("/", 1)[-1], partition_columns)
    ]


def sweep(
    fs: fsspec.AbstractFileSystem,
    root: str,
    entries: Iterable[tuple[str, bool]],
    partition_columns: Sequence[str],
    keep: frozenset[str] | set[str],
    horizon: int,
    dry_run: bool,
) -> Iterator[str]:
    """Delete (or, dry run, only list) unreferenced files older than ``horizon`` under the
    given top-level entries; yields their table-relative paths."""
    for name, is_dir in entries:
        path = f"{root}/{name}"
        found = fs.find(path, withdirs=False, detail=True) if is_dir else {path: fs.info(path)}
        for full, info in found.items():
            rel = full[len(root) + 1 :]
            if any(is_hidden(part, partition_columns) for part in rel.split("/")) or rel in keep:
                continue
            mtime = file_mtime_ms(info)
            if mtime is None or mtime >= horizon:
                continue  # unknown or too young: a writer may not have committed it yet
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):  # deleted concurrently: fine
                    fs.rm_file(full)
            yield rel


def abandoned_staged_commits(table: CommitTarget, horizon: int, dry_run: bool) -> list[str]:
    """Delete (or list) staged commits older than ``horizon``; their table-relative paths.

    Writers delete their staged commit once it is published or provably not committed, so
    an old one was left by a writer that died (or a group-commit leader that died after
    publishing). Call after ``table.refresh()``: that publishes every claimed version whose
    writer did not, so no claim up to the latest version still needs its staged file, and a
    claim made later names a file younger than ``horizon``. Both the staged directory and
    the legacy one under ``_delta_log`` (earlier releases) are swept.
    """
    log = table.log
    out: list[str] = []
    for relative in (STAGED_DIR, LEGACY_STAGED_DIR):
        directory = f"{log.root}/{relative}"
        try:
            entries = log.fs.ls(directory, detail=True)
        except FileNotFoundError:
            continue
        for entry in entries:
            name = entry["name"].rsplit("/", 1)[-1]
            mtime = file_mtime_ms(entry)
            if entry.get("type") == "directory" or mtime is None or mtime >= horizon:
                continue
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):  # its writer cleaned up meanwhile
                    log.fs.rm_file(entry["name"])
            out.append(f"{relative}/{name}")
    return out


def vacuum(
    table: CommitTarget,
    retention_hours: float | None = None,
    *,
    dry_run: bool = False,
    enforce_retention: bool = True,
) -> list[str]:
    """Delete data files no version within the retention references, and abandoned staged
    commits older than the retention; their URIs, sorted."""
    snap = table.refresh()
    check_writable(snap.protocol, snap.metadata)  # vacuumProtocolCheck: VACUUM is a writer
    # "Now" by the storage's clock when this machine's runs ahead (eventlog.log.storage_clock).
    horizon = retention_now_ms(table.log) - retention_ms(snap, retention_hours, enforce=enforce_retention)
    keep = referenced_files(table, horizon)
    fs, root = table.log.fs, table.log.root
    entries = top_level_entries(fs, root, snap.partition_columns)
    deleted = [*sweep(fs, root, entries, snap.partition_columns, keep, horizon, dry_run)]
    deleted += abandoned_staged_commits(table, horizon, dry_run)
    return sorted(f"{table.uri}/{rel}" for rel in deleted)
