"""The table through time: :func:`version_at` finds the version as of a timestamp (Delta's
``timestampAsOf``, for time travel) and :func:`commit_history` lists what each version did
(Delta's ``DESCRIBE HISTORY``), both from the commits of the log.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from eventlog.errors import InvalidInputError, VersionNotFoundError
from eventlog.log import in_commit_timestamps as ict
from eventlog.log.commitlog import CommitLog
from eventlog.snapshot.projection import Snapshot

__all__ = ["commit_history", "timestamp_ms", "version_at"]


def version_at(
    commitlog: CommitLog, current: Snapshot, ts_ms: int, *, requested: dt.datetime | str | int
) -> int:
    """The latest version up to ``current``'s committed at or before ``ts_ms``
    (:func:`timestamp_ms` of ``requested``, which error messages name).

    As the protocol specifies and Delta Spark does: without in-commit timestamps, a version
    is dated by its commit file's modification time (stamped by the storage, so a writer's
    skewed clock does not move it), made increasing (a version dated at or before the one
    below it is dated 1 ms after it). With in-commit timestamps on
    (:func:`eventlog.log.in_commit_timestamps.window`): versions from the enablement version
    on are dated by ``inCommitTimestamp`` and are the only ones a timestamp at or after the
    enablement timestamp can resolve to; older ones by their file's modification time.
    """
    versions: range = range(current.version + 1)
    by_ict = False
    where = ict.enablement(current.metadata.configuration)
    if where is not None:
        versions, by_ict = ict.window(where, ts_ms, current.version)
    dates: dict[int, int | None]
    if by_ict:
        known = dict(current.commit_timestamps)
        dates = {v: known.get(v) or _commit_timestamp(commitlog, v) for v in versions}
    else:
        dates = dict(_monotonic(commitlog.log.commit_mtimes_ms(), versions))
    best = -1
    for version in versions:
        commit_ts = dates.get(version)
        if commit_ts is None:
            continue
        if commit_ts <= ts_ms:
            best = version
        else:
            break
    if best < 0:
        raise VersionNotFoundError(
            f"{commitlog.uri}: no version was committed at or before {requested!r}",
            requested=requested,
            earliest=0,
            latest=current.version,
        )
    return best


def _monotonic(mtimes: dict[int, int], versions: range) -> dict[int, int]:
    """Delta's dates of commits by file time: each at least 1 ms after the one below it."""
    out: dict[int, int] = {}
    previous: int | None = None
    for version in range(versions.stop):
        mtime = mtimes.get(version)
        if mtime is None:
            continue
        dated = mtime if previous is None or mtime > previous else previous + 1
        previous = dated
        if version >= versions.start:
            out[version] = dated
    return out


def _commit_timestamp(commitlog: CommitLog, version: int) -> int | None:
    commit = commitlog.read_commit(version, required=False)
    info = commit.commit_info if commit is not None else None
    if info is not None:
        return ict.commit_time(info)
    return commitlog.log.commit_mtime_ms(version)


def timestamp_ms(value: dt.datetime | str | int) -> int:
    """Milliseconds since the epoch of ``value``: an int as is, ISO 8601 text, or a datetime
    (naive ones are UTC). InvalidInputError for text that is not ISO 8601."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str | dt.datetime):
        raise InvalidInputError(
            f"a timestamp must be a datetime, ISO 8601 text or epoch milliseconds (int), "
            f"not {type(value).__name__} {value!r}"
        )
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidInputError(f"cannot parse timestamp {value!r}: use ISO 8601") from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


def commit_history(commitlog: CommitLog, current: Snapshot, limit: int | None) -> list[dict[str, Any]]:
    """``{"version": v, **commitInfo}`` of each version from ``current``'s down, at most
    ``limit``, stopping where older commits were cleaned up. ``timestamp`` is the commit's
    time as time travel dates it (:func:`version_at`), as Delta's history reports it: the
    file's modification time made increasing, or with in-commit timestamps on
    ``inCommitTimestamp`` from the enablement version on. (``commitInfo.timestamp``, the
    writer's clock, stays in the commit file.)"""
    where = ict.enablement(current.metadata.configuration)
    by_file: dict[int, int] | None = None  # listed once, when a version is dated by file
    out: list[dict[str, Any]] = []
    version = current.version
    while version >= 0 and (limit is None or len(out) < limit):
        commit = commitlog.read_commit(version, required=False)
        if commit is None:
            break  # older commits were cleaned up
        info = commit.commit_info
        entry: dict[str, Any] = {"version": version}
        if info is not None:
            entry.update(info.to_json())
        if where is not None and version >= where.version:
            dated = ict.in_commit_timestamp(info)
        else:
            if by_file is None:
                by_file = _monotonic(commitlog.log.commit_mtimes_ms(), range(current.version + 1))
            dated = by_file.get(version)
        if dated is not None:
            entry["timestamp"] = dated
        out.append(entry)
        version -= 1
    return out
